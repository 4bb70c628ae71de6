"""Learning at CleanRL's budgets: every run of a named set trained to the end, its final return
beside the one CleanRL publishes for the same algorithm and env.

    python -m benchmarks.learning --jobs 2             # the default set, two runs at a time
    python -m benchmarks.learning --only sac dqn       # the runs whose name has "sac", then "dqn"
    python -m benchmarks.learning --report  # rebuild the table, plots and JSON from the summaries
    python -m benchmarks.learning --set atari  # PPO Atari (async) on Breakout, when time is left
    python -m benchmarks.learning --set pqn --jobs 2  # PQN on CartPole-v1, 500k steps, 5 seeds
    python -m benchmarks.learning --set pqn_atari  # PQN on Breakout-v5, 500k steps, one seed

A run is `python leanrl/<script>.py --env-id E --total-timesteps N --seed S --eval-episodes 10` (a
`_seeds` script: all seeds in one process) in its own folder `<out-dir>/<script>__<env>__<steps>__
<seed>/`; it is done when the harness has written that folder's `summary.json` (curves thinned to
500 points, the command, the times, the CPU). Done runs are skipped, partial ones started over, so
a killed harness picks up where it stopped. Runs die with the harness. The report goes to
`<out-dir>` (default benchmarks/results/learning/): `<set>.md` (mean ± std over seeds of the final
return and evaluation, CleanRL's value beside), `<set>-readme.md`, `<set>.json`, `<set>-<env>.png`.
The sets are in `learning_set`; docs/results.md says how long each run took.
"""

import fcntl
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks import cli, plots
from benchmarks.machine import cpu_model, machine_info
from benchmarks.processes import die_with_parent, kill_tree, note
from benchmarks.report import machine_line, optional
from benchmarks.report import table as table_lines

ROOT = Path(__file__).resolve().parents[1]
CURVE_POINTS = 500  # at most this many points per stored curve
POLL_SECONDS = 1.0
VARIANT_SUFFIX = re.compile(r"_(cpu|seeds|torchcompile|async)$")
SEEDS = (1, 2, 3)
MUJOCO = ("HalfCheetah-v4", "Hopper-v4", "Walker2d-v4")


def steps_text(steps):
    """1000 -> "1k", 300000 -> "300k", 1000000 -> "1M"."""
    return f"{steps / 1e6:g}M" if steps >= 1_000_000 else f"{steps / 1e3:g}k"


@dataclass(frozen=True)
class Run:
    """One process: `script` on `env_id` for `steps` env steps from `seed`; a `_seeds` script trains
    `num_seeds` seeds from `seed` at once."""

    script: str
    env_id: str
    steps: int
    seed: int
    num_seeds: int = 1
    flags: tuple[str, ...] = ()  # the script's own, beyond env, steps and seed

    @property
    def variant(self):
        """The script and its own flags, as the report's rows name them."""
        return " ".join([self.script, *self.flags])

    @property
    def name(self):
        seeds = f"{self.seed}x{self.num_seeds}" if self.num_seeds > 1 else str(self.seed)
        variant = "_".join([self.script, *(flag.lstrip("-") for flag in self.flags)])
        return f"{variant}__{self.env_id}__{steps_text(self.steps)}__{seeds}"

    def command(self, scripts_dir, eval_episodes):
        seeds = ["--num-seeds", str(self.num_seeds)] if self.num_seeds > 1 else []
        flags = ["--env-id", self.env_id, "--total-timesteps", str(self.steps)]
        flags += ["--seed", str(self.seed), *seeds, "--eval-episodes", str(eval_episodes)]
        return [sys.executable, str(scripts_dir / f"{self.script}.py"), *flags, *self.flags]


@dataclass(frozen=True)
class Reference:
    """A published mean ± std of the final training return over seeds, at `steps`."""

    mean: float
    std: float
    steps: int
    source: str
    note: str = ""


