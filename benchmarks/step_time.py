"""Where a step of an off-policy `_cpu` script (SAC, TD3) goes: the env, acting, storing, sampling,
each compiled graph of the update (its matmuls, the optimizer's kernels, its other kernels, the
rest of its call) and dynamo's guards before it, the logging, the checkpoint's check and the loop,
from torch's profiler over the script's own learning phase.

    python -m benchmarks.step_time leanrl/sac_continuous_action_cpu.py --threads 1
    python -m benchmarks.step_time leanrl/td3_continuous_action_cpu.py --threads 2 --bf16 \
        --learning-starts 5000 --total-timesteps 7000

The script runs its own `main` on its flags (default here: HalfCheetah-v4, 5,000 random steps,
then 1,000 learning steps) twice in this process: once as it is, for its µs per env step, then
with each part of its loop labelled (`torch.profiler.record_function` around `envs.step`, the
policy, the buffer's `add` and `sample`, the compiled update, the run's logging and checkpoint)
and torch's profiler on from its sps clock's start to its end. Inductor names each generated
kernel (`cpp.enable_kernel_profile`): the optimizer's are those that compute Adam's step, the ones
with its square root (inductor fuses the targets' update into them). The loop is what the labelled
parts leave of the profiled step: the loop's own Python, the progress bar and the profiler's cost.

Prints the table; writes `step_time-<script>-<time>.{json,md}` to `--out-dir`.
"""

import argparse
import functools
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import torch
import tyro
from torch.profiler import profile, record_function

from benchmarks import cli
from benchmarks.machine import machine_info
from benchmarks.report import machine_line, table, write_result
from benchmarks.scripts import load_script, run_learning_phase

DEFAULT_FLAGS = ("--env-id", "HalfCheetah-v4", "--learning-starts", "5000")
DEFAULT_FLAGS += ("--total-timesteps", "6000", "--no-tensorboard")
# the loop's parts, by label, in the order a step runs them
PARTS = ("env step", "act", "store", "sample", "update", "log", "checkpoint")
GRAPH = "Torch-Compiled Region: "  # a compiled graph's call, by the profiler
GUARDS = "TorchDynamo Cache Lookup"  # dynamo's guard checks before a compiled call


def labelled(label, function):
    """`function`, its calls under the profiler's label `label`."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        with record_function(label):
            return function(*args, **kwargs)

    return call


def label_parts(module):
    """Label the parts of `module`'s loop (its envs' step, its learner's policy, its buffer's add
    and sample, its Run's logging and checkpoint); its compiled update is labelled by
    `label_update` as main compiles it."""
    make_envs, make_learner = module.make_envs, module.make_learner

    def labelled_envs(*args, **kwargs):
        envs = make_envs(*args, **kwargs)
        envs.step = labelled("env step", envs.step)
        return envs

    def labelled_learner(*args, **kwargs):
        learner = make_learner(*args, **kwargs)
        learner.policy = labelled("act", learner.policy)
        return learner

    module.make_envs, module.make_learner = labelled_envs, labelled_learner
    buffer = module.ReplayBuffer
    buffer.add, buffer.sample = labelled("store", buffer.add), labelled("sample", buffer.sample)
    run = module.Run
    run.log_episodes, run.log_progress = (
        labelled("log", f) for f in (run.log_episodes, run.log_progress)
    )
    run.checkpoint = labelled("checkpoint", run.checkpoint)


def label_update(compile):
    """torch.compile, whose compiled `update` runs under the label "update"."""

    @functools.wraps(compile)
    def labelled_compile(function, *args, **kwargs):
        compiled = compile(function, *args, **kwargs)
        return labelled("update", compiled) if function.__name__ == "update" else compiled

    return labelled_compile


def kind(name):
    """The part of an update that a profiler event named `name` is, or None for an event that
    is not a leaf of the update's time."""
    if GUARDS in name:
        return "dynamo's guards"
    if name.startswith(("aoti_torch_cpu_", "aten::")) and "mm" in name:
        return "matmuls"
    if "cpp_fused" in name:
        return "optimizer kernels" if "sqrt" in name else "other kernels"
    return None


