"""The whole GPU path in one command: every graphed function, every graphed script, the speed-ups,
each beside the speed of its env alone on the same machine (docs/cuda.md).

    python -m benchmarks.gpu_check                        # everything that fits 8 minutes
    python -m benchmarks.gpu_check --only tests smoke     # some parts
    python -m benchmarks.gpu_check --algos ppo_lstm ppo_atari_envpool  # some algorithms' checks
    python -m benchmarks.gpu_check --minutes 5 --jobs 4
    python -m benchmarks.gpu_check --call 1  # a 15-minute lease: tests, smoke and learning
    python -m benchmarks.gpu_check --call 2  # then the timed parts, sps and seeds

Parts, in order: `tests` (`pytest -m cuda`, tests/test_fresh_noise.py first); `smoke` (every
optimized twin, the torchrun and async Atari scripts and every seeds script with `--compile
--cudagraphs`, at the budgets the timed parts run, so that these find their kernels compiled);
`learning` (each twin graphed at its learning test's budget, seed and bar); `sps` (per algorithm
its env alone, eager, `--compile` and `--compile --cudagraphs` at `benchmarks.run`'s quick budget,
LeanRL's H100 ratios beside); `seeds` (N = 1, 8, 64 members, graphed, beside their env alone).
Each part has a share of `--minutes` (SHARES) and ends by the sum of the shares up to it; the first
three run together, `--jobs` at a time, the timed ones alone. A check that cannot start in time is
not run, one cut short is stopped. Writes gpu_check.md and gpu_check.json to a new folder under
`--out-dir`. Exit status 0 when every check passed, 1 otherwise, 2 without a CUDA device.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import torch

from benchmarks import cli, registry
from benchmarks.machine import machine_info
from benchmarks.report import machine_line, optional, table
from benchmarks.run import BenchmarkError, env_limit_command, parse_summary, result_line
from benchmarks.scripts import SCRIPTS
from benchmarks.studies import seeds

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "smoke", "learning", "sps", "seeds")
PARALLEL_PARTS = ("tests", "smoke", "learning")
CALLS = {1: ("tests", "smoke", "learning"), 2: ("sps", "seeds")}  # a 15-minute lease's two calls
CALL_MINUTES = 8.5
# each part's share of --minutes; the parallel parts run within the sum of theirs
SHARES = {"tests": 0.25, "smoke": 0.2, "learning": 0.1, "sps": 0.25, "seeds": 0.2}
MIN_START_S = 10  # a check starts only with this much of its part's time left
ENV_SECONDS = 2.0  # how long each env-only check steps its env, after a warm-up
ENV_ONLY = "env only"
STATUSES = ("passed", "failed", "stopped", "not run")
TIMED = ("eager", "compile", "compile+cudagraphs")
# LeanRL's published H100 speed-ups of `--compile --cudagraphs` over its eager scripts
LEANRL_H100 = {"ppo_atari_envpool": 6.8, "ppo_continuous_action": 2.7, "sac": 5.7, "td3": 3.4}
# test files whose CUDA tests run in one pytest each (test_fresh_noise.py is split by script)
CUDA_TEST_FILES = tuple(
    f"test_{name}.py"
    for name in "contract cuda_path dqn ppo_continuous_action ppo_atari_envpool".split()
    + "ppo_atari_envpool_async ppo_lstm ppo_mingru pqn pqn_atari_envpool resume".split()
    + ["mujoco_envs"]
)
# scripts beyond the twins that record functions, with the registry algorithm whose budget they run
# (Ray's learner records only its update, which draws no random numbers: it needs a Ray cluster)
SCALED = {
    "ppo_continuous_action_distributed": "ppo_continuous_action",
    "ppo_atari_envpool_async": "ppo_atari_envpool",
}
# algorithm -> the learning test's flags and bar on the last-20 mean return (tests/test_<script>.py,
# e.g. test_sac_continuous_action.py)
PENDULUM = ("--env-id", "Pendulum-v1", "--learning-starts", "1000")
LEARNING = {
    "sac": ((*PENDULUM, "--total-timesteps", "8000"), -400),
    "td3": ((*PENDULUM, "--total-timesteps", "10000"), -700),
    "ppo_continuous_action": (
        ("--env-id", "InvertedPendulum-v4", "--total-timesteps", "40960"),
        500,
    ),
    "dqn": (("--env-id", "CartPole-v1", "--total-timesteps", "60000"), 80),
    "pqn": (("--env-id", "CartPole-v1", "--total-timesteps", "122880"), 50),
}
SEEDS_MEMBERS = (1, 8, 64)
COMPILE_CUDAGRAPHS = ("--compile", "--cudagraphs")


@dataclass
class Check:
    """One command and what it found: `status` is passed, failed, stopped (its part's time ended
    first) or not run; `value` the measured sps or return where the check has one. `algo` is the
    registry algorithm whose script it runs (None for a test file of several), `variant` a timed
    check's column (`TIMED` or `ENV_ONLY`), `members` a seeds check's N."""

    part: str
    name: str
    cmd: list
    cap_s: float
    algo: str | None = None
    variant: str | None = None
    members: int | None = None
    status: str = "not run"
    seconds: float = 0.0
    detail: str = ""
    value: float | None = None
    summary: dict = field(default_factory=dict)


def script_cmd(stem, *flags):
    return [sys.executable, str(SCRIPTS / f"{stem}.py"), *flags]


def algo(name):
    return next(a for a in registry.ALGOS if a.name == name)


def owner(stem):
    """The registry algorithm whose scripts include `stem`, or None."""
    mine = [a for a in registry.ALGOS if stem.startswith(a.eager)]
    return max(mine, key=lambda a: len(a.eager)).name if mine else None


def graphed_runs():
    """Each script that records functions and the budget flags of its short run."""
    runs = {a.twin: a.quick for a in registry.ALGOS}
    runs |= {stem: algo(name).quick for stem, name in SCALED.items()}
    return runs | {a.script: a.quick for a in seeds.ALGOS}


def seeds_cmd(seeds_algo, members):
    return seeds.seeds_command(seeds_algo, SCRIPTS, members, True, COMPILE_CUDAGRAPHS)


def seeds_env_cmd(seeds_algo, members):
    """The command that times the env of a seeds script's `members` members alone."""
    env_limit = [sys.executable, "-m", "benchmarks.env_limit", "--seconds", str(ENV_SECONDS)]
    script = str(SCRIPTS / f"{seeds_algo.script}.py")
    return [*env_limit, script, *seeds_algo.quick, "--num-seeds", str(members)]


