"""Benchmark the twins side by side: each algorithm's variants run in turn (A B C A B C ...), `--repeats` times.

    python -m benchmarks.run --algos sac --repeats 3 --quick     # minutes on a CPU
    python -m benchmarks.run --repeats 5                         # every registered algorithm, full budget

Each run is `python leanrl/<script>.py <flags>` in a fresh interpreter; the harness reads only its
`SUMMARY {...}` line. The table goes to stdout and, with every run's summary and the machine, to
`benchmarks/results/<timestamp>.{md,json}`. Variants that need CUDA run only where there is a CUDA device.
A failed run stops the benchmark with exit status 1.
"""

import argparse
import json
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import torch

from benchmarks import report
from benchmarks.machine import machine_info
from benchmarks.registry import ALGOS, VARIANTS

ROOT = Path(__file__).resolve().parents[1]
STDERR_TAIL_LINES = 20


class BenchmarkError(RuntimeError):
    """A run that failed: one line naming the script, its flags and what went wrong, then its stderr's tail."""


def note(message):
    """Progress and notes go to stderr, so that stdout carries only the table."""
    print(message, file=sys.stderr, flush=True)


def missing_scripts(algo, scripts_dir):
    """The paths of `algo`'s two scripts that are not in `scripts_dir`."""
    paths = [scripts_dir / f"{stem}.py" for stem in (algo.eager, algo.twin)]
    return [path for path in paths if not path.exists()]


def runnable(algos, scripts_dir):
    """The algorithms whose scripts both exist; each skipped one gets a note naming what is missing."""
    ready = []
    for algo in algos:
        missing = missing_scripts(algo, scripts_dir)
        if missing:
            note(f"skipping {algo.name}: missing {', '.join(str(path) for path in missing)}")
        else:
            ready.append(algo)
    return ready


def plan(algos, repeats, cuda, variants=VARIANTS):
    """The runs in execution order as (algo, variant, repeat): per algorithm, every variant in turn, `repeats`
    times, so that drift on a noisy machine hits all variants alike. Variants needing CUDA only if `cuda`."""
    usable = [variant for variant in variants if cuda or not variant.needs_cuda]
    return [(algo, variant, repeat) for algo in algos for repeat in range(repeats) for variant in usable]


def command(algo, variant, scripts_dir, quick):
    """The command line of one run: the variant's script, the budget's flags, then the variant's own flags."""
    stem = algo.twin if variant.twin else algo.eager
    budget = algo.quick if quick else algo.full
    flags = [*budget, *variant.flags, *algo.variant_flags.get(variant.name, ())]
    return [sys.executable, str(scripts_dir / f"{stem}.py"), *flags]


def failure(cmd, reason, stderr=""):
    """A BenchmarkError whose first line names the script, its flags and `reason`, followed by `stderr`'s tail."""
    tail = stderr.strip().splitlines()[-STDERR_TAIL_LINES:]
    line = f"{shlex.join([Path(cmd[1]).name, *cmd[2:]])} {reason}"
    return BenchmarkError("\n".join([line, *tail]))


def parse_summary(cmd, proc):
    """The JSON object of the one `SUMMARY ` line of a finished run `proc`; a BenchmarkError if there is none,
    more than one, or one without a numeric sps."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")]
    if len(lines) != 1:
        raise failure(cmd, f"exited with status 0 but printed {len(lines)} SUMMARY lines, expected 1", proc.stderr)
    try:
        summary = json.loads(lines[0][len("SUMMARY ") :])
    except json.JSONDecodeError as error:
        raise failure(cmd, f"printed a SUMMARY line that is not JSON ({error})", proc.stderr) from None
    if not isinstance(summary, dict) or not isinstance(summary.get("sps"), (int, float)):
        raise failure(cmd, "printed a SUMMARY without a numeric sps (does the run end inside the burn-in?)")
    return summary


def run_one(cmd, timeout):
    """Run `cmd` in a fresh interpreter and return its SUMMARY object; a BenchmarkError if it fails."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise failure(cmd, f"ran past the {timeout} s timeout") from None
    if proc.returncode != 0:
        raise failure(cmd, f"exited with status {proc.returncode}", proc.stderr)
    return parse_summary(cmd, proc)


def benchmark(algos, scripts_dir, repeats, quick, cuda, timeout=None):
    """Run the plan for `algos` with scripts from `scripts_dir`; returns one record per run, in order."""
    order = plan(algos, repeats, cuda)
    runs = []
    for index, (algo, variant, repeat) in enumerate(order, 1):
        cmd = command(algo, variant, scripts_dir, quick)
        summary = run_one(cmd, timeout)
        note(f"[{index}/{len(order)}] {algo.name} {variant.name}: {summary['sps']:.0f} sps")
        runs.append(
            {"algo": algo.name, "variant": variant.name, "repeat": repeat, "flags": cmd[2:], "summary": summary}
        )
    return runs


def parse_args(argv):
    """The harness's command line."""
    names = [algo.name for algo in ALGOS]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--algos", nargs="+", choices=names, default=names, help="algorithms to run (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant")
    parser.add_argument("--quick", action="store_true", help="the small budget of each algorithm (default: full)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument("--scripts-dir", type=Path, default=ROOT / "leanrl", help="where the scripts are")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results", help="where results go")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def main(argv=None):
    """Run the benchmark, print the table, write the results; returns the exit status."""
    args = parse_args(argv)
    algos = runnable([algo for algo in ALGOS if algo.name in args.algos], args.scripts_dir)
    if not algos:
        note("benchmark stopped: no algorithm has both scripts on disk")
        return 1
    started = datetime.now()
    try:
        runs = benchmark(algos, args.scripts_dir, args.repeats, args.quick, torch.cuda.is_available(), args.timeout)
    except BenchmarkError as error:
        note(f"benchmark stopped: {error}")
        return 1
    machine = machine_info()
    settings = {"budget": "quick" if args.quick else "full", "repeats": args.repeats, "started": started.isoformat()}
    table = report.rows(runs)
    table_md = report.markdown(table, machine, settings)
    document = {"settings": settings, "machine": machine, "table": table, "runs": runs}
    paths = report.write(args.out_dir, started.strftime("%Y%m%d-%H%M%S"), document, table_md)
    print(table_md, end="")
    note(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
