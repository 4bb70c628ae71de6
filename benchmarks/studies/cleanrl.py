"""Ours beside CleanRL's own scripts, each at its defaults, on a shared budget: learning-phase sps
and their ratios, in one run, rounds alternating, on this machine's CPU (GPUs hidden).

    python -m benchmarks.studies.cleanrl --cleanrl ~/cleanrl  # a checkout of CleanRL (fe8d8a0)
    python -m benchmarks.studies.cleanrl --cleanrl ~/cleanrl --algos sac td3 --rounds 3
    python -m benchmarks.studies.cleanrl --cleanrl ~/cleanrl --quick  # tiny budgets, a smoke test
    python -m benchmarks.studies.cleanrl --cleanrl ~/cleanrl --algos pqn --variants cleanrl eager \
        cpu compile --rounds 4  # PQN, its twin's --compile too
    python -m benchmarks.studies.cleanrl --cleanrl ~/cleanrl --algos sac --variants cleanrl cpu \
        --budget env_id=HalfCheetah-v5 batch_size=128  # another env, a flag of both scripts

Variants: CleanRL's script, our eager script, our `_cpu` script (with `--bf16` where the CPU has
it); `--variants` adds `_cpu --threads 1|2`, `_cpu --bf16 --threads 2` and `compile`. Ours report
the SUMMARY's `sps`; CleanRL's print `SPS: int(step / elapsed)` at known steps, so elapsed(step) =
step / (SPS + 0.5) and the phase's sps is the steps between the first print after learning starts
(PPO: the third iteration) and the last, over the time between them. CleanRL's scripts, written for
gymnasium 0.29, run from a copy changed by the text substitutions in `patched` (none in the
algorithm). Writes benchmarks/results/cleanrl-<time>.{json,md} (or to --out-dir); a failed run exits
1.
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks import cli
from benchmarks.machine import machine_info
from benchmarks.report import machine_line, table, write_result
from benchmarks.run import BenchmarkError, failure, note
from benchmarks.scripts import SCRIPTS, load_script
from benchmarks.studies.seeds import read_summary

CLEANRL_COMMIT = "fe8d8a0"


@dataclass(frozen=True)
class Algo:
    """An algorithm: our script, CleanRL's file, the budget (flag: value) and a quick one."""

    name: str
    script: str
    cleanrl: str
    full: dict
    quick: dict


def actor_critic(name, script, learning_starts):
    full = dict(env_id="HalfCheetah-v4", total_timesteps=learning_starts + 3000)
    quick = dict(env_id="HalfCheetah-v4", total_timesteps=1300, learning_starts=1000)
    return Algo(name, script, script, full | dict(learning_starts=learning_starts), quick)


ALGOS = (
    actor_critic("sac", "sac_continuous_action", 5000),
    actor_critic("td3", "td3_continuous_action", 25000),
    Algo(
        "ppo",
        "ppo_continuous_action",
        "ppo_continuous_action",
        dict(env_id="HalfCheetah-v4", total_timesteps=20480, num_steps=2048),
        dict(env_id="HalfCheetah-v4", total_timesteps=2048, num_steps=256),
    ),
    Algo(
        "dqn",
        "dqn",
        "dqn",
        dict(env_id="CartPole-v1", total_timesteps=30000, learning_starts=10000),
        dict(env_id="CartPole-v1", total_timesteps=1500, learning_starts=1000),
    ),
    Algo(
        "pqn",
        "pqn",
        "pqn",
        dict(env_id="CartPole-v1", total_timesteps=51200, num_envs=4, num_steps=128),
        dict(env_id="CartPole-v1", total_timesteps=3072, num_envs=4, num_steps=128),
    ),
)
# variant -> (our script's suffix, its flags); "cleanrl" is CleanRL's script
VARIANTS = {
    "cleanrl": None,
    "eager": ("", ()),
    "cpu": ("_cpu", ()),
    "cpu --bf16": ("_cpu", ("--bf16",)),
    "cpu --threads 1": ("_cpu", ("--threads", "1")),
    "cpu --threads 2": ("_cpu", ("--threads", "2")),
    "cpu --bf16 --threads 2": ("_cpu", ("--bf16", "--threads", "2")),
    "compile": ("_torchcompile", ("--compile",)),
}
DEFAULT_VARIANTS = ("cleanrl", "eager", "cpu", "cpu --bf16")
BF16_ALGOS = ("sac", "td3")  # PPO's and DQN's networks are too small for bfloat16 to pay
# left out of every run's environment: each script runs on its own default threads
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