def cuda_test_checks():
    # -n 0: one process, one file a check, as the plan timed it, without two workers' start
    pytest = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    pytest += ["-n", "0"]
    fresh = str(ROOT / "tests" / "test_fresh_noise.py")
    for stem in graphed_runs():
        cmd = [*pytest, fresh, "-k", f"graphed_functions and {stem}"]
        yield Check("tests", f"fresh noise: {stem}", cmd, 300, owner(stem))
    cmd = [*pytest, fresh, "-k", "graphed_updates"]
    yield Check("tests", "graphed updates = eager updates", cmd, 300)
    for name in CUDA_TEST_FILES:
        cmd = [*pytest, str(ROOT / "tests" / name)]
        yield Check("tests", name, cmd, 300, owner(name.removeprefix("test_")))


def smoke_checks():
    seeds_scripts = {a.script: a for a in seeds.ALGOS}
    for stem, flags in graphed_runs().items():
        if stem in seeds_scripts:  # each N of the `seeds` part: its kernels compiled beforehand
            for n in SEEDS_MEMBERS:
                cmd = seeds_cmd(seeds_scripts[stem], n)
                yield Check("smoke", f"{stem} N={n}", cmd, 240, owner(stem), members=n)
        else:
            cmd = script_cmd(stem, *flags, *COMPILE_CUDAGRAPHS)
            yield Check("smoke", stem, cmd, 240, owner(stem))


def learning_checks():
    for name, (flags, bar) in LEARNING.items():
        cmd = script_cmd(algo(name).twin, *flags, "--seed", "1", *COMPILE_CUDAGRAPHS)
        yield Check("learning", f"{name} > {bar}", cmd, 300, name)


def sps_checks():
    """Per algorithm: its env alone, then each timed variant."""
    variants = [v for v in registry.VARIANTS if v.name in TIMED]
    for a in registry.ALGOS:
        cmd = env_limit_command(a, SCRIPTS, True, 1, ENV_SECONDS)
        yield Check("sps", f"{a.name} {ENV_ONLY}", cmd, 60, a.name, ENV_ONLY)
        for v in variants:
            cmd = script_cmd(a.script(v), *a.quick, "--seed", "1", *v.flags)
            yield Check("sps", f"{a.name} {v.name}", cmd, 120, a.name, v.name)


