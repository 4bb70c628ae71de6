"""One intra-op thread against two: the `_cpu` and `_seeds` scripts' sps with `--threads 1` and
`--threads 2`, on an idle machine and beside one other process that keeps a core busy (a second
user, a data loader, another run).

    python -m benchmarks.studies.threads  # SAC, TD3, DQN and PPO, quick budgets, 2 rounds
    python -m benchmarks.studies.threads --algos sac --rounds 3

Each algorithm's runs alternate (threads 1, threads 2, per script), `--rounds` times in each
condition, on the budgets of `benchmarks.studies.seeds` (the seeds scripts with `--num-seeds 2`). A
row gives the median sps and the ratio of two threads to one. Writes
benchmarks/results/threads-<time>.{json,md} (or to --out-dir).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from benchmarks import report
from benchmarks.machine import machine_info
from benchmarks.run import note
from benchmarks.studies.seeds import ALGOS, budget, read_summary

ROOT = Path(__file__).resolve().parents[2]
CONDITIONS = ("idle", "one core busy")
BUSY_LOOP = "while True: pass"


def command(script, flags, threads):
    return [
        sys.executable,
        str(ROOT / "leanrl" / f"{script}.py"),
        *flags,
        "--threads",
        str(threads),
    ]


def runs_of(algo, quick):
    """(script, flags) of the algorithm's single-seed `_cpu` script and of its seeds script with 2
    members."""
    flags = budget(algo, quick)
    return [(algo.single, flags), (algo.script, [*flags, "--num-seeds", "2"])]


def measure(algos, rounds, quick, timeout, cwd):
    """{condition: {script: {threads: [sps, ...]}}}, the busy process started before a condition's
    runs and stopped after them."""
    results = {}
    for condition in CONDITIONS:
        busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if condition != "idle" else None
        try:
            results[condition] = {}
            for algo in algos:
                for _ in range(rounds):
                    for script, flags in runs_of(algo, quick):
                        for threads in (1, 2):
                            cmd = command(script, flags, threads)
                            proc = subprocess.run(
                                cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd
                            )
                            sps = read_summary(cmd, proc)["sps"]
                            note(f"{condition}: {script} --threads {threads}: {sps:.0f} sps")
                            results[condition].setdefault(script, {}).setdefault(
                                threads, []
                            ).append(sps)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait(timeout=10)
    return results


def rows(results):
    """One row per condition and script: median sps with one and two threads, and their ratio."""
    table = []
    for condition, scripts in results.items():
        for script, by_threads in scripts.items():
            one, two = (statistics.median(by_threads[t]) for t in (1, 2))
            table.append(
                dict(condition=condition, script=script, one=one, two=two, ratio=two / one)
            )
    return table


def markdown(result):
    lines = [
        f"{report.machine_line(result['machine'])}; {result['settings']['rounds']} round(s), "
        "medians.",
        "",
        "| condition | script | sps, 1 thread | sps, 2 threads | 2 / 1 |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['condition']} | {r['script']} | {r['one']:.0f} | {r['two']:.0f} | "
            f"{r['ratio']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=[algo.name for algo in ALGOS])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--full", action="store_true", help="the full budgets of benchmarks.studies.seeds"
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds for one run")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    unknown = set(args.algos) - {algo.name for algo in ALGOS}
    if unknown or args.rounds < 1:
        print(f"error: --algos must name {[a.name for a in ALGOS]}, --rounds >= 1", file=sys.stderr)
        sys.exit(2)
    algos = [algo for algo in ALGOS if algo.name in args.algos]
    started = datetime.now()
    with tempfile.TemporaryDirectory(prefix="threads-") as cwd:
        results = measure(algos, args.rounds, not args.full, args.timeout, cwd)
    settings = dict(
        rounds=args.rounds, budget="full" if args.full else "quick", started=started.isoformat()
    )
    result = dict(machine=machine_info(), settings=settings, results=results, rows=rows(results))
    stem = f"threads-{started:%Y%m%d-%H%M%S}"
    paths = report.write_result(result, args.out_dir, stem, markdown)
    print(markdown(result))
    note("wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