# CleanRL's documentation (vwxyzjn/cleanrl): docs/rl-algorithms/<algo>.md shows the Open RL
# Benchmark table of each script, for PPO, SAC and TD3 included from docs/benchmark/<script>.md: the
# mean and std over 3 seeds of the training episodic return at the end of a run at the script's
# default budget.
CLEANRL = "https://github.com/vwxyzjn/cleanrl/blob/"
# the tables of tag pr-424
BENCHMARK = CLEANRL + "35896b1fefa9898b904f7e09bcbe6e168e15d2a9/docs/benchmark/"
PPO = BENCHMARK + "ppo_continuous_action.md"
DQN = CLEANRL + "08d1c0105e41f3ab435a981d3df901ea8d08cdd5/docs/rl-algorithms/dqn.md"
PQN = CLEANRL + "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb/docs/rl-algorithms/pqn.md"
REFERENCES = {
    ("ppo_continuous_action", "HalfCheetah-v4"): Reference(1442.64, 46.03, 1_000_000, PPO),
    ("ppo_continuous_action", "Hopper-v4"): Reference(2382.86, 271.74, 1_000_000, PPO),
    ("ppo_continuous_action", "Walker2d-v4"): Reference(2287.95, 571.78, 1_000_000, PPO),
    ("dqn", "CartPole-v1"): Reference(488.69, 16.11, 500_000, DQN),
    ("td3_continuous_action", "Hopper-v4"): Reference(
        3134.61, 360.18, 1_000_000, BENCHMARK + "td3.md", "its curves are images: no value at 300k"
    ),
    ("sac_continuous_action", "Hopper-v4"): Reference(
        2310.46, 342.82, 1_000_000, BENCHMARK + "sac.md", "its curves are images: no value at 300k"
    ),
    ("ppo_atari_envpool", "Breakout-v5"): Reference(
        211.24, 151.84, 10_000_000, BENCHMARK + "ppo_atari_envpool.md"
    ),
    ("pqn", "CartPole-v1"): Reference(495.13, 6.89, 500_000, PQN),
    ("pqn_atari_envpool", "Breakout-v5"): Reference(384.85, 12.39, 10_000_000, PQN),
}


def algorithm(script):
    """The algorithm a script runs: its name without the variant suffix (`dqn_cpu` -> `dqn`) and
    without the flags a run's variant adds."""
    return VARIANT_SUFFIX.sub("", script.split()[0])


def runs(script, env_id, steps, seeds, flags=()):
    """The runs of `script` with its `flags` on `env_id` for `seeds` (one for all of them if
    `_seeds`)."""
    if script.endswith("_seeds"):
        return [Run(script, env_id, steps, seeds[0], len(seeds), flags)]
    return [Run(script, env_id, steps, seed, flags=flags) for seed in seeds]


def learning_set(name):
    """The runs of the set `name`, cheap ones first."""
    if name == "smoke":  # two runs of seconds each: the harness itself, not learning
        return runs("dqn_cpu", "CartPole-v1", 1000, (1, 2))
    if name == "atari":
        return runs("ppo_atari_envpool_async", "Breakout-v5", 1_000_000, (1,))
    if name == "pqn":  # the eager reference: on a CPU as fast as the twin end to end at 500k
        return runs("pqn", "CartPole-v1", 500_000, (1, 2, 3, 4, 5))
    if name == "pqn_atari":  # the eager reference, 1/20 of CleanRL's budget: about 30 minutes here
        return runs("pqn_atari_envpool", "Breakout-v5", 500_000, (1,))
    if (
        name == "td3_plateau"
    ):  # compiled or not, does TD3 leave Hopper's plateau? (notes/td3-hopper.md)
        seeds, td3 = tuple(range(1, 11)), "td3_continuous_action_cpu"
        compiled = runs(td3, "Hopper-v4", 200_000, seeds)
        uncompiled = runs(td3, "Hopper-v4", 200_000, seeds, ("--no-compile",))
        return [run for pair in zip(compiled, uncompiled) for run in pair]
    dqn, ppo = "dqn", "ppo_continuous_action"
    td3, sac = "td3_continuous_action", "sac_continuous_action"
    return [
        *runs(f"{dqn}_seeds", "CartPole-v1", 500_000, SEEDS),
        *runs(f"{dqn}_cpu", "CartPole-v1", 500_000, SEEDS),
        *runs(dqn, "CartPole-v1", 500_000, (1,)),
        *(run for env_id in MUJOCO for run in runs(f"{ppo}_seeds", env_id, 1_000_000, SEEDS)),
        *(run for env_id in MUJOCO for run in runs(f"{ppo}_cpu", env_id, 1_000_000, SEEDS)),
        *runs(ppo, "Hopper-v4", 1_000_000, (1,)),
        *runs(f"{td3}_cpu", "Hopper-v4", 300_000, SEEDS),
        *runs(td3, "Hopper-v4", 100_000, (1,)),
        *runs(f"{sac}_seeds", "Hopper-v4", 300_000, SEEDS),
        *runs(sac, "Hopper-v4", 100_000, (1,)),
    ]