COMPAT = """
class SummaryWriter:  # tensorboard left out: every call does nothing
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def final_infos(infos):  # gymnasium 1.x's vector info as one info per env (None: no episode)
    final = infos["final_info"]
    ended = final.get("_episode", [])
    episode = final.get("episode", {})
    return [
        {"episode": {k: v[i] for k, v in episode.items()}} if e else None
        for i, e in enumerate(ended)
    ]
"""
OFF_POLICY = ("sac_continuous_action", "td3_continuous_action", "dqn")
# (CleanRL's files, text, its replacement)
PATCHES = (
    (None, "from torch.utils.tensorboard import SummaryWriter\n", COMPAT),
    (
        None,
        "gym.vector.SyncVectorEnv(",
        "gym.vector.SyncVectorEnv(autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, env_fns=",
    ),
    (None, 'for info in infos["final_info"]:', "for info in final_infos(infos):"),
    (OFF_POLICY, 'infos["final_observation"]', 'infos["final_obs"]'),
    (
        ("ppo_continuous_action",),
        "lambda obs: np.clip(obs, -10, 10))",
        "lambda obs: np.clip(obs, -10, 10), env.observation_space)",
    ),
)


def patched(name, source):
    """CleanRL's `name`.py `source` with PATCHES applied."""
    for files, old, new in PATCHES:
        if files is not None and name not in files:
            continue
        if source.count(old) != 1:
            raise BenchmarkError(
                f"CleanRL's {name}.py has {source.count(old)} of {old.strip()!r}, expected one: "
                f"is the checkout at {CLEANRL_COMMIT}?"
            )
        source = source.replace(old, new)
    return source


def cleanrl_copy(checkout, names, into):
    """CleanRL's scripts `names`, patched, and its `cleanrl_utils` in folder `into`."""
    shutil.copytree(Path(checkout) / "cleanrl_utils", Path(into) / "cleanrl_utils")
    (Path(into) / "cleanrl").mkdir()
    for name in names:
        source = (Path(checkout) / "cleanrl" / f"{name}.py").read_text()
        (Path(into) / "cleanrl" / f"{name}.py").write_text(patched(name, source))


def flags(budget):
    return [word for k, v in budget.items() for word in (f"--{k.replace('_', '-')}", str(v))]


