"""Checkpoints and resume. A checkpoint, runs/<run_name>/checkpoint.pt, is a `Checkpoint`: what the
script names (`training_state()`: the learner, the buffer, the envs), the run's counters and
learning curves, and per process its generators and envs. `--resume` checks it against the flags
and copies it back in place, before the first update, so that compiled functions and CUDA graphs
see the restored tensors."""

import os
import random
import sys
from dataclasses import dataclass

import numpy as np
import torch
from flags import fail


@dataclass
class Checkpoint:
    """Every key of checkpoint.pt, which `Run.checkpoint` writes and `read_checkpoint` reads back.
    On disk it is a dict of these fields: a script and its exported copy read each other's."""

    # the layout of these fields; a file of another is refused (the first, 1, had no number)
    FORMAT = 2

    script: str
    """the script that wrote it"""
    args: dict
    """its flags (the first process's), which a resumed run's must match but the free ones"""
    iteration: int
    """the iteration to resume from"""
    step: int
    """the env steps so far"""
    final: bool
    """written after the last iteration"""
    wall_s: float
    """the seconds trained so far, over every resume"""
    resumes: list
    """the resumes before this one: {step, fresh_episodes} each"""
    wandb_id: str | None
    """wandb's run, which a resumed run logs to (None without --track)"""
    state: dict
    """`training_state()` but its envs: `state_of`'s copy, on the CPU"""
    ranks: list
    """per process: (its generators, `generators()`; its envs, `state_of((envs, obs, ...))`)"""
    curves: list
    """per series (a seeds run's members): [step, seconds, return] of every episode"""
    returns: list
    """per series: the last 20 episodic returns"""
    diverged: list
    """per series: its divergence, or None"""
    version: int = FORMAT
    """the layout of these fields"""


class OneProcess:
    """The processes of a run whose checkpoint holds each one's generators and envs: this one
    alone (ranks.py's `Ranks`: torchrun's)."""

    rank, world_size = 0, 1

    def first_flags(self, args):
        """The flags as the checkpoint keeps them: the first process's."""
        return args

    def gather(self, own):
        """Every process's `own` part of the checkpoint, in the process that writes it."""
        return [own]

    def due(self, due):
        """Whether a checkpoint is due, which every process must agree on."""
        return due


def read_checkpoint(args, script, folder, free_flags, processes):
    """The checkpoint that --resume names (a file or a run folder; `auto`: the run `folder`'s, if
    any), checked against the flags but `free_flags`, and the folder the run lives in: the
    checkpoint's. Without one: None and `folder`."""
    own = os.path.join(folder, "checkpoint.pt")
    if args.resume is None and args.run_name and os.path.exists(own):
        fail(f"{own} exists: --resume auto continues that run, or choose another --run-name")
    if args.resume == "auto" and not args.run_name:
        fail("--resume auto needs --run-name, the folder under runs/ to continue")
    if args.resume is None or (args.resume == "auto" and not os.path.exists(own)):
        return None, folder
    path = own if args.resume == "auto" else args.resume
    path = os.path.join(path, "checkpoint.pt") if os.path.isdir(path) else path
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False)
        version = saved.get("version", 1)
        checkpoint = Checkpoint(**saved) if version == Checkpoint.FORMAT else None
    except Exception as e:
        fail(f"--resume {path} is not a checkpoint of these scripts ({e!r})")
    if checkpoint is None:
        read = Checkpoint.FORMAT
        fail(f"--resume {path} is a checkpoint of format {version}, these scripts read {read}")
    if checkpoint.script != script:
        fail(f"--resume {path} was written by {checkpoint.script}, not {script}")
    if len(checkpoint.ranks) != processes.world_size:
        ranks = len(checkpoint.ranks)
        fail(f"--resume {path} was trained by {ranks} ranks, not {processes.world_size}")
    trained = checkpoint.args
    for flag, value in vars(processes.first_flags(args)).items():
        if flag not in free_flags and trained.get(flag) != value:
            fail(f"--resume {path} trained with --{flag.replace('_', '-')} {trained.get(flag)}")
    if checkpoint.final and args.total_timesteps <= trained["total_timesteps"]:
        print(f"{path}: the run finished at step {checkpoint.step}; nothing to resume")
        sys.exit(0)
    return checkpoint, os.path.dirname(os.path.abspath(path))


def seed_generators(seed, deterministic):
    """Python's, numpy's and torch's generators seeded with `seed`; cuDNN deterministic or not."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = deterministic


def generators():
    """The global generators' states: Python's, numpy's, torch's and every GPU's."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def set_generators(states):
    python, numpy, cpu, cuda = states
    random.setstate(python)
    np.random.set_state(numpy)
    torch.set_rng_state(cpu)
    if len(cuda) == torch.cuda.device_count() > 0:  # on as many GPUs
        torch.cuda.set_rng_state_all(cuda)


def state_of(obj):
    """What `restore` puts back: state dicts, numpy generators' states, tensors and arrays copied
    to the CPU; of (envs, obs, ...) the envs' `state_dict()` where it holds their episodes as they
    are (`whole_state`), else None."""
    if isinstance(obj, tuple):  # (envs, obs, what else the loop carries)
        envs = obj[0].state_dict() if getattr(obj[0], "whole_state", False) else None
        return (envs, *map(state_of, obj[1:]))
    if hasattr(obj, "state_dict"):
        return obj.state_dict()
    if isinstance(obj, np.random.Generator):
        return obj.bit_generator.state
    if isinstance(obj, dict):
        return {k: state_of(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return obj.copy()
    return obj.to("cpu", copy=True)


def restore(obj, saved, seed):
    """`saved` into `obj`, in place. Envs that were not saved start fresh episodes, seeded with
    `seed`, and what the loop carries beside their observations (dones, memory) is zeroed."""
    if isinstance(obj, tuple) and saved[0] is None:
        restore(obj[1], obj[0].reset(seed=seed)[0], seed)
        for carried in obj[2:]:
            carried.zero_()
    elif isinstance(obj, tuple):
        obj[0].load_state_dict(saved[0])
        for x, value in zip(obj[1:], saved[1:]):
            restore(x, value, seed)
    elif isinstance(obj, torch.optim.Optimizer):  # a tensor lr in place: a CUDA graph reads it
        rates = [group["lr"] for group in obj.param_groups]
        obj.load_state_dict(saved)
        for group, rate in zip(obj.param_groups, rates):
            if isinstance(rate, torch.Tensor):
                group["lr"] = rate.copy_(group["lr"])
    elif hasattr(obj, "load_state_dict"):
        obj.load_state_dict(saved)
    elif isinstance(obj, np.random.Generator):
        obj.bit_generator.state = saved
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if key in saved:
                restore(value, saved[key], seed)
    elif isinstance(obj, np.ndarray):
        obj[...] = saved
    else:
        with torch.no_grad():
            obj.copy_(torch.as_tensor(saved))
