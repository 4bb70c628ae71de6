"""Data-parallel PPO on this machine: sps of 1 and N processes of
ppo_continuous_action_distributed.py side by side, their scaling efficiency, and the
environment-only limit of as many processes (docs/scaling-torchrun.md).

    python -m benchmarks.studies.scaling  # 1 and 2 processes, 3 rounds, HalfCheetah-v4, ~2 min
    python -m benchmarks.studies.scaling --processes 1 2 4 --repeats 2 --iterations 8
    python -m benchmarks.studies.scaling -- --compile            # flags after -- go to every run

N processes are `torchrun --standalone --nproc_per_node N` on loopback (gloo on `lo`), each
stepping `--num-envs` envs on the CPU with one intra-op thread (weak scaling); the counts alternate
run by run, each round with its own seed. A run's sps counts every process's steps after `--burnin`
iterations. Efficiency = sps(N) / (N x sps(1)), medians over rounds; the env-only limit is N copies
of `benchmarks.env_limit` at once. Writes benchmarks/results/scaling-<time>.{json,md,png} (or to
--out-dir); a failed run exits 1.
"""

import os
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from benchmarks import cli
from benchmarks.machine import machine_info
from benchmarks.plots import panels, save, smooth
from benchmarks.processes import kill_tree
from benchmarks.report import machine_line, optional, write_result
from benchmarks.report import table as report_table
from benchmarks.run import BenchmarkError, failure, note, parse_summary, result_line
from benchmarks.scripts import SCRIPTS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = SCRIPTS / "ppo_continuous_action_distributed.py"
NUM_STEPS = 2048  # the script's default rollout length per env


def loopback_env():
    """Every run's environment: gloo on loopback, one thread unless OMP_NUM_THREADS is set."""
    env = {"OMP_NUM_THREADS": "1"} | dict(os.environ)
    return env | {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}


def execute(cmd, timeout, env=None):
    """Run `cmd` from the repository root; the finished process, or a BenchmarkError if it fails or
    runs past `timeout` seconds (then it and every process it started are killed)."""
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, **pipes)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.communicate()
        raise failure(cmd, f"ran past the {timeout} s timeout") from None
    finally:
        if proc.poll() is None:  # Ctrl-C or an error in this process: leave no rank behind
            kill_tree(proc.pid)
    completed = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if proc.returncode != 0:
        raise failure(cmd, f"exited with status {proc.returncode}", stderr)
    return completed


def run_command(processes, flags):
    """The command line of one run of `processes` processes."""
    if processes == 1:
        return [sys.executable, str(SCRIPT), *flags]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*torchrun, "--nproc_per_node", str(processes), str(SCRIPT), *flags]


def run_flags(processes, args, seed):
    """The script's flags for a run of `processes` processes."""
    total = args.iterations * NUM_STEPS * args.num_envs * processes
    flags = ["--env-id", args.env_id, "--num-envs", str(args.num_envs)]
    flags += ["--total-timesteps", str(total), "--measure-burnin", str(args.burnin)]
    return [*flags, "--seed", str(seed), "--no-cuda", "--dist-backend", "gloo", *args.script_flags]


