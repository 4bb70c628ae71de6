"""Benchmark the twins side by side: each algorithm's variants run in turn (A B C A B C ...),
`--repeats` times.

    python -m benchmarks.run --quick  # every algorithm, seeds 1 2: ~15 min on 2 CPU cores
    python -m benchmarks.run --algos sac --repeats 3 --quick     # one algorithm, seeds 1 2 3
    python -m benchmarks.run --repeats 5  # every registered algorithm, full budget

Each run is `python leanrl/<script>.py <budget flags> --seed <seed> <variant flags>` in a fresh
interpreter; the harness reads only its `SUMMARY {...}` line. Round r (every variant once) runs with
seed `seeds[r % len(seeds)]`, so the variants compare on the same seeds. Before its runs, each
algorithm's environment alone is timed with random actions (`benchmarks.env_limit`, its `ENV_ONLY`
line): the limit its scripts could reach. After them, each `_cpu` script's updates are bounded by
their matmuls' FLOPs over this CPU's rate at their shapes (`benchmarks.update_limit`, its
`UPDATE_LIMIT` line): the limit its updates could reach. The table goes to stdout and, with every
run's summary and the machine, to `benchmarks/results/<timestamp>.{md,json}`, next to PNG plots of
sps and of the return curves. Variants that need CUDA run only where there is a CUDA device. A
failed run stops the benchmark with exit status 1.
"""

import argparse
import json
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import torch

from benchmarks import plots, report
from benchmarks.machine import machine_info
from benchmarks.processes import note
from benchmarks.registry import ALGOS, CPU_SUFFIX, VARIANTS

ROOT = Path(__file__).resolve().parents[1]
STDERR_TAIL_LINES = 20


class BenchmarkError(RuntimeError):
    """A run that failed: one line naming the script, flags and cause; stderr's tail."""


def missing_scripts(algo, scripts_dir):
    """The paths of `algo`'s scripts that are not in `scripts_dir`."""
    stems = {algo.script(variant) for variant in VARIANTS if algo.runs(variant)}
    paths = [scripts_dir / f"{stem}.py" for stem in sorted(stems)]
    return [path for path in paths if not path.exists()]


def runnable(algos, scripts_dir):
    """The algorithms whose scripts all exist; a note names what each other one misses."""
    ready = []
    for algo in algos:
        missing = missing_scripts(algo, scripts_dir)
        if missing:
            note(f"skipping {algo.name}: missing {', '.join(str(path) for path in missing)}")
        else:
            ready.append(algo)
    return ready


def round_seeds(repeats, seeds):
    """The seed of each of `repeats` rounds: round r gets `seeds[r % len(seeds)]`."""
    return [seeds[repeat % len(seeds)] for repeat in range(repeats)]


def plan(algos, seeds, cuda, variants=VARIANTS):
    """The runs in execution order as (algo, variant, repeat, seed)."""
    usable = [variant for variant in variants if cuda or not variant.needs_cuda]
    return [
        (algo, variant, repeat, seed)
        for algo in algos
        for repeat, seed in enumerate(seeds)
        for variant in usable
        if algo.runs(variant)
    ]


def budget_flags(algo, quick, seed):
    """The flags every run of `algo` shares under a budget: the budget's, then the seed."""
    return [*(algo.quick if quick else algo.full), "--seed", str(seed)]


def command(algo, variant, scripts_dir, quick, seed):
    """One run's command: the variant's script, the budget's flags, seed, variant's flags."""
    stem = algo.script(variant)
    flags = [*budget_flags(algo, quick, seed), *variant.flags]
    return [
        sys.executable,
        str(scripts_dir / f"{stem}.py"),
        *flags,
        *algo.variant_flags.get(variant.name, ()),
    ]


def env_limit_command(algo, scripts_dir, quick, seed, seconds):
    """The command that times `algo`'s environment alone under the budget."""
    limit = [sys.executable, "-m", "benchmarks.env_limit", "--seconds", str(seconds)]
    return [*limit, str(scripts_dir / f"{algo.eager}.py"), *budget_flags(algo, quick, seed)]


def update_limit_command(algo, scripts_dir, quick, seed):
    """The command that measures the matmul limit of `algo`'s `_cpu` script under the budget."""
    limit = [sys.executable, "-m", "benchmarks.update_limit"]
    script = scripts_dir / f"{algo.eager}{CPU_SUFFIX}.py"
    return [*limit, str(script), *budget_flags(algo, quick, seed)]


def failure(cmd, reason, stderr=""):
    """A BenchmarkError: the command (scripts by file name) and `reason`, then stderr's tail."""
    words = [Path(word).name if word.endswith(".py") else word for word in cmd[1:]]
    tail = stderr.strip().splitlines()[-STDERR_TAIL_LINES:]
    return BenchmarkError("\n".join([f"{shlex.join(words)} {reason}", *tail]))


