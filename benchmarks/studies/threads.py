"""Threads chosen by measurement against fixed ones: the `_cpu` and `_seeds` scripts' sps at their
default (no `--threads`: the run measures), with `--threads 1` and `--threads 2`, on an idle
machine and beside one process that keeps a core busy.

    python -m benchmarks.studies.threads  # SAC, TD3, DQN and PPO, quick budgets, 2 rounds
    python -m benchmarks.studies.threads --algos sac --rounds 3
    python -m benchmarks.studies.threads --full --busy-ways default 1  # 2 threads busy: known slow

Runs alternate per script, `--rounds` times per condition, at benchmarks.studies.seeds' budgets.
Writes benchmarks/results/threads-<time>.{json,md} (or to --out-dir).
"""

import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from benchmarks import cli, report
from benchmarks.machine import machine_info
from benchmarks.run import note
from benchmarks.studies.seeds import ALGOS, budget, read_summary

ROOT = Path(__file__).resolve().parents[2]
CONDITIONS = ("idle", "one core busy")
BUSY_LOOP = "while True: pass"
WAYS = ("default", 1, 2)  # no --threads (measured), --threads 1, --threads 2


def command(script, flags, threads):
    fixed = [] if threads == "default" else ["--threads", str(threads)]
    return [sys.executable, str(ROOT / "leanrl" / f"{script}.py"), *flags, *fixed]


def runs_of(algo, quick):
    """(script, flags) of the algorithm's single-seed `_cpu` script and of its seeds script with 2
    members."""
    flags = budget(algo, quick)
    return [(algo.single, flags), (algo.script, [*flags, "--num-seeds", "2"])]


def measure(algos, rounds, quick, timeout, cwd, busy_ways=WAYS):
    """{condition: {script: {way: [sps, ...]}}} for each way of WAYS (`busy_ways` beside the busy
    core); {condition: {script: [threads, ...]}}, the counts the default runs ended on; and
    {condition: {script: [trials, ...]}}, each default run's `thread_trials` (the count and ms an
    iteration of each turn it timed: why it ended where it did). The busy process started before a
    condition's runs and stopped after them."""
    results, chosen, trials = {}, {}, {}
    for condition in CONDITIONS:
        busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if condition != "idle" else None
        try:
            results[condition], chosen[condition], trials[condition] = {}, {}, {}
            for algo in algos:
                for _ in range(rounds):
                    for script, flags in runs_of(algo, quick):
                        for threads in WAYS if condition == "idle" else busy_ways:
                            cmd = command(script, flags, threads)
                            proc = subprocess.run(
                                cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd
                            )
                            summary = read_summary(cmd, proc)
                            note(
                                f"{condition}: {script} threads {threads}: {summary['sps']:.0f} sps"
                            )
                            ways = results[condition].setdefault(script, {})
                            ways.setdefault(threads, []).append(summary["sps"])
                            if threads == "default":
                                chosen[condition].setdefault(script, []).append(summary["threads"])
                                turns = trials[condition].setdefault(script, [])
                                turns.append(summary["thread_trials"])
        finally:
            if busy is not None:
                busy.kill()
                busy.wait(timeout=10)
    return results, chosen, trials


def rows(results, chosen=None):
    """One row per condition and script: median sps with one and two threads, and their ratio;
    where the default ran (`chosen` holds its counts), its median sps, its ratio to the better of
    the fixed counts run, and the counts it ended on. A count not run: None."""
    table = []
    for condition, scripts in results.items():
        for script, by_threads in scripts.items():
            one, two = (
                statistics.median(by_threads[t]) if t in by_threads else None for t in (1, 2)
            )
            ratio = two / one if one and two else None
            row = dict(condition=condition, script=script, one=one, two=two, ratio=ratio)
            if "default" in by_threads:
                row["default"] = statistics.median(by_threads["default"])
                row["vs_best"] = row["default"] / max(x for x in (one, two) if x)
                row["chosen"] = sorted(set(chosen[condition][script]))
            table.append(row)
    return table


def markdown(result):
    """The table; results without the default (before threads were measured) in their own form."""
    default = all("default" in r for r in result["rows"])
    header = "condition | script | sps, 1 thread | sps, 2 threads | 2 / 1"
    rows = []
    for r in result["rows"]:
        one, two = ("-" if r[k] is None else f"{r[k]:.0f}" for k in ("one", "two"))
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        rows.append([r["condition"], r["script"], one, two, ratio])
        if default:
            rows[-1] += [
                f"{r['default']:.0f}",
                f"{r['vs_best']:.2f}x",
                " ".join(map(str, r["chosen"])),
            ]
    if default:
        header += " | sps, default | default / best | default ended on"
    head = f"{report.machine_line(result['machine'])}; {result['settings']['rounds']} round(s), "
    lines = [head + "medians.", "", *report.table(header, rows, "llrrr" + "rrl" * default)]
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser, add = cli.parser("benchmarks.studies.threads", __doc__, "--out-dir")
    add("--algos", nargs="+", default=[algo.name for algo in ALGOS])
    add("--rounds", type=int, default=2)
    add("--full", action="store_true", help="the full budgets of benchmarks.studies.seeds")
    ways = lambda way: way if way == "default" else int(way)  # noqa: E731
    add("--busy-ways", nargs="+", default=list(WAYS), type=ways, help="default: default 1 2")
    add("--timeout", type=float, default=900, help="seconds for one run")
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
        quick, busy_ways = not args.full, args.busy_ways
        measured = measure(algos, args.rounds, quick, args.timeout, cwd, busy_ways)
    results, chosen, trials = measured
    budget = "full" if args.full else "quick"
    settings = dict(rounds=args.rounds, budget=budget, started=started.isoformat())
    settings["busy_ways"] = busy_ways
    result = dict(machine=machine_info(), settings=settings, results=results, chosen=chosen)
    result["trials"] = trials
    result["rows"] = rows(results, chosen)
    stem = f"threads-{started:%Y%m%d-%H%M%S}"
    paths = report.write_result(result, args.out_dir, stem, markdown)
    print(markdown(result))
    note("wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