def env_limit(processes, args):
    """The env-only sps of `processes` copies of the script's env stepped at the same time."""
    limit = [sys.executable, "-m", "benchmarks.env_limit", "--seconds", str(args.env_seconds)]
    limit += [str(SCRIPT), "--env-id", args.env_id, "--num-envs", str(args.num_envs), "--seed"]
    commands = [[*limit, str(1 + copy * args.num_envs)] for copy in range(processes)]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    procs = [subprocess.Popen(cmd, **pipes) for cmd in commands]
    results = []
    try:
        for cmd, proc in zip(commands, procs):
            stdout, stderr = proc.communicate(timeout=args.timeout)
            if proc.returncode != 0:
                raise failure(cmd, f"exited with status {proc.returncode}", stderr)
            done = subprocess.CompletedProcess(cmd, 0, stdout, stderr)
            results.append(result_line(cmd, done, "ENV_ONLY"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return {"sps": sum(result["sps"] for result in results), "copies": results}


def rows(runs, limits):
    """One row per process count: sps median, min and max over its runs, speed-up and scaling
    efficiency against the median of 1 process, the env-only limit, mean return."""
    groups = {}
    for run in runs:
        groups.setdefault(run["processes"], []).append(run["summary"])
    single = statistics.median(s["sps"] for s in groups[1]) if 1 in groups else None
    table = []
    for processes, summaries in sorted(groups.items()):
        sps = [s["sps"] for s in summaries]
        median = statistics.median(sps)
        returns = [s["return_mean"] for s in summaries if s["return_mean"] is not None]
        row = dict(processes=processes, runs=len(summaries), sps_median=median)
        row |= dict(sps_min=min(sps), sps_max=max(sps), speedup=median / single if single else None)
        row["efficiency"] = median / (processes * single) if single else None
        row["env_only_sps"] = limits[processes]["sps"]
        table.append(row | {"return_mean": statistics.fmean(returns) if returns else None})
    return table


def markdown(table, machine, settings):
    """The table in markdown, headed by the machine and the settings."""
    lines = [
        machine_line(machine),
        f"{settings['env_id']}, {settings['num_envs']} env(s) per process, "
        f"{settings['iterations']} iterations a run "
        f"(sps after {settings['burnin']}), {settings['repeats']} rounds "
        f"(seeds {' '.join(map(str, settings['seeds']))}), "
        f"script flags: {' '.join(settings['script_flags']) or 'none'}; started "
        f"{settings['started']}",
        "",
    ]
    rows = [
        f"{r['processes']} | {r['sps_median']:.0f} | {r['sps_min']:.0f}-{r['sps_max']:.0f} | "
        f"{optional(r['speedup'], '.2f', 'x')} | {optional(r['efficiency'], '.0%')} | "
        f"{r['env_only_sps']:.0f} | {optional(r['return_mean'], '.1f')} | {r['runs']}"
        for r in table
    ]
    header = "processes | sps median | sps min-max | speed-up | efficiency | env-only sps | return "
    return "\n".join(lines + report_table(header + "mean | runs", rows, "r" * 8)) + "\n"


def figure(table, runs):
    """Left: sps per process count (median, min-max), the ideal N x sps(1) and the env-only limit.
    Right: every run's episodic return (mean of the last 10) against environment steps, one color
    per process count."""
    fig, (bars, curves) = panels(2, 5)
    labels, medians = [str(r["processes"]) for r in table], [r["sps_median"] for r in table]
    errors = [[r["sps_median"] - r["sps_min"] for r in table]]
    errors.append([r["sps_max"] - r["sps_median"] for r in table])
    colors = [f"C{i}" for i in range(len(table))]
    drawn = bars.bar(labels, medians, yerr=errors, capsize=3, color=colors)
    bars.bar_label(drawn, fmt="%.0f", fontsize=7, label_type="center")
    single = next((r["sps_median"] for r in table if r["processes"] == 1), None)
    if single:
        ideal = [r["processes"] * single for r in table]
        bars.plot(labels, ideal, "k:", marker="o", label="N x sps(1)")
    bars.plot(labels, [r["env_only_sps"] for r in table], "k--", marker="s", label="env only")
    bars.set(xlabel="processes", ylabel="env steps per second, all processes")
    bars.legend(fontsize=8)
    for index, r in enumerate(table):
        for n, run in enumerate(run for run in runs if run["processes"] == r["processes"]):
            points = run["summary"]["curve"]
            if points:
                steps, _, returns = zip(*points)
                label = f"{r['processes']} process(es)" if n == 0 else None
                curves.plot(steps, smooth(list(returns)), color=f"C{index}", lw=1, label=label)
    curves.set(xlabel="environment steps, all processes", ylabel="episodic return (rank 0's envs)")
    curves.legend(fontsize=8)
    return fig


def parse_args(argv):
    parser, add = cli.parser("benchmarks.studies.scaling", __doc__, "--out-dir")
    add("--processes", type=int, nargs="+", default=[1, 2], help="process counts (1 always runs)")
    add("--repeats", type=int, default=3, help="rounds: runs of each process count")
    add("--iterations", type=int, default=5, help="iterations of each run")
    add("--burnin", type=int, default=2, help="iterations a run leaves out of its sps")
    add("--env-id", default="HalfCheetah-v4")
    add("--num-envs", type=int, default=1, help="envs of each process")
    add("--env-seconds", type=float, default=3.0, help="how long to time the envs alone")
    add("--timeout", type=float, default=600, help="seconds one run may take")
    add("script_flags", nargs="*", help="after --: flags added to every run, e.g. -- --compile")
    args = parser.parse_args(argv)
    if (
        min(args.processes) < 1
        or args.repeats < 1
        or args.num_envs < 1
        or not 0 <= args.burnin < args.iterations
    ):
        parser.error(
            "--processes, --repeats and --num-envs must be >= 1, and 0 <= --burnin < --iterations"
        )
    args.processes = sorted({1, *args.processes})
    return args


def main(argv=None):
    """Run the benchmark, print the table, write the results; returns the exit status."""
    args = parse_args(argv)
    started = datetime.now()
    seeds = list(range(1, args.repeats + 1))
    runs = []
    try:
        limits = {processes: env_limit(processes, args) for processes in args.processes}
        for processes, limit in limits.items():
            note(f"env only, {processes} process(es) at once: {limit['sps']:.0f} sps")
        for seed in seeds:
            for processes in args.processes:
                cmd = run_command(processes, run_flags(processes, args, seed))
                summary = parse_summary(cmd, execute(cmd, args.timeout, loopback_env()))
                note(f"{processes} process(es), seed {seed}: {summary['sps']:.0f} sps")
                runs.append(
                    {"processes": processes, "seed": seed, "flags": cmd[1:], "summary": summary}
                )
    except BenchmarkError as error:
        note(f"benchmark stopped: {error}")
        return 1
    settings = {
        key: getattr(args, key)
        for key in ("env_id", "num_envs", "iterations", "burnin", "repeats", "script_flags")
    } | {"seeds": seeds, "started": started.isoformat()}
    table = rows(runs, limits)
    document = {"settings": settings, "machine": machine_info(), "env_limits": limits}
    document |= {"table": table, "runs": runs}
    render = lambda d: markdown(d["table"], d["machine"], d["settings"])  # noqa: E731
    draw = lambda d, path: save(figure(d["table"], d["runs"]), path)  # noqa: E731
    stem = f"scaling-{started:%Y%m%d-%H%M%S}"
    return cli.conclude(render(document), write_result(document, args.out_dir, stem, render, draw))


if __name__ == "__main__":
    sys.exit(main())