def print_steps(budget):
    """The steps at which CleanRL's script prints `SPS:`."""
    if "num_steps" in budget:
        iteration = budget["num_steps"] * budget.get("num_envs", 1)
        return range(iteration, budget["total_timesteps"] + 1, iteration)
    first = (budget["learning_starts"] // 100 + 1) * 100
    return range(first, budget["total_timesteps"], 100)


def cleanrl_sps(stdout, budget, burnin=3):
    """CleanRL's learning-phase sps from its printed `SPS:` lines (module docstring), from the first
    print after learning starts (PPO: after `burnin` iterations) to the last, and its whole run's
    (the last print's). None where the prints are not those of the budget."""
    printed = [int(sps) for sps in re.findall(r"^SPS: (\d+)$", stdout, re.MULTILINE)]
    steps = print_steps(budget)
    if len(printed) != len(steps) or min(printed, default=0) <= 0:
        return None
    first = burnin - 1 if "num_steps" in budget else 0
    if first >= len(steps) - 1:
        return None
    (s0, sps0), (s1, sps1) = (steps[first], printed[first]), (steps[-1], printed[-1])
    return (s1 - s0) / (s1 / (sps1 + 0.5) - s0 / (sps0 + 0.5)), sps1 + 0.5


def command(algo, variant, budget, cleanrl_dir):
    if variant == "cleanrl":
        script = Path(cleanrl_dir) / "cleanrl" / f"{algo.cleanrl}.py"
        return [sys.executable, str(script), *flags(budget)]
    suffix, extra = VARIANTS[variant]
    return [sys.executable, str(SCRIPTS / f"{algo.script}{suffix}.py"), *flags(budget), *extra]


def measure_one(algo, variant, budget, cleanrl_dir, timeout, cwd):
    """One run's learning-phase sps, its whole run's, and the threads our script ended on (None:
    CleanRL's)."""
    cmd = command(algo, variant, budget, cleanrl_dir)
    # CleanRL's imports find cleanrl_utils; no GPU for anyone; each script's own threads
    env = dict(os.environ, PYTHONPATH=str(cleanrl_dir), CUDA_VISIBLE_DEVICES="")
    for name in THREAD_VARIABLES:
        env.pop(name, None)
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
        )
    except subprocess.TimeoutExpired:
        raise failure(cmd, f"ran past the {timeout} s timeout") from None
    if proc.returncode != 0:
        raise failure(cmd, f"exited with status {proc.returncode}", proc.stderr)
    if variant != "cleanrl":
        summary = read_summary(cmd, proc)
        # a script without --threads runs on torch's default ones
        threads = summary.get("threads")
        return dict(sps=summary["sps"], sps_run=summary["sps_wall"], threads=threads)
    sps = cleanrl_sps(proc.stdout, budget)
    if sps is None:
        raise failure(cmd, f"printed other SPS lines than {list(print_steps(budget))}'s")
    return dict(sps=sps[0], sps_run=sps[1], threads=None)


def has_script(algo, variant):
    """Whether `algo` has the script `variant` runs (CleanRL's is in the checkout)."""
    return variant == "cleanrl" or (SCRIPTS / f"{algo.script}{VARIANTS[variant][0]}.py").exists()


def plan(algos, variants):
    """(algo, variant) of one round, in order; `--bf16` only for SAC and TD3, and only where this
    CPU computes bfloat16 natively (a note otherwise); a variant only where its script exists."""
    bf16 = load_script("threads").bf16_native()
    for variant in (v for v in variants if "--bf16" in v and not bf16):
        note(f"skipping {variant}: this CPU computes no bfloat16 natively")
    runs = []
    for algo in algos:
        for variant in variants:
            if not has_script(algo, variant):
                note(f"skipping {algo.name} {variant}: it has no such script")
            elif "--bf16" not in variant or (bf16 and algo.name in BF16_ALGOS):
                runs.append((algo, variant))
    return runs


def budget_value(text):
    """A `--budget` value: an integer where it is one (the steps the prints are read at)."""
    return int(text) if text.lstrip("-").isdigit() else text


def measure(algos, variants, rounds, budgets, checkout, timeout):
    """{algo: {variant: [run, ...]}} (`measure_one`'s): every round runs each (algo, variant) on
    its algorithm's budget of `budgets`."""
    results = {}
    runs = plan(algos, variants)
    with tempfile.TemporaryDirectory(prefix="cleanrl-") as tmp:
        cleanrl_dir = Path(tmp) / "checkout"
        cleanrl_copy(checkout, sorted({algo.cleanrl for algo in algos}), cleanrl_dir)
        for round_ in range(rounds):
            for algo, variant in runs:
                budget = budgets[algo.name]
                run = measure_one(algo, variant, budget, cleanrl_dir, timeout, tmp)
                note(f"round {round_ + 1}: {algo.name} {variant}: {run['sps']:.0f} sps")
                results.setdefault(algo.name, {}).setdefault(variant, []).append(run)
    return results