def seeds_checks():
    """Per seeds script and N: its env of N members alone, then the script."""
    for a in seeds.ALGOS:
        for n in SEEDS_MEMBERS:
            env = seeds_env_cmd(a, n)
            yield Check("seeds", f"{a.name} N={n} {ENV_ONLY}", env, 60, a.name, ENV_ONLY, n)
            cmd = seeds_cmd(a, n)
            yield Check("seeds", f"{a.name} N={n}", cmd, 120, a.name, TIMED[-1], n)


PLANS = dict(tests=cuda_test_checks, smoke=smoke_checks, learning=learning_checks)
PLANS |= dict(sps=sps_checks, seeds=seeds_checks)


def plan(parts, algos=None):
    """The checks of `parts`, in the order they start."""
    checks = [check for part in PARTS if part in parts for check in PLANS[part]()]
    return [c for c in checks if algos is None or c.algo in algos]


def deadlines(parts, minutes):
    """Seconds from the start by which each of `parts` ends."""
    total = sum(SHARES[p] for p in parts)
    ends, spent = {}, 0.0
    for phase in (PARALLEL_PARTS, ("sps",), ("seeds",)):
        mine = [p for p in phase if p in parts]
        spent += 60 * minutes * sum(SHARES[p] for p in mine) / total
        ends |= dict.fromkeys(mine, spent)
    return ends


def judge(check, proc):
    """Fill in `check` from its finished process."""
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    if check.part == "tests":
        check.status = "passed" if proc.returncode == 0 else "failed"
        check.detail = tail[-1] if tail else ""
        return
    if proc.returncode != 0:
        check.status = "failed"
        check.detail = f"exit status {proc.returncode}: {' / '.join(tail[-3:])}"
        return
    try:
        if check.variant == ENV_ONLY:
            limit = result_line(check.cmd, proc, "ENV_ONLY")
            check.status, check.value = "passed", limit["sps"]
            check.detail = f"{limit['num_envs']} x {limit['env_id']}"
            return
        read = seeds.read_summary if check.members else parse_summary
        summary = read(check.cmd, proc)
    except BenchmarkError as error:
        check.status, check.detail = "failed", str(error).splitlines()[0]
        return
    check.summary = {key: value for key, value in summary.items() if key not in ("curve", "curves")}
    graphed = "--cudagraphs" in check.cmd
    device = str(summary.get("device"))
    on_cuda = device.startswith("cuda") and summary.get("cudagraphs") == graphed
    check.value = summary["return_mean"] if check.part == "learning" else summary["sps"]
    bar = LEARNING[check.algo][1] if check.part == "learning" else None
    learned = bar is None or (check.value is not None and check.value > bar)
    check.status = "passed" if on_cuda and learned else "failed"
    check.detail = f"device {device}, return {optional(summary.get('return_mean'), '.1f')}"


def execute(check, deadline, cwd, env=None):
    """Run `check` unless its part's `deadline` (time.monotonic) is less than MIN_START_S away,
    `env` added to its environment: the scripts in `cwd`, pytest and the env-only checks in the
    repository. It may run until the sooner of its cap and the deadline."""
    left = deadline - time.monotonic()
    if left < MIN_START_S:
        check.detail = "no time left in its part's share"
        return check
    timeout = min(check.cap_s, left)
    started = time.monotonic()
    try:
        in_repo = check.part == "tests" or check.variant == ENV_ONLY
        env = os.environ | (env or {})
        options = dict(capture_output=True, text=True, timeout=timeout, env=env)
        proc = subprocess.run(check.cmd, cwd=ROOT if in_repo else cwd, **options)
    except subprocess.TimeoutExpired:
        check.status = "failed" if timeout == check.cap_s else "stopped"
        why = "its cap" if check.status == "failed" else "its part's share ended"
        check.detail = f"ran past {timeout:.0f} s: {why}"
    else:
        judge(check, proc)
    check.seconds = time.monotonic() - started
    note = f"[{check.part}] {check.name}: {check.status} ({check.seconds:.0f} s)"
    print(note, file=sys.stderr, flush=True)
    return check