def breakdown(events, steps):
    """µs per env step of each labelled part, each compiled graph, and the update's leaves, from
    the profiler's `events` (key averages) over `steps` env steps."""
    total = {event.key: event.cpu_time_total for event in events}
    parts = {part: total.get(part, 0.0) / steps for part in PARTS}
    graphs = {key: value / steps for key, value in sorted(total.items()) if key.startswith(GRAPH)}
    leaves = defaultdict(float)
    for event in events:
        if (name := kind(event.key)) is not None:
            leaves[name] += event.self_cpu_time_total / steps
    return parts, graphs, dict(leaves)


def measure(script, flags):
    """The µs per env step of `script`'s learning phase under `flags`, unprofiled and profiled,
    and the profiled run's breakdown."""
    module = load_script(script.stem, script.parent)
    plain = time_phase(module, tyro.cli(module.Args, args=flags))
    module = load_script(script.stem, script.parent)  # afresh, to label its parts
    label_parts(module)
    torch._inductor.config.cpp.enable_kernel_profile = True
    profiler, compile_ = profile(), torch.compile
    torch.compile = label_update(compile_)
    try:
        clock = Stopwatch()
        steps = run_learning_phase(module, tyro.cli(module.Args, args=flags), clock, profiler)
    finally:
        torch.compile = compile_
    parts, graphs, leaves = breakdown(profiler.key_averages(), steps)
    profiled = clock.seconds / steps * 1e6
    parts["loop"] = profiled - sum(parts.values())
    return dict(step_us=plain, profiled_step_us=profiled, parts=parts, graphs=graphs, leaves=leaves)


class Stopwatch:
    """A context manager that keeps the seconds spent inside it."""

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exception):
        self.seconds = time.perf_counter() - self.start


def time_phase(module, args):
    """µs per env step of `module`'s learning phase, unprofiled."""
    clock = Stopwatch()
    steps = run_learning_phase(module, args, clock)
    return clock.seconds / steps * 1e6


def markdown(result):
    """The breakdown as a markdown table, headed by the machine and the command."""
    step = result["profiled_step_us"]
    rows = [[part, f"{us:.0f}", f"{us / step:.0%}"] for part, us in result["parts"].items()]
    rows += [
        [f"update: {graph}", f"{us:.0f}", f"{us / step:.0%}"]
        for graph, us in result["graphs"].items()
    ]
    rows += [
        [f"update: {leaf}", f"{us:.0f}", f"{us / step:.0%}"]
        for leaf, us in result["leaves"].items()
    ]
    lines = [
        machine_line(result["machine"]),
        f"`{result['command']}`, started {result['started']}: {result['step_us']:.0f} µs per env "
        f"step unprofiled, {step:.0f} profiled (the shares are of the profiled step)",
        "",
        *table("part | µs per env step | share", rows, "lrr"),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    made, add = cli.parser("benchmarks.step_time", __doc__, "--out-dir")
    add(
        "script",
        type=Path,
        help="an off-policy _cpu script, e.g. leanrl/sac_continuous_action_cpu.py",
    )
    add("flags", nargs=argparse.REMAINDER, help="its flags, after the defaults (1,000 updates)")
    args = cli.parse(made, argv)
    started = datetime.now()
    flags = [*DEFAULT_FLAGS, *args.flags]
    result = measure(args.script, flags)
    result |= dict(machine=machine_info(), started=started.isoformat("T", "seconds"))
    result["command"] = " ".join([str(args.script), *flags])
    stem = f"step_time-{args.script.stem}-{started:%Y%m%d-%H%M%S}"
    return cli.conclude(markdown(result), write_result(result, args.out_dir, stem, markdown))


if __name__ == "__main__":
    sys.exit(main())
