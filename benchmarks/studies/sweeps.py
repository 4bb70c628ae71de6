"""A sweep in one process against separate runs: a seeds script's sweep (K values of one flag x N
seeds, one vmapped program) against the same K x N runs of the `_cpu` script, P processes at a
time: the wall time of each, whether the sweep ranks the settings as the runs do (the same best;
Spearman's correlation), and a sweep's cost per member against a seeds run of as many members.

    # 4 learning rates x 2 seeds of DQN on CartPole-v1 against its 8 runs, 2 at a time
    python -m benchmarks.studies.sweeps --total-timesteps 100000
    python -m benchmarks.studies.sweeps --algo td3 --flag tau --values 0.005 0.05 --seeds 3
    python -m benchmarks.studies.sweeps --quick  # tiny budgets: a smoke test of the harness

Budgets are benchmarks.studies.seeds'. Runs are pinned to cores // P cores (`taskset`). Writes
benchmarks/results/sweeps-<time>.{json,md,png} (or to --out-dir); a failed run exits 1.
"""

import os
import queue
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from benchmarks import cli
from benchmarks.machine import machine_info
from benchmarks.plots import panels, save
from benchmarks.report import machine_line, table, write_result
from benchmarks.run import BenchmarkError, note
from benchmarks.studies.seeds import ALGOS, budget, process_cores, run_together, single_command


def budget_flags(algo, quick, steps):
    """The algorithm's budget (benchmarks.studies.seeds'), its steps replaced by `steps`."""
    flags = budget(algo, quick)
    if steps is not None:
        flags[flags.index("--total-timesteps") + 1] = str(steps)
    return flags


def timed(function, *args):
    """`function(*args)` and the seconds it took."""
    start = time.perf_counter()
    return function(*args), time.perf_counter() - start


def run_pool(commands, at_once, timeout, cwd):
    """`commands` (each a function of the cores it gets -> (command, added environment)) at most
    `at_once` at a time, each on its share of the cores; their summaries, in order."""
    slots = queue.Queue()
    for index in range(at_once):
        slots.put(process_cores(index, at_once, os.cpu_count() or 1))

    def one(command):
        cores = slots.get()
        try:
            cmd, env = command(cores)
            (summary,) = run_together([cmd], timeout, cwd, [env])
            return summary
        finally:
            slots.put(cores)

    with ThreadPoolExecutor(at_once) as pool:
        return list(pool.map(one, commands))


def ranks(values):
    """The rank of each value (1: the smallest), ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    for value in set(values):
        tied = [i for i in order if values[i] == value]
        first = order.index(tied[0])
        for i in tied:
            result[i] = first + (len(tied) + 1) / 2
    return result


def spearman(a, b):
    """Spearman's rank correlation of two lists (None if either is constant)."""
    ra, rb = ranks(a), ranks(b)
    if len(set(ra)) < 2 or len(set(rb)) < 2:
        return None
    return statistics.correlation(ra, rb)


def setting_means(values, members, summaries):
    """Per value, the mean of its runs' final returns (None if none had one)."""
    means = []
    for value in values:
        finals = [s["return_mean"] for (v, _), s in zip(members, summaries) if v == value]
        finals = [r for r in finals if r is not None]
        means.append(statistics.fmean(finals) if finals else None)
    return means


def without_curves(summary):
    """A run's summary without its learning curves: one point an episode, megabytes over 80 runs."""
    return {key: value for key, value in summary.items() if key not in ("curve", "curves")}


def measure(args, algo):
    """The sweep, the seeds run and the single runs; returns the study's table."""
    flag, values = args.flag, args.values
    flags = budget_flags(algo, args.quick, args.total_timesteps) + args.script_flags
    cwd = args.out_dir / "runs"  # the runs' run folders
    cwd.mkdir(parents=True, exist_ok=True)
    seeds_script = [sys.executable, str(args.scripts_dir / f"{algo.script}.py"), *flags]
    # each run an experiment name of its own: runs started in one second get folders of their own
    sweep_cmd = [*seeds_script, "--exp-name", "sweep", "--num-seeds", str(args.seeds)]
    sweep_cmd += [f"--{flag}", *map(str, values)]
    (sweep,), sweep_s = timed(run_together, [sweep_cmd], args.timeout, cwd)
    note(f"sweep: {sweep_s:.1f} s, {sweep['sps']:.0f} sps")
    members = [(value, seed) for value in values for seed in range(1, args.seeds + 1)]
    seeds_cmd = [*seeds_script, "--exp-name", "seeds", "--num-seeds", str(len(members))]
    (seeds_run,), seeds_s = timed(run_together, [seeds_cmd], args.timeout, cwd)
    note(f"seeds: {seeds_s:.1f} s, {seeds_run['sps']:.0f} sps")

    def single(value, seed):
        def command(cores):  # single_command's pinning and threads, with our flags
            cmd, env = single_command(algo, args.scripts_dir, seed, args.quick, cores)
            script = cmd.index(str(args.scripts_dir / f"{algo.single}.py"))
            own = [*flags, "--seed", str(seed), f"--{flag}", str(value), "--exp-name", f"{value:g}"]
            return [*cmd[: script + 1], *own], env

        return command

    commands = [single(value, seed) for value, seed in members]
    singles, runs_s = timed(run_pool, commands, args.processes, args.timeout, cwd)
    note(f"runs: {runs_s:.1f} s, {args.processes} at a time")
    sweep_means = [row["return_mean"] for row in sweep["settings"]]
    run_means = setting_means(values, members, singles)
    complete = None not in sweep_means and None not in run_means
    best = [values[m.index(max(m))] if complete else None for m in (sweep_means, run_means)]
    found = dict(algo=algo.name, flag=flag, values=values, seeds=args.seeds)
    found |= dict(processes=args.processes, sweep_means=sweep_means, run_means=run_means)
    found["spearman"] = spearman(sweep_means, run_means) if complete else None
    found["same_best"] = best[0] == best[1] if complete else None
    found |= dict(sweep_s=sweep_s, runs_s=runs_s, runs_vs_sweep=runs_s / sweep_s)
    found |= dict(sweep_sps=sweep["sps"], seeds_sps=seeds_run["sps"])
    found["sweep_vs_seeds"] = sweep["sps"] / seeds_run["sps"]
    summaries = dict(sweep=without_curves(sweep), seeds=without_curves(seeds_run))
    return found | {"summaries": summaries | {"runs": [without_curves(s) for s in singles]}}