SETS = ("default", "atari", "pqn", "pqn_atari", "td3_plateau", "smoke")


# Running


def stored(folder):
    """The harness's summary.json of a run folder, or None where the run is not done."""
    path = folder / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def start(run, args):
    """Start `run` in a fresh `<out-dir>/<run>/` (a partial run's folder is deleted first), with
    `--threads` as OMP_NUM_THREADS if given; its output goes to `output.txt` there. Returns the job:
    the run, its process, command, folder, start time and load average."""
    folder = args.out_dir / run.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    cmd = run.command(args.scripts_dir, args.eval_episodes)
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads)} if args.threads else None
    with open(folder / "output.txt", "w") as output:
        # a Ctrl-C in the terminal reaches the harness (a new session), which stops the run
        kwargs = dict(start_new_session=True, preexec_fn=die_with_parent)
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=output, stderr=-2, **kwargs)
    job = {"run": run, "proc": proc, "cmd": cmd, "folder": folder, "threads": args.threads}
    return job | {"started": datetime.now(), "load": os.getloadavg()}


def thin(curve, points=CURVE_POINTS):
    """A curve of [step, seconds, return] per episode cut to at most `points` points."""
    size = max(1, math.ceil(len(curve) / points))
    chunks = [curve[i : i + size] for i in range(0, len(curve), size)]
    return [
        [c[-1][0], round(c[-1][1], 1), round(statistics.fmean(p[2] for p in c), 2)] for c in chunks
    ]


def finish(job):
    """Write a finished job's `summary.json` (atomically) if its script exited 0 with a summary of a
    whole run; returns None, or the reason it failed."""
    proc, folder = job["proc"], job["folder"]
    found = sorted(folder.glob("runs/*/summary.json"))
    if proc.returncode != 0 or len(found) != 1:
        output = folder / "output.txt"
        return f"exited with status {proc.returncode} and {len(found)} summary.json (see {output})"
    summary = json.loads(found[0].read_text())
    if summary.get("interrupted"):
        return "was interrupted"
    if "curve" in summary:
        summary["curve"] = thin(summary["curve"])
    if "curves" in summary:  # a `_seeds` script's, one per seed
        summary["curves"] = [thin(curve) for curve in summary["curves"]]
    command = ["python", os.path.relpath(job["cmd"][1], ROOT), *job["cmd"][2:]]
    record = dict(
        run=job["run"].name, command=command, started=job["started"].isoformat("T", "seconds")
    )
    record |= dict(finished=datetime.now().isoformat(timespec="seconds"), cpu=cpu_model())
    record |= dict(omp_num_threads=job["threads"], summary=summary)
    record["load_average"] = {"start": job["load"], "end": os.getloadavg()}
    path = folder / "summary.json"
    path.with_suffix(".tmp").write_text(json.dumps(record) + "\n")
    os.replace(path.with_suffix(".tmp"), path)
    return None


def wait_any(jobs, timeout):
    """The first of `jobs` to end or to run past `timeout` seconds (then it is killed with every
    process it started), and whether it timed out."""
    while True:
        for job in jobs:
            if job["proc"].poll() is not None:
                return job, False
            if (datetime.now() - job["started"]).total_seconds() > timeout:
                kill_tree(job["proc"].pid)
                job["proc"].wait(timeout=30)
                return job, True
        time.sleep(POLL_SECONDS)