def run_checks(checks, minutes, jobs, cwd):
    """The parallel parts, `jobs` at a time, then the timed ones alone, each by its deadline."""
    start = time.monotonic()
    ends = deadlines({c.part for c in checks}, minutes)
    # the learning runs are the longest: they start first, beside the first tests
    parallel = [c for c in checks if c.part in PARALLEL_PARTS]
    parallel.sort(key=lambda c: c.part != "learning")
    # each process its share of the cores
    threads = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda c: execute(c, start + ends[c.part], cwd, threads), parallel))
    for check in checks:
        if check.part not in PARALLEL_PARTS:
            execute(check, start + ends[check.part], cwd)
    return checks


def cells(checks, part):
    """Per row of the timed `part` (an algorithm, or an algorithm and N)."""
    rows = {}
    for c in checks:
        if c.part == part:
            row = dict(algo=c.algo, members=c.members, sps={}, status={})
            row = rows.setdefault((c.algo, c.members), row)
            row["sps"][c.variant] = c.value if c.status == "passed" else None
            row["status"][c.variant] = c.status
    return list(rows.values())


def ratio(a, b):
    return a / b if a is not None and b else None


def speed_rows(checks):
    """Per algorithm: its env-only sps, the sps of each variant, their ratios to eager and of the
    graphed twin to the env alone, LeanRL's H100 ratio."""
    rows = []
    for row in cells(checks, "sps"):
        sps, env = row["sps"], row["sps"].pop(ENV_ONLY, None)
        del row["members"]
        row["env_only_sps"] = env
        row["compile_vs_eager"] = ratio(sps.get("compile"), sps.get("eager"))
        row["graphs_vs_eager"] = ratio(sps.get("compile+cudagraphs"), sps.get("eager"))
        row["graphs_vs_env_only"] = ratio(sps.get("compile+cudagraphs"), env)
        row["leanrl_h100"] = LEANRL_H100.get(row["algo"])
        rows.append(row)
    return rows


def seeds_rows(checks):
    """Per seeds script and N: its aggregate sps, its env's alone, the ratio."""
    rows = []
    for row in cells(checks, "seeds"):
        sps, env = row["sps"].get(TIMED[-1]), row["sps"].get(ENV_ONLY)
        row |= {"sps": sps, "env_only_sps": env, "vs_env_only": ratio(sps, env)}
        rows.append(row)
    return rows


def parts_rows(checks, minutes):
    """Per part that has checks: its share of `minutes`, when it had to end, and how many of its
    checks passed, failed, were stopped or did not run."""
    ends = deadlines({c.part for c in checks}, minutes)
    total = sum(SHARES[p] for p in ends)
    rows = []
    for part in (p for p in PARTS if p in ends):
        mine = [c.status for c in checks if c.part == part]
        row = {"part": part, "share": SHARES[part] / total, "ends_s": ends[part]}
        rows.append(row | {"checks": len(mine)} | {s: mine.count(s) for s in STATUSES})
    return rows


def unfinished(parts):
    """One line naming each part with checks that did not run to their end for lack of time."""
    counts = [(r["part"], r["stopped"] + r["not run"], r["checks"]) for r in parts]
    short = [f"{part} {count} of {checks}" for part, count, checks in counts if count]
    if not short:
        return "Every check ran to its end."
    return f"Stopped or not run for lack of time: {', '.join(short)} checks."


def measured(value, status):
    """A timed cell: the sps, or why there is none (n/a: not in the plan)."""
    return f"{value:.0f}" if value is not None else status or "n/a"


