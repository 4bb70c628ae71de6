"""Did a change make a script slower? Each variant of `benchmarks.run` (eager, twin, twin
`--compile`, the CPU script) run from two folders of scripts in turn, before then after, at the
quick budget, `--rounds` times: the median sps of each and the ratio after / before.

    git worktree add /tmp/before <commit>
    python -m benchmarks.studies.before_after --before /tmp/before/leanrl --algos sac dqn

The folder after is the checkout's leanrl/ (or `--after`). The runs of one variant alternate, so
that a machine that slows down during the study slows both. Writes
benchmarks/results/before_after-<time>.{json,md} (or to --out-dir).
"""

import argparse
import statistics
from datetime import datetime
from pathlib import Path

from benchmarks import registry, report
from benchmarks.machine import machine_info
from benchmarks.run import command, note, run_one
from benchmarks.scripts import SCRIPTS

ROOT = Path(__file__).resolve().parents[2]
TIMED = ("eager", "torchcompile", "compile", "cpu")


def plan(algos, rounds):
    """(algo, variant, round) of every pair of runs, variant by variant."""
    variants = [v for v in registry.VARIANTS if v.name in TIMED]
    return [(a, v, r) for a in algos for v in variants if a.runs(v) for r in range(rounds)]


def measure(algos, before, after, rounds, timeout):
    """{(algo, variant): {"before": [sps, ...], "after": [...]}}, before and after in turn."""
    sps = {}
    for algo, variant, round_ in plan(algos, rounds):
        for side, folder in (("before", before), ("after", after)):
            cmd = command(algo, variant, Path(folder), True, seed=1 + round_)
            summary = run_one(cmd, timeout)
            sps.setdefault((algo.name, variant.name), {"before": [], "after": []})[side].append(
                summary["sps"]
            )
            note(f"{algo.name} {variant.name} {side}: {summary['sps']:.0f} sps")
    return sps


def rows(sps):
    return [
        {
            "algo": algo,
            "variant": variant,
            "before": statistics.median(runs["before"]),
            "after": statistics.median(runs["after"]),
            "ratio": statistics.median(runs["after"]) / statistics.median(runs["before"]),
        }
        for (algo, variant), runs in sps.items()
    ]


def markdown(result):
    lines = [
        report.machine_line(result["machine"]),
        f"Quick budgets, {result['rounds']} rounds, started {result['started']}.",
        "",
        "| algorithm | variant | before sps | after sps | after / before |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        cells = [r["algo"], r["variant"], f"{r['before']:.0f}", f"{r['after']:.0f}"]
        lines.append(f"| {' | '.join(cells)} | {r['ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.before_after")
    parser.add_argument("--before", type=Path, required=True, help="the scripts before a change")
    parser.add_argument("--after", type=Path, default=SCRIPTS, help="the scripts after it")
    names = [a.name for a in registry.ALGOS]
    parser.add_argument("--algos", nargs="+", choices=names, default=names)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side per variant")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    algos = [a for a in registry.ALGOS if a.name in args.algos]
    started = datetime.now()
    sps = measure(algos, args.before.resolve(), args.after.resolve(), args.rounds, args.timeout)
    result = dict(
        started=started.isoformat(timespec="seconds"),
        machine=machine_info(),
        rounds=args.rounds,
        rows=rows(sps),
        before=str(args.before),
        after=str(args.after),
    )
    stem = f"before_after-{started:%Y%m%d-%H%M%S}"
    for path in report.write_result(result, args.out_dir, stem, markdown):
        print(path)


if __name__ == "__main__":
    main()
