"""Where a step's time goes, for every algorithm: the script's own `main()` runs with timers around
its parts.

    # every algorithm: eager, twin, twin --compile, CPU script
    python -m benchmarks.studies.breakdown
    # some algorithms, 3 alternating rounds
    python -m benchmarks.studies.breakdown sac dqn --rounds 3
    # also the seeds script with 8 members (dqn_seeds.py)
    python -m benchmarks.studies.breakdown dqn --seeds 8

Nothing is rebuilt here: each variant runs the script's `main()` (in a fresh interpreter, at the
quick benchmark budget of `benchmarks/registry.py`), with timers wrapped around the functions
its `make_learner` returns (acting, the updates), the vector env's `step`, the replay buffer's
`add` and `sample`, and `gae`. A function that `main` compiles is timed around the compiled
function. The window measured starts once every part has made its first 3 calls (compiling,
optimizers creating their state) and ends at the last env step; a part's time per environment
step is its median call times its calls in the window, over the window's steps, and `other` is
the rest of the window's time per step: the Python loop, conversions between numpy and torch,
episode bookkeeping. The variants alternate round by round; each part's median over the rounds
is reported. CPU only: CUDA work is asynchronous, and its calls would need synchronizing. With
`--seeds N`, an algorithm that has a seeds script (`<eager>_seeds.py`) also runs it with N
members at the same budget per member; its parts are per member-step (all members' env steps
count), so its column reads beside the single-seed scripts' as the cost of one member's step.
"""

import argparse
import contextlib
import functools
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import tyro

from benchmarks.machine import machine_info
from benchmarks.registry import ALGOS
from benchmarks.registry import VARIANTS as ALL_VARIANTS
from benchmarks.scripts import SCRIPTS, load_script

# what each algorithm's `make_learner` returns last, where it returns a tuple: its step functions
FUNCTIONS = {
    "sac": ("acting", "critic update", "actor update", "target update", "update"),
    "td3": ("acting", "critic update", "actor update", "target update", "update"),
    "dqn": ("acting", "update", "target update"),
    "ppo_continuous_action": ("acting", "value", "update"),
    "ppo_atari_envpool": ("acting", "value", "update"),
}
# the same, where `make_learner` returns a namespace: its step fields and their parts
STEPS = {
    "policy": "acting",
    "update_critic": "critic update",
    "update_actor": "actor update",
    "update_targets": "target update",
    "update": "update",
    "update_target": "target update",
    "get_value": "value",
}
BY_NAME = {algo.name: algo for algo in ALGOS}
# calls of each part left out of the window: compiling, the optimizers creating their state
WARMUP_CALLS = 3
# the harness's variants that run on a CPU: eager, twin, twin --compile and, where there is one, the
# CPU script
VARIANTS = {variant.name: variant for variant in ALL_VARIANTS if not variant.needs_cuda}