def markdown(result):
    """The report: machine, settings, each part and check, the speed and seeds tables."""
    settings = result["settings"]
    selection = f"parts: {', '.join(settings['parts'])}; algorithms: "
    selection += ", ".join(settings["algos"] or ["all"])
    if settings.get("call"):
        selection += f"; call {settings['call']} of the two of a 15-minute lease"
    parts = [
        [r["part"], f"{r['share']:.0%}", f"{r['ends_s']:.0f}", str(r["checks"])]
        + [str(r[s]) for s in STATUSES]
        for r in result["parts"]
    ]
    checks = [
        [c["part"], c["name"], c["status"], f"{c['seconds']:.0f}", c["detail"].replace("|", "/")]
        for c in result["checks"]
    ]
    speed = []
    for r in result["speed"]:
        status = r["status"].get
        cells = [r["algo"], measured(r["env_only_sps"], status(ENV_ONLY))]
        cells += [measured(r["sps"].get(v), status(v)) for v in TIMED]
        ratios = ("compile_vs_eager", "graphs_vs_eager", "graphs_vs_env_only")
        cells += [optional(r[key], ".2f", "x") for key in ratios]
        speed.append(cells + [optional(r["leanrl_h100"], ".1f", "x")])
    seeds_table = [
        [r["algo"], str(r["members"]), measured(r["sps"], r["status"].get(TIMED[-1]))]
        + [measured(r["env_only_sps"], r["status"].get(ENV_ONLY))]
        + [optional(r["vs_env_only"], ".2f", "x")]
        for r in result["seeds"]
    ]
    speed_header = ["algo", "env-only sps", *(f"{v} sps" for v in TIMED), "compile / eager"]
    speed_header += ["compile+cudagraphs / eager", "compile+cudagraphs / env only", "LeanRL H100"]
    seeds_header = (
        "seeds script, `--compile --cudagraphs` | N | sps | env-only sps | sps / env only"
    )
    lines = [
        f"# GPU check, {result['started']}",
        "",
        machine_line(result["machine"]),
        f"`--minutes {settings['minutes']:g} --jobs {settings['jobs']}`; {selection}.",
        f"Total: {result['seconds']:.0f} s; {result['passed']} of {len(result['checks'])} passed.",
        unfinished(result["parts"]),
        "",
        *table(["part", "share", "ends at (s)", "checks", *STATUSES], parts, "lrrrrrrr"),
        "",
        *table(["part", "check", "result", "seconds", "detail"], checks, "lllrl"),
        "",
        "Env only: the script's env at the same budget, stepped with random actions on this",
        "machine's CPU. A twin near its env-only sps is bound by its env, not by its policy.",
        "",
        *table(speed_header, speed, "l" + "r" * 8),
        "",
        *table(seeds_header, seeds_table, "lrrrr"),
    ]
    return "\n".join(lines) + "\n"


def report(checks, machine, started, seconds, settings):
    """The JSON document of a check: its settings (`minutes`, `jobs`, `parts`, `algos`), each part's
    time and outcome, its checks, the speed and seeds tables, the machine."""
    result = dict(started=started, seconds=seconds, machine=machine, settings=settings)
    result |= dict(passed=sum(c.status == "passed" for c in checks), speed=speed_rows(checks))
    result |= dict(parts=parts_rows(checks, settings["minutes"]), seeds=seeds_rows(checks))
    return result | {"checks": [asdict(c) for c in checks]}


def write(result, out_dir):
    """gpu_check.md and gpu_check.json in `out_dir`; returns the folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "gpu_check.md").write_text(markdown(result))
    return out_dir


def parse_args(argv):
    parser, add = cli.parser("benchmarks.gpu_check", __doc__, "--out-dir")
    add("--only", nargs="+", choices=PARTS, default=list(PARTS), help="parts")
    names = [a.name for a in registry.ALGOS]
    add("--algos", nargs="+", choices=names, help="only these algorithms' scripts (default: all)")
    add("--minutes", type=float, help="the check ends within this (default 8)")
    add("--call", type=int, choices=sorted(CALLS), help="one call of a 15-minute lease: its parts")
    add("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    args = parser.parse_args(argv)
    if args.call:
        args.only = list(CALLS[args.call])
    args.minutes = args.minutes or (CALL_MINUTES if args.call else 8.0)
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check needs a CUDA device and torch sees none", file=sys.stderr)
        return 2
    started, start = datetime.now(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-runs-") as cwd:  # the scripts' runs/ folders
        checks = run_checks(plan(args.only, args.algos), args.minutes, args.jobs, cwd)
    seconds = time.monotonic() - start
    settings = {"minutes": args.minutes, "jobs": args.jobs, "parts": args.only, "algos": args.algos}
    settings["call"] = args.call
    started_text = started.isoformat(timespec="seconds")
    result = report(checks, machine_info(), started_text, seconds, settings)
    folder = write(result, args.out_dir / f"gpu_check-{started:%Y%m%d-%H%M%S}")
    print(folder)
    return 0 if result["passed"] == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
