"""The matmul limit of a `_cpu` script's updates: the env steps per second that their matmuls alone
allow on this CPU, in float32 and in bfloat16.

    python -m benchmarks.update_limit leanrl/sac_continuous_action_cpu.py \
        --env-id HalfCheetah-v4 --total-timesteps 1500 --learning-starts 1000 --measure-burnin 50
    python -m benchmarks.update_limit --threads 1,2 leanrl/td3_continuous_action_cpu.py

The script runs its own `main` on its flags, after a short budget of ours (`BUDGETS`: its own
default is hours uncompiled), uncompiled (`--no-compile`, the same functions the
compiled update runs), on one thread, and again with `--bf16` where the CPU computes bfloat16
natively. From its sps clock's start (after the random steps and the burn-in) to its end, torch's
`FlopCounterMode` counts the FLOPs of its updates, and a dispatch mode records each matmul: the
op, its operands' shapes, strides and dtypes. Each distinct matmul is then timed alone on tensors
of its own layout, at each thread count of `--threads` (the fastest of a few blocks of calls: a
bound, not an average), and the matmuls of one env step take their times summed, each weighted by
how often it ran per env step. The limit is one env step's matmul time, inverted; the rate is the
FLOPs over that time. Acting (numpy) and the env are left out: this bounds the update, as the
env-only limit (benchmarks.env_limit) bounds the env.

Prints one line, `UPDATE_LIMIT {json}`: `flops_per_step` (per dtype) and, per dtype and thread
count, `gflops` and `sps`.
"""

import argparse
import dataclasses
import json
import os
import time
from collections import Counter
from pathlib import Path

import torch
import tyro
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import cli
from benchmarks.scripts import load_script, run_learning_phase

MATMULS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.baddbmm.default,
}
BLOCK_SECONDS = 0.05  # each matmul is timed in blocks of calls at least this long
BLOCKS = 7  # and the fastest block kept: the limit is what the CPU can do, not what it did


def layout(value):
    """A matmul operand's (shape, strides, dtype), or a scalar argument as it is."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), tuple(value.stride()), str(value.dtype).removeprefix("torch.")
    return value


class MatmulRecorder(TorchDispatchMode):
    """Counts the matmuls that run under it, by op and operand layouts."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.calls[(func.__name__, tuple(layout(a) for a in args))] += 1
        return func(*args, **(kwargs or {}))


# a short learning phase, before the caller's flags: 500 steps after 1,000 random ones (SAC, TD3,
# DQN), or 20,480 steps (PPO, PQN); the sps clock starts after the script's burn-in
BUDGETS = {
    "off-policy": ("--learning-starts", "1000", "--total-timesteps", "1500"),
    "on-policy": ("--total-timesteps", "20480"),
}


def budget(module):
    """Our default budget flags for `module`'s script, by whether it has learning starts."""
    names = {field.name for field in dataclasses.fields(module.Args)}
    return BUDGETS["off-policy" if "learning_starts" in names else "on-policy"]


def record(script, flags):
    """Run `script` (a path) uncompiled on `flags`: its learning phase's FLOPs per env step and its
    matmuls' counts per env step, by op and layout."""
    module = load_script(script.stem, script.parent)
    uncompiled = ["--no-compile", "--threads", "1", "--no-tensorboard"]
    args = tyro.cli(module.Args, args=[*budget(module), *flags, *uncompiled])
    flops, matmuls = FlopCounterMode(display=False), MatmulRecorder()
    steps = run_learning_phase(module, args, flops, matmuls)
    return flops.get_total_flops() / steps, {k: n / steps for k, n in matmuls.calls.items()}


def operand(shape, strides, dtype):
    """A tensor of `shape` and `strides` (broadcast strides of 0 included), normal values."""
    extent = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))
    return torch.randn(extent, dtype=getattr(torch, dtype)).as_strided(shape, strides)


def seconds_per_call(op, operands, clock=time.perf_counter):
    """The time of a call of `op` on `operands`, in the fastest of BLOCKS blocks of BLOCK_SECONDS
    (another job on the machine slows a block, never speeds one)."""
    op(*operands)
    calls, start = 0, clock()
    while clock() - start < BLOCK_SECONDS:
        op(*operands)
        calls += 1
    blocks = []
    for _ in range(BLOCKS):
        start = clock()
        for _ in range(calls):
            op(*operands)
        blocks.append((clock() - start) / calls)
    return min(blocks)


def matmul_seconds(matmuls, threads):
    """The time of one env step's `matmuls` ({(op name, layouts): calls per env step}), each
    timed alone at `threads`."""
    torch.set_num_threads(threads)
    total = 0.0
    for (name, layouts), per_step in matmuls.items():
        op = getattr(torch.ops.aten, name.split(".")[0]).default
        operands = [operand(*x) if isinstance(x, tuple) else x for x in layouts]
        total += per_step * seconds_per_call(op, operands)
    return total


def measure(script, flags, threads, dtypes):
    """The update limit of `script` under `flags`: per dtype, FLOPs per env step, and per thread
    count the matmuls' rate and the sps they allow."""
    result = dict(script=script.stem, threads=threads, flops_per_step={}, limits={})
    for dtype in dtypes:
        extra = ["--bf16"] if dtype == "bfloat16" else []
        flops, matmuls = record(script, [*flags, *extra])
        result["flops_per_step"][dtype] = flops
        for count in threads:
            seconds = matmul_seconds(matmuls, count)
            limit = dict(gflops=flops / seconds / 1e9, sps=1 / seconds)
            result["limits"].setdefault(dtype, {})[str(count)] = limit
    return result


def bf16_native():
    """Whether this CPU computes bfloat16 natively (threads.py's test, as `--bf16` checks it)."""
    return load_script("threads").bf16_native()


def main(argv=None):
    """Measure the script named on the command line and print its `UPDATE_LIMIT` line."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.update_limit", description=__doc__.split("\n\n")[0]
    )
    add = parser.add_argument
    cores = len(os.sched_getaffinity(0))
    counts = "thread counts, comma-separated (default: 1 and every core)"
    add("--threads", type=cli.values_of(int), default=sorted({1, cores}), help=counts)
    add("script", type=Path, help="a _cpu script, e.g. leanrl/td3_continuous_action_cpu.py")
    add("flags", nargs=argparse.REMAINDER, help="the script's flags (env, budget, burn-in)")
    args = parser.parse_args(argv)
    if min(args.threads) < 1:
        parser.error(f"--threads must be positive, got {args.threads}")
    dtypes = ["float32", "bfloat16"] if bf16_native() else ["float32"]
    result = measure(args.script, args.flags, args.threads, dtypes)
    print("UPDATE_LIMIT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
