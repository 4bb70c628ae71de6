"""The torchrun script: one run in `world_size` processes (ranks). Rank 0 alone keeps the folder,
wandb and the messages; the checkpoint holds every rank's generators and envs."""

import signal
import sys
from types import SimpleNamespace

import torch
from runs import Run, fail


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


class RankRun(Run):
    """The run of one rank. `checkpoint` is called by every rank after each iteration, with the
    signal the ranks agreed on; the learner, the same on every rank, is rank 0's."""

    def __init__(self, args, script, rank, world_size, free_flags=()):
        self.rank, self.world_size, self.main_process = rank, world_size, rank == 0
        self.signal = 0  # this rank's own first Ctrl-C or SIGTERM
        super().__init__(args, script, free_flags)

    def on_signal(self, signum, frame):
        """Only `signal`: `stop_signal`, which stops the loop, is the one the ranks agreed on, which
        the script sets on every rank alike after each iteration (an all-reduce of `signal`), so
        that a rank that gets its signal after that waits for the next iteration as the others."""
        self.signal = signum
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second signal stops at once
            signal.signal(signum, signal.SIG_DFL)

    def end(self, summary, status):
        self.stop_signal = self.stop_signal or self.signal  # a signal after the last iteration
        super().end(summary, status)

    def check_seed(self, args):  # the seed given: rank r's is seed + r * num_envs
        super().check_seed(SimpleNamespace(seed=args.seed - self.rank * args.num_envs))

    def check_resumed(self, path, saved):
        if len(saved["ranks"]) != self.world_size:
            fail(
                f"--resume {path} was trained by {len(saved['ranks'])} ranks, not {self.world_size}"
            )

    def trained_flags(self):
        """Rank 0's flags, the ones the checkpoint keeps (each rank's seed is its own)."""
        return vars(self.args) | dict(seed=self.args.seed - self.rank * self.args.num_envs)

    def own_state(self, saved):
        return dict(envs=saved["ranks"][self.rank][1])

    def own_generators(self, saved):
        return saved["ranks"][self.rank][0]

    def due(self):
        due = [super().due()]
        if self.world_size > 1:  # each rank has its own clock: rank 0's decides
            collective(torch.distributed.broadcast_object_list, due, src=0)
        return due[0]

    def gather(self, generators, state):
        own = (generators, state.pop("envs"))
        ranks = [own]
        if self.world_size > 1:  # every rank's, on rank 0
            ranks = [None] * self.world_size if self.rank == 0 else None
            collective(torch.distributed.gather_object, own, object_gather_list=ranks, dst=0)
        return dict(ranks=ranks)