def execute(todo, args):
    """Run `todo` in order, `--jobs` at a time; returns the names of the runs that failed."""
    active, failed, queue = [], [], list(todo)
    try:
        while queue or active:
            while queue and len(active) < args.jobs:
                active.append(start(queue.pop(0), args))
                note(f"started {active[-1]['run'].name}")
            job, timed_out = wait_any(active, args.timeout)
            active.remove(job)
            problem = f"ran past the {args.timeout:.0f} s timeout" if timed_out else finish(job)
            minutes = (datetime.now() - job["started"]).total_seconds() / 60
            if problem:
                failed.append(job["run"].name)
            left = len(queue) + len(active)
            note(f"{job['run'].name} {problem or 'done'} after {minutes:.1f} min; {left} to go")
    finally:
        for job in active:
            kill_tree(job["proc"].pid)
            job["proc"].wait(timeout=30)
    return failed


# The report


def members(summary):
    """Per seed of a script's summary: seed, final return (mean of the last 20 episodes), evaluation
    mean and curve, from a one-seed summary or a `_seeds` one (`seeds`, `return_means`,
    `eval_returns`, `curves`)."""
    if "seeds" in summary:
        columns = [summary[k] for k in ("seeds", "return_means", "eval_returns", "curves")]
        return [
            {
                "seed": seed,
                "return": final,
                "eval": statistics.fmean(ev) if ev else None,
                "curve": c,
            }
            for seed, final, ev, c in zip(*columns)
        ]
    final, ev = summary["return_mean"], summary.get("eval_return_mean")
    return [{"seed": summary["seed"], "return": final, "eval": ev, "curve": summary["curve"]}]


def run_seconds(record):
    """How long a done run took, start to summary (compile and evaluation included)."""
    started, finished = (datetime.fromisoformat(record[k]) for k in ("started", "finished"))
    return (finished - started).total_seconds()


def spread(values):
    """Mean and population std of the values that are not None, or (None, None) without any."""
    values = [v for v in values if v is not None]
    return (statistics.fmean(values), statistics.pstdev(values)) if values else (None, None)


def rows(plan, records):
    """One row per (script, env, steps) of `plan`, in its order."""
    groups = {}
    for run in plan:
        groups.setdefault((run.variant, run.env_id, run.steps), []).append(run)
    table = []
    for (script, env_id, steps), group in groups.items():
        done = [records[run.name] for run in group if run.name in records]
        seeds = [m for record in done for m in members(record["summary"])]
        reference = REFERENCES.get((algorithm(script), env_id))
        mean, std = spread(m["return"] for m in seeds)
        eval_mean, eval_std = spread(m["eval"] for m in seeds)
        complete = len(done) == len(group)
        within = None
        if reference and complete and mean is not None and steps == reference.steps:
            within = abs(mean - reference.mean) <= reference.std
        row = dict(script=script, env_id=env_id, steps=steps, seeds_done=len(seeds))
        row["seeds_planned"] = sum(run.num_seeds for run in group)
        row |= dict(return_mean=mean, return_std=std, eval_mean=eval_mean, eval_std=eval_std)
        row["seconds_per_run"] = spread(map(run_seconds, done))[0]
        row |= dict(reference=vars(reference) if reference else None, within_reference=within)
        table.append(row)
    return table


def mean_std(mean, std):
    return "pending" if mean is None else f"{mean:.1f} ± {std:.1f}"


def cells(r):
    """A row's script, env, steps, seeds done of planned and final return."""
    seeds = f"{r['seeds_done']}/{r['seeds_planned']}"
    return [
        r["script"],
        r["env_id"],
        steps_text(r["steps"]),
        seeds,
        mean_std(r["return_mean"], r["return_std"]),
    ]