def markdown(result):
    r, settings = result["table"], result["settings"]
    lines = [
        machine_line(result["machine"]),
        f"Budget: {settings['budget']}; {r['seeds']} seeds a setting; the runs {r['processes']} "
        f"at a time; started {settings['started']}",
        "",
    ]
    rows = [
        [f"{value:g}", *("n/a" if x is None else f"{x:.1f}" for x in (sweep, runs))]
        for value, sweep, runs in zip(r["values"], r["sweep_means"], r["run_means"])
    ]
    header = f"{r['flag']} | sweep: mean final return | runs: mean final return"
    lines += table(header, rows, "rrr")
    spearman = "n/a" if r["spearman"] is None else f"{r['spearman']:.2f}"
    lines += [
        "",
        f"Rank correlation {spearman}, same best setting: {r['same_best']}. Wall time: sweep "
        f"{r['sweep_s']:.1f} s, runs {r['runs_s']:.1f} s ({r['runs_vs_sweep']:.2f}x the sweep's). "
        f"Per member: the sweep {r['sweep_sps']:.0f} sps against {r['seeds_sps']:.0f} for as many "
        f"members unswept ({r['sweep_vs_seeds']:.2f}x).",
    ]
    return "\n".join(lines) + "\n"


def plot(result, path):
    """The settings' mean final returns against the flag's values: the sweep's and the runs'."""
    r = result["table"]
    figure, (ax,) = panels(1, 5, 3.6)
    x = range(len(r["values"]))
    ax.plot(x, r["sweep_means"], "o-", label="sweep, one process")
    ax.plot(x, r["run_means"], "s--", label=f"single runs, {r['processes']} at a time")
    ax.set_xticks(list(x), [f"{v:g}" for v in r["values"]])
    ax.set(xlabel=r["flag"], ylabel="mean final return", title=f"{r['algo']}: {r['seeds']} seeds")
    ax.legend(fontsize=7)
    save(figure, path)


def parse_args(argv):
    names = [algo.name for algo in ALGOS]
    parser, add = cli.parser("benchmarks.studies.sweeps", __doc__, "--scripts-dir --out-dir")
    add("--algo", choices=names, default="dqn", help="the algorithm (dqn)")
    add("--flag", default="learning-rate", help="the flag swept (learning-rate)")
    add("--values", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3, 3e-3], help="its values")
    add("--seeds", type=int, default=2, help="seeds a setting (2)")
    add("--processes", type=int, default=2, help="single runs at a time (2)")
    add("--total-timesteps", type=int, help="steps of each member and run")
    add("--quick", action="store_true", help="the seeds study's tiny budget")
    add("--no-compile", action="store_true", help="every run eagerly (a smoke test's speed)")
    add("--timeout", type=float, default=3600, help="seconds one run may take")
    args = parser.parse_args(argv)
    if len(args.values) < 2 or min(args.seeds, args.processes) < 1:
        parser.error("--values needs 2 or more, --seeds and --processes 1 or more")
    args.script_flags = ["--no-compile"] if args.no_compile else []
    return args


def main(argv=None):
    """Run the study, print its table, write its results; returns the exit status."""
    args = parse_args(argv)
    algo = next(algo for algo in ALGOS if algo.name == args.algo)
    started = datetime.now()
    try:
        table = measure(args, algo)
    except BenchmarkError as error:
        note(f"study stopped: {error}")
        return 1
    settings = dict(budget="quick" if args.quick else "full", started=started.isoformat())
    settings["steps"] = args.total_timesteps
    result = dict(settings=settings, machine=machine_info(), table=table)
    stem = f"sweeps-{started:%Y%m%d-%H%M%S}"
    return cli.conclude(markdown(result), write_result(result, args.out_dir, stem, markdown, plot))


if __name__ == "__main__":
    sys.exit(main())