def rows(results):
    """One row per algorithm and variant: the median learning-phase sps, its range and its ratio to
    CleanRL's; the same ratio of the whole runs' medians; the threads our runs ended on."""
    table = []
    for algo, variants in results.items():
        medians = {
            v: {k: statistics.median(r[k] for r in runs) for k in ("sps", "sps_run")}
            for v, runs in variants.items()
        }
        cleanrl = medians["cleanrl"]
        for variant, runs in variants.items():
            sps = [run["sps"] for run in runs]
            row = dict(algo=algo, variant=variant, sps=medians[variant]["sps"])
            row |= dict(min=min(sps), max=max(sps), vs_cleanrl=row["sps"] / cleanrl["sps"])
            row["run_vs_cleanrl"] = medians[variant]["sps_run"] / cleanrl["sps_run"]
            row["threads"] = sorted({run["threads"] for run in runs if run["threads"]})
            table.append(row)
    return table


def markdown(result):
    settings = result["settings"]
    lines = [
        f"{machine_line(result['machine'])}; CleanRL {settings['cleanrl_commit']}; "
        f"{settings['rounds']} alternating round(s), {settings['budget']} budgets, medians of "
        "learning-phase sps.",
        "",
    ]
    rows = [
        f"{r['algo']} | {r['variant']} | {r['sps']:.0f} | {r['min']:.0f}-{r['max']:.0f} | "
        f"{r['vs_cleanrl']:.2f}x | {r['run_vs_cleanrl']:.2f}x | "
        + (" ".join(map(str, r["threads"])) or "torch's default")
        for r in result["rows"]
    ]
    header = "algo | variant | sps | min-max | vs CleanRL | whole run vs CleanRL | threads"
    return "\n".join(lines + table(header, rows, "llrrrrl")) + "\n"


def checkout_commit(checkout):
    """The commit of a CleanRL git checkout, or None (a plain copy)."""
    cmd = ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"]
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip() or None


def parse_args(argv):
    parser, add = cli.parser("benchmarks.studies.cleanrl", __doc__, "--out-dir")
    add("--cleanrl", type=Path, required=True, help="a checkout of CleanRL")
    add("--algos", nargs="+", default=[algo.name for algo in ALGOS])
    add("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    add("--rounds", type=int, default=2)
    add("--quick", action="store_true", help="tiny budgets: a smoke test")
    add("--timeout", type=float, default=1800, help="seconds for one run")
    changed = "flags of every run's budget changed or added, e.g. env_id=Hopper-v5 batch_size=128"
    add("--budget", nargs="+", default=[], metavar="FLAG=VALUE", help=changed)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    names = [algo.name for algo in ALGOS]
    variants = set(args.variants)
    if set(args.algos) - set(names) or variants - set(VARIANTS) or "cleanrl" not in variants:
        print(f"error: --algos must name {names}, --variants {list(VARIANTS)}", file=sys.stderr)
        sys.exit(2)
    if args.rounds < 1 or not (args.cleanrl / "cleanrl").is_dir():
        print("error: --cleanrl must be a CleanRL checkout, --rounds >= 1", file=sys.stderr)
        sys.exit(2)
    if any("=" not in flag for flag in args.budget):
        print("error: --budget takes FLAG=VALUE, e.g. env_id=Hopper-v5", file=sys.stderr)
        sys.exit(2)
    changed = {k: budget_value(v) for k, v in (flag.split("=", 1) for flag in args.budget)}
    algos = [algo for algo in ALGOS if algo.name in args.algos]
    budgets = {algo.name: (algo.quick if args.quick else algo.full) | changed for algo in algos}
    started = datetime.now()
    try:
        results = measure(algos, args.variants, args.rounds, budgets, args.cleanrl, args.timeout)
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    settings = dict(rounds=args.rounds, budget="quick" if args.quick else "full", budgets=budgets)
    commit = checkout_commit(args.cleanrl) or "unknown"
    settings |= dict(cleanrl_commit=commit, started=started.isoformat())
    result = dict(machine=machine_info(), settings=settings, results=results, rows=rows(results))
    paths = write_result(result, args.out_dir, f"cleanrl-{started:%Y%m%d-%H%M%S}", markdown)
    cli.conclude(markdown(result), paths)


if __name__ == "__main__":
    main()