def result_line(cmd, proc, prefix):
    """The JSON object of the one `<prefix> ` line of a finished process `proc`."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith(f"{prefix} ")]
    if len(lines) != 1:
        printed = f"printed {len(lines)} {prefix} lines, expected 1"
        raise failure(cmd, f"exited with status 0 but {printed}", proc.stderr)
    try:
        result = json.loads(lines[0][len(prefix) + 1 :])
    except json.JSONDecodeError as error:
        why = f"printed a {prefix} line that is not JSON ({error})"
        raise failure(cmd, why, proc.stderr) from None
    if not isinstance(result, dict):
        raise failure(cmd, f"printed a {prefix} line that is not a JSON object")
    return result


def parse_summary(cmd, proc):
    """The whole summary of a finished run `proc`: its one SUMMARY line names the run's
    `summary.json`, which holds the same keys plus the learning curve; a BenchmarkError unless
    there is exactly one such line, its file exists, and the summary has a numeric sps and a
    `curve` list."""
    line = result_line(cmd, proc, "SUMMARY")
    try:
        summary = json.loads(Path(line["summary_file"]).read_text())
    except (KeyError, OSError, json.JSONDecodeError) as error:
        raise failure(
            cmd, f"printed a SUMMARY whose summary_file cannot be read ({error!r})", proc.stderr
        ) from None
    if not isinstance(summary.get("sps"), (int, float)):
        raise failure(
            cmd, "printed a SUMMARY without a numeric sps (does the run end inside the burn-in?)"
        )
    if not isinstance(summary.get("curve"), list):
        raise failure(
            cmd, "wrote a summary.json without a curve list (CONTRIBUTING.md: What a run prints)"
        )
    return summary


def execute(cmd, timeout):
    """Run `cmd` in a fresh interpreter from the repository root."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise failure(cmd, f"ran past the {timeout} s timeout") from None
    if proc.returncode != 0:
        raise failure(cmd, f"exited with status {proc.returncode}", proc.stderr)
    return proc


def run_one(cmd, timeout):
    """Run `cmd` and return its SUMMARY object; a BenchmarkError if it fails."""
    return parse_summary(cmd, execute(cmd, timeout))


def env_limits(algos, scripts_dir, quick, seed, seconds, timeout=None):
    """Each algorithm's env-only throughput (`benchmarks.env_limit`'s ENV_ONLY), by name."""
    limits = {}
    for algo in algos:
        cmd = env_limit_command(algo, scripts_dir, quick, seed, seconds)
        limits[algo.name] = result_line(cmd, execute(cmd, timeout), "ENV_ONLY")
        note(f"{algo.name} env only: {limits[algo.name]['sps']:.0f} sps")
    return limits


def update_limits(algos, scripts_dir, quick, seed, timeout=None):
    """The matmul limit of each `_cpu` script's updates (`benchmarks.update_limit`'s
    UPDATE_LIMIT), by algorithm name."""
    limits = {}
    for algo in (algo for algo in algos if algo.cpu):
        cmd = update_limit_command(algo, scripts_dir, quick, seed)
        limits[algo.name] = result_line(cmd, execute(cmd, timeout), "UPDATE_LIMIT")
        by_threads = limits[algo.name]["limits"]["float32"].items()
        sps = ", ".join(f"{limit['sps']:.0f} sps at {n} thread(s)" for n, limit in by_threads)
        note(f"{algo.name} update limit: {sps}")
    return limits


def benchmark(algos, scripts_dir, seeds, quick, cuda, timeout=None):
    """Run the plan for `algos` with scripts from `scripts_dir`, one round per seed in `seeds`."""
    order = plan(algos, seeds, cuda)
    runs = []
    for index, (algo, variant, repeat, seed) in enumerate(order, 1):
        cmd = command(algo, variant, scripts_dir, quick, seed)
        summary = run_one(cmd, timeout)
        where = f"[{index}/{len(order)}] {algo.name} {variant.name} seed {seed}"
        note(f"{where}: {summary['sps']:.0f} sps")
        run = dict(algo=algo.name, variant=variant.name, repeat=repeat, seed=seed, flags=cmd[2:])
        runs.append(run | {"summary": summary})
    return runs


def parse_args(argv):
    """The harness's command line."""
    names = [algo.name for algo in ALGOS]
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add("--algos", nargs="+", choices=names, default=names, help="algorithms to run (default: all)")
    add("--repeats", type=int, default=2, help="runs of each variant (rounds of every variant)")
    cycled = "seeds, cycled over the rounds: round r runs with seeds[r %% len(seeds)]"
    add("--seeds", type=int, nargs="+", default=[1, 2, 3], help=cycled)
    add("--env-seconds", type=float, default=2.0, help="how long to time each env alone")
    add("--quick", action="store_true", help="the small budget of each algorithm (default: full)")
    add("--timeout", type=float, default=3600, help="seconds one run may take")
    add("--scripts-dir", type=Path, default=ROOT / "leanrl", help="where the scripts are")
    add("--out-dir", type=Path, default=ROOT / "benchmarks" / "results", help="where results go")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def main(argv=None):
    """Run the benchmark, print the table, write the results; returns the exit status."""
    args = parse_args(argv)
    algos = runnable([algo for algo in ALGOS if algo.name in args.algos], args.scripts_dir)
    if not algos:
        note("benchmark stopped: no algorithm has all its scripts on disk")
        return 1
    started = datetime.now()
    seeds = round_seeds(args.repeats, args.seeds)
    try:
        where, cuda = (algos, args.scripts_dir), torch.cuda.is_available()
        limits = env_limits(*where, args.quick, seeds[0], args.env_seconds, args.timeout)
        runs = benchmark(*where, seeds, args.quick, cuda, args.timeout)
        matmul_limits = update_limits(*where, args.quick, seeds[0], args.timeout)
    except BenchmarkError as error:
        note(f"benchmark stopped: {error}")
        return 1
    machine = machine_info()
    settings = dict(budget="quick" if args.quick else "full", repeats=args.repeats, seeds=seeds)
    settings["started"] = started.isoformat()
    table = report.rows(runs, limits, matmul_limits)
    table_md = report.markdown(table, machine, settings)
    document = dict(settings=settings, machine=machine, env_limits=limits, table=table, runs=runs)
    document["update_limits"] = matmul_limits
    stamp = started.strftime("%Y%m%d-%H%M%S")
    paths = [
        *report.write(args.out_dir, stamp, document, table_md),
        *plots.write(args.out_dir, stamp, table, runs),
    ]
    print(table_md, end="")
    note("wrote " + ", ".join(str(path) for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