def markdown(table, machine, timing):
    """The table in markdown under the machine and the wall time, then the references' sources."""
    wall = "no run done yet"
    if timing["first_start"]:
        hours, first, last = timing["run_hours"], timing["first_start"], timing["last_finish"]
        wall = f"{hours:.2f} h of runs, from {first} to {last}"
    if timing["load_average_1min"]:
        start, end = timing["load_average_1min"]
        wall += f", load average {start:.1f} to {end:.1f} at the runs' starts and ends"
    rows = []
    for r in table:
        ref, evaluation = r["reference"], mean_std(r["eval_mean"], r["eval_std"])
        published = ref and f"{ref['mean']:.1f} ± {ref['std']:.1f} at {steps_text(ref['steps'])}"
        within = {True: "yes", False: "**no**", None: "n/a"}[r["within_reference"]]
        minutes = r["seconds_per_run"] and r["seconds_per_run"] / 60
        rows.append([*cells(r), evaluation, published or "none", within, optional(minutes, ".1f")])
    header = "script | env | steps | seeds | final return (last 20) | evaluation (10 episodes) | "
    header += "CleanRL | within | min per run"
    lines = [
        machine_line(machine),
        f"Wall time: {wall}.",
        "",
        *table_lines(header, rows, "llrrrrrlr"),
    ]
    lines += ["", "CleanRL's values: mean ± std over 3 seeds of the training return at the end of "]
    lines[-1] += "the run."
    sources = {}
    for r in table:
        if r["reference"]:
            runs = sources.setdefault((r["reference"]["source"], r["reference"]["note"]), {})
            runs.setdefault(algorithm(r["script"]), {})[r["env_id"]] = None
    for (source, ref_note), runs in sources.items():
        names = "; ".join(f"{algo} on {', '.join(envs)}" for algo, envs in runs.items())
        lines.append(f"- {names}: {source}" + (f" ({ref_note})" if ref_note else ""))
    return "\n".join(lines) + "\n"


def short_markdown(table):
    """The README's table: the fast scripts' final return beside CleanRL's."""
    rows = []
    for r in (r for r in table if r["script"] != algorithm(r["script"])):
        ref = r["reference"]
        published = "none" if ref is None else f"{ref['mean']:.1f} ± {ref['std']:.1f}"
        if ref and ref["steps"] != r["steps"]:
            published += f" at {steps_text(ref['steps'])}"
        rows.append([f"`{r['script']}`", *cells(r)[1:], published])
    header = "script | env | steps | seeds | final return | CleanRL"
    return "\n".join(table_lines(header, rows, "llrrrr")) + "\n"


def curves_figure(env_id, plan, records):
    """The return curves of every run on `env_id` against env steps, one color per algorithm."""
    figure, (ax,) = plots.panels(1, 8, 4.5)
    scripts = list(dict.fromkeys(run.variant for run in plan if run.env_id == env_id))
    colors = {algo: f"C{i}" for i, algo in enumerate(dict.fromkeys(map(algorithm, scripts)))}
    for script in scripts:
        # the eager script dotted, a `_cpu` script beside a `_seeds` one dash-dotted, a script
        # with flags of its own dashed
        algo = algorithm(script)
        dashed = script.endswith("_cpu") and f"{algo}_seeds" in scripts
        flagged = " " in script
        style = ":" if script == algo else "-." if dashed else "--" if flagged else "-"
        color = colors[algo]
        done = [
            records[run.name]
            for run in plan
            if run.variant == script and run.env_id == env_id and run.name in records
        ]
        curves = [m["curve"] for record in done for m in members(record["summary"]) if m["curve"]]
        for index, curve in enumerate(curves):
            steps, _, returns = zip(*curve)
            label = script if index == 0 else None
            ax.plot(steps, plots.smooth(list(returns), 5), style, color=color, lw=1, label=label)
    for algo, color in colors.items():
        ref = REFERENCES.get((algo, env_id))
        if ref:
            label = f"CleanRL {algo}, {steps_text(ref.steps)} steps"
            ax.axhline(ref.mean, color=color, linestyle="--", linewidth=1.5, label=label)
            ax.axhspan(ref.mean - ref.std, ref.mean + ref.std, color=color, alpha=0.08)
    ax.set(xlabel="environment steps", ylabel="episodic return (training)")
    ax.set_title(f"{env_id}: one line per seed")
    ax.legend(fontsize=7)
    return figure