class Timers:
    """Each part's calls as (env steps done when the call began, seconds), in call order, and the
    clock after each env step as (env steps done, time)."""

    def __init__(self):
        self.calls, self.steps, self.clock = {}, 0, []

    def wrap(self, part, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.calls.setdefault(part, []).append((self.steps, time.perf_counter() - start))
            return out

        timed.part = part
        return timed


@contextlib.contextmanager
def instrumented(module, algo, timers):
    """`module`'s parts wrapped with `timers` while the context lasts: its make_learner, make_envs,
    replay buffer and gae, and torch.compile (so that a compiled part is timed around its compiled
    function)."""
    make_learner, make_envs, compile_ = module.make_learner, module.make_envs, torch.compile
    make_host_policy = getattr(module, "make_host_policy", None)

    def timed_make_learner(*args, **kwargs):
        learner = make_learner(*args, **kwargs)
        if isinstance(learner, SimpleNamespace):  # its steps by name
            for name, part in STEPS.items():
                fn = getattr(learner, name, None)
                if fn is not None and not hasattr(fn, "part"):
                    setattr(learner, name, timers.wrap(part, fn))
            return learner
        *head, functions = learner
        # a host policy made inside make_learner is timed already
        parts = zip(FUNCTIONS[algo], functions)
        return (
            *head,
            tuple(fn if hasattr(fn, "part") else timers.wrap(part, fn) for part, fn in parts),
        )

    # acting in numpy, where `main` or make_learner makes it
    def timed_host_policy(*args, **kwargs):
        policy = make_host_policy(*args, **kwargs)
        return timers.wrap("acting", policy) if callable(policy) else policy

    def timed_make_envs(*args, **kwargs):
        envs = make_envs(*args, **kwargs)
        step = envs.step

        def counted_step(actions):
            out = step(actions)
            timers.steps += len(out[1])
            timers.clock.append((timers.steps, time.perf_counter()))
            return out

        envs.step = timers.wrap("env step", counted_step)
        return envs

    def timed_compile(fn, **kwargs):
        if hasattr(fn, "part"):
            return timers.wrap(fn.part, compile_(fn.__wrapped__, **kwargs))
        return compile_(fn, **kwargs)

    patches = [
        (module, "make_learner", timed_make_learner),
        (module, "make_envs", timed_make_envs),
        (torch, "compile", timed_compile),
    ]
    if make_host_policy is not None:
        patches.append((module, "make_host_policy", timed_host_policy))
    if hasattr(module, "ReplayBuffer"):
        # DQN writes once per update
        store = "extend" if hasattr(module.ReplayBuffer, "extend") else "add"
        patches.append(
            (
                module.ReplayBuffer,
                store,
                timers.wrap("storing", getattr(module.ReplayBuffer, store)),
            )
        )
        patches.append(
            (module.ReplayBuffer, "sample", timers.wrap("sampling", module.ReplayBuffer.sample))
        )
    if hasattr(module, "gae"):
        patches.append((module, "gae", timers.wrap("gae", module.gae)))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def measure_one(script, algo, flags):
    """Run `script`'s main() with `flags` (its command-line flags) and timers; returns the sps and
    each part's µs per env step over the measured window (`window`)."""
    module = load_script(script)
    timers = Timers()
    args = tyro.cli(module.Args, args=list(flags))
    with (
        tempfile.TemporaryDirectory() as cwd,
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        with instrumented(module, algo, timers):
            module.main(args)
    return window(timers)


def window(timers, warmup_calls=WARMUP_CALLS):
    """The measured window: from the env step by which every part has made its first `warmup_calls`
    calls (they compile, and the optimizers create their state) to the last env step. Returns the
    window's sps and each part's µs per env step: its median call times its calls in the window,
    over the window's steps; `other` is the rest of the window's time per step."""
    start = max(calls[min(warmup_calls, len(calls) - 1)][0] for calls in timers.calls.values())
    (start_step, start_time), (end_step, end_time) = (
        next(c for c in timers.clock if c[0] >= start),
        timers.clock[-1],
    )
    steps = max(end_step - start_step, 1)
    parts = {}
    for part, calls in timers.calls.items():
        measured = [seconds for at, seconds in calls if start_step <= at < end_step]
        if measured:
            parts[part] = statistics.median(measured) * len(measured) / steps * 1e6
    step_us = (end_time - start_time) / steps * 1e6
    parts["other"] = max(step_us - sum(parts.values()), 0.0)
    return 1e6 / step_us, parts


def seeds_variant(members):
    return f"seeds {members}"


def variant_command(algo, variant):
    """The script and flags of `variant` ("seeds N": the seeds script with N members)."""
    if variant.startswith("seeds "):
        return f"{BY_NAME[algo].eager}_seeds", ("--num-seeds", variant.split()[1])
    return BY_NAME[algo].script(VARIANTS[variant]), VARIANTS[variant].flags


def run_variant(algo, variant, budget_flags, timeout=1800):
    """One variant in a fresh interpreter (the scripts set thread counts for the whole process)."""
    script, flags = variant_command(algo, variant)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.studies.breakdown",
        "--one",
        script,
        algo,
        *budget_flags,
        *flags,
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],
    )
    if proc.returncode != 0:
        sys.exit(
            f"error: {' '.join(cmd[2:])} exited with status "
            f"{proc.returncode}\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.splitlines()[-1])


def table(algo, results):
    """Markdown: µs per env step of each part per variant, with its share, and each variant's
    sps."""
    variants = list(results)
    parts = [
        part
        for part in (*("env step",), *FUNCTIONS[algo], "storing", "sampling", "gae", "other")
        if any(part in results[v]["parts"] for v in variants)
    ]
    lines = [
        f"| {algo}: part | " + " | ".join(f"{v} µs/step (share)" for v in variants) + " |",
        "|---" * (1 + len(variants)) + "|",
    ]
    for part in parts:
        cells = []
        for v in variants:
            us, total = results[v]["parts"].get(part), sum(results[v]["parts"].values())
            cells.append("-" if us is None else f"{us:.0f} ({us / total:.0%})")
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines.append("| sps | " + " | ".join(f"{results[v]['sps']:.0f}" for v in variants) + " |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # one variant, run by `run_variant` in a fresh interpreter: --one SCRIPT ALGO FLAGS...
    if argv[:1] == ["--one"]:
        sps, parts = measure_one(argv[1], argv[2], argv[3:])
        print(json.dumps({"sps": sps, "parts": parts}))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.breakdown", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "algos",
        nargs="*",
        default=list(FUNCTIONS),
        choices=list(FUNCTIONS),
        metavar="ALGO",
        help=f"the algorithms (default: all of {', '.join(FUNCTIONS)})",
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of every variant")
    parser.add_argument(
        "--seeds",
        type=int,
        metavar="N",
        help="also the seeds script, where there is one, N members",
    )
    opts = parser.parse_args(argv)
    if opts.rounds < 1 or (opts.seeds is not None and opts.seeds < 1):
        parser.error("--rounds and --seeds must be at least 1")
    info = machine_info()
    print(
        f"{info['cpu']} ({info['cores']} cores), torch {info['versions']['torch']}; quick "
        f"budgets, {opts.rounds} rounds"
    )
    for algo in opts.algos:
        rounds = {name: [] for name, variant in VARIANTS.items() if BY_NAME[algo].runs(variant)}
        if opts.seeds and (SCRIPTS / f"{BY_NAME[algo].eager}_seeds.py").exists():
            rounds[seeds_variant(opts.seeds)] = []
        for _ in range(opts.rounds):
            for variant in rounds:
                rounds[variant].append(run_variant(algo, variant, BY_NAME[algo].quick))
        results = {variant: median_result(runs) for variant, runs in rounds.items()}
        print(table(algo, results), flush=True)
    return 0


def median_result(runs):
    """Each part's and the sps's median over rounds."""
    parts = {part for run in runs for part in run["parts"]}
    return {
        "sps": statistics.median(run["sps"] for run in runs),
        "parts": {
            part: statistics.median(run["parts"].get(part, 0.0) for run in runs) for part in parts
        },
    }


if __name__ == "__main__":
    sys.exit(main())
