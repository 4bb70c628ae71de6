"""The torchrun script: one run in `world_size` processes (ranks). Rank 0 alone keeps the folder,
wandb and the messages; the checkpoint holds every rank's generators and envs."""

import sys
from dataclasses import replace

import torch
from checkpoints import OneProcess
from runs import Run
from signals import Signals


def collective(function, tensor, **kwargs):
    """`function(tensor, **kwargs)`, a collective in place. Under gloo, a lost or late rank ends
    this one with exit status 1 and one line (nccl's watchdog aborts the process instead)."""
    try:
        function(tensor, **kwargs)
    except RuntimeError as e:
        # without gloo's "[source file:line] " prefix
        cause = str(e).strip().splitlines()[0].split("] ")[-1]
        what = f"rank {torch.distributed.get_rank()}: {function.__name__} failed"
        sys.exit(f"error: {what}, another rank died or hung past --dist-timeout ({cause})")


class Ranks(OneProcess):
    """torchrun's ranks, as the processes of a run: its checkpoint holds every rank's generators
    and envs, gathered on rank 0, which writes it with its own flags; rank 0's clock says when one
    is due. Every rank checkpoints after each iteration."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def first_flags(self, args):  # each rank's seed is its own: rank r's is seed + r * num_envs
        return replace(args, seed=args.seed - self.rank * args.num_envs)

    def gather(self, own):
        ranks = [own]
        if self.world_size > 1:  # every rank's, on rank 0
            ranks = [None] * self.world_size if self.rank == 0 else None
            collective(torch.distributed.gather_object, own, object_gather_list=ranks, dst=0)
        return ranks

    def due(self, due):
        due = [due]
        if self.world_size > 1:  # each rank has its own clock: rank 0's decides
            collective(torch.distributed.broadcast_object_list, due, src=0)
        return due[0]


class RankSignals(Signals):
    """A signal stops torchrun's ranks after the same iteration: each rank's first one is in
    `received`, and the script sets `agreed`, the one they stop on, alike on every rank after each
    iteration (an all-reduce), so that a rank whose signal comes after that waits for the next
    iteration as the others."""

    agreed = 0

    @property
    def stop(self):
        return self.agreed


class RankRun(Run):
    """The run of one rank, `rank` of `world_size`: its checkpoint holds every rank's part
    (`Ranks`), and its signals stop the ranks alike (`RankSignals`). Rank 0 alone keeps the folder,
    wandb and the messages."""

    def __init__(self, args, script, rank, world_size, free_flags=()):
        super().__init__(args, script, free_flags, processes=Ranks(rank, world_size))
        self.signals = RankSignals()