def report(plan, out_dir, set_name):
    """Write `<set>.md`, `<set>-readme.md`, `<set>.json` and `<set>-<env>.png` into `out_dir` from
    the summaries of `plan`'s runs that are done; returns the markdown."""
    records = {run.name: stored(out_dir / run.name) for run in plan}
    records = {name: record for name, record in records.items() if record}
    table = rows(plan, records)
    done = list(records.values())
    loads = [
        record["load_average"][end][0]
        for record in done
        if "load_average" in record
        for end in ("start", "end")
    ]
    timing = {
        "run_hours": sum(map(run_seconds, done)) / 3600,
        "first_start": min((record["started"] for record in done), default=None),
        "last_finish": max((record["finished"] for record in done), default=None),
        "load_average_1min": [min(loads), max(loads)] if loads else None,
    }
    cpus = sorted({record["cpu"] for record in done if record.get("cpu")})
    machine = machine_info() | ({"cpu": "; ".join(cpus)} if cpus else {})  # where the runs ran
    table_md = markdown(table, machine, timing)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{set_name}.md").write_text(table_md)
    (out_dir / f"{set_name}-readme.md").write_text(short_markdown(table))
    pending = [run.name for run in plan if run.name not in records]
    document = {
        "set": set_name,
        "machine": machine,
        "timing": timing,
        "table": table,
        "pending": pending,
    }
    (out_dir / f"{set_name}.json").write_text(json.dumps(document, indent=1) + "\n")
    for env_id in dict.fromkeys(run.env_id for run in plan):
        plots.save(curves_figure(env_id, plan, records), out_dir / f"{set_name}-{env_id}.png")
    return table_md


def parse_args(argv):
    parser, add = cli.parser("benchmarks.learning", __doc__)
    add("--set", choices=SETS, default="default", help="which runs (default: the default set)")
    add("--only", nargs="+", metavar="TEXT", help="run those whose name has one, in order")
    add("--jobs", type=int, default=1, help="runs at a time")
    add("--eval-episodes", type=int, default=10, help="evaluation episodes after each run")
    add("--timeout", type=float, default=4 * 3600, help="seconds one run may take")
    add("--threads", type=int, help="OMP_NUM_THREADS of every run (default: each script's own)")
    add("--report", action="store_true", help="only rebuild the report from the summaries present")
    add("--scripts-dir", type=Path, default=ROOT / "leanrl", help="where the scripts are")
    add("--out-dir", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    args = parser.parse_args(argv)
    for flag in ("jobs", "eval_episodes", "timeout", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    return args, parser


def lock(out_dir):
    """Hold an exclusive lock on `out_dir` for as long as this process lives, or None if another
    harness holds it (it would delete the folders of the runs in flight as partial ones)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def main(argv=None):
    """Run the set's runs that are not done, then write the report; returns the exit status."""
    args, parser = parse_args(argv)
    plan = selected = learning_set(args.set)
    if args.only:  # in the order of the texts: the longest runs can go first
        matching = [[run for run in plan if text in run.name] for text in args.only]
        selected = list(dict.fromkeys(run for runs in matching for run in runs))
        if not selected:
            parser.error(f"--only {' '.join(args.only)} matches no run of the set {args.set}")
    failed = []
    if not args.report:
        if lock(args.out_dir) is None:
            parser.error(
                f"--out-dir {args.out_dir}: another harness is running there (use --report to "
                "read it)"
            )
        todo = [run for run in selected if stored(args.out_dir / run.name) is None]
        note(
            f"{len(plan)} runs in the set, {len(plan) - len(todo)} done, {len(todo)} to run, "
            f"{args.jobs} at a time"
        )
        # runs the cleanup on the way out
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        try:
            failed = execute(todo, args)
        except KeyboardInterrupt:
            note("stopped by Ctrl-C: the runs in flight were killed; run the same command to go on")
            return 130
    print(report(plan, args.out_dir, args.set), end="")
    if failed:
        note(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
