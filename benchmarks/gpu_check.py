"""The whole GPU path in one command: every graphed function, every graphed script, the speed-ups.

    python -m benchmarks.gpu_check                        # everything, within 8 minutes
    python -m benchmarks.gpu_check --only tests smoke     # some parts
    python -m benchmarks.gpu_check --minutes 5 --jobs 4

Parts, in the order they run:
- `tests`: the CUDA tests (`pytest -m cuda`), tests/test_fresh_noise.py first (fresh noise in every
  graphed function that samples, the graphed updates against the eager ones), one pytest per script
  or file, several at a time.
- `smoke`: every optimized twin, the torchrun and async Atari scripts, and every seeds script (at
  each N of the `seeds` part) with `--compile --cudagraphs` for a short run, which must reach its
  SUMMARY on CUDA. They run the budgets of `sps` and `seeds`, so that the timed runs that follow
  find their kernels compiled on disk (inductor's caches).
- `learning`: one run per algorithm of the twin with `--compile --cudagraphs` at the budget, seed
  and bar of that algorithm's learning test.
- `sps`: each algorithm's eager script, twin with `--compile` and twin with `--compile
  --cudagraphs` at the quick budget of `benchmarks.run`, one run at a time, LeanRL's published H100
  ratios beside.
- `seeds`: each seeds script's aggregate sps at N = 1, 8 and 64 members with `--cudagraphs` (and
  `--compile`, the seeds scripts' default), one run at a time.

The first three parts run `--jobs` processes at a time (the learning runs first, the longest), each
with its share of the cores, and must end within 55% of `--minutes`; the timed parts then run
alone. A check that cannot start or finish in its time is reported as not run
or failed, so that the command ends within `--minutes`. It writes gpu_check.md and gpu_check.json
to a new folder under `--out-dir` and prints the folder. Exit status 0 when every check passed, 1
otherwise, 2 without a CUDA device.
"""

import argparse
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

from benchmarks import registry
from benchmarks.machine import machine_info
from benchmarks.report import machine_line, optional
from benchmarks.run import BenchmarkError, parse_summary
from benchmarks.scripts import SCRIPTS
from benchmarks.studies import seeds

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "smoke", "learning", "sps", "seeds")
PARALLEL_PARTS = ("tests", "smoke", "learning")
PARALLEL_SHARE = 0.55
# LeanRL's published H100 speed-ups of `--compile --cudagraphs` over its eager scripts
LEANRL_H100 = {"ppo_atari_envpool": 6.8, "ppo_continuous_action": 2.7, "sac": 5.7, "td3": 3.4}
# scripts whose CUDA tests live in one pytest run each (test_fresh_noise.py is split by script)
CUDA_TEST_FILES = (
    "test_contract.py",
    "test_cuda_path.py",
    "test_dqn.py",
    "test_ppo_continuous_action.py",
    "test_ppo_atari_envpool.py",
    "test_ppo_atari_envpool_async.py",
    "test_ppo_lstm.py",
    "test_ppo_mingru.py",
    "test_pqn.py",
    "test_pqn_atari_envpool.py",
    "test_resume.py",
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
    """One command and what it found: `status` is passed, failed or not run; `value` the measured
    sps or return where the check has one."""

    part: str
    name: str
    cmd: list
    cap_s: float
    status: str = "not run"
    seconds: float = 0.0
    detail: str = ""
    value: float | None = None
    summary: dict = field(default_factory=dict)


def script_cmd(stem, *flags):
    return [sys.executable, str(SCRIPTS / f"{stem}.py"), *flags]


def algo(name):
    return next(a for a in registry.ALGOS if a.name == name)


def graphed_runs():
    """Each script that records functions and the budget flags of its short run: the twins and the
    scripts grown from them at `benchmarks.run`'s quick budget, the seeds scripts at
    `benchmarks.studies.seeds`' quick budget (without `--num-seeds`)."""
    runs = {a.twin: a.quick for a in registry.ALGOS}
    runs |= {stem: algo(name).quick for stem, name in SCALED.items()}
    return runs | {a.script: a.quick for a in seeds.ALGOS}


def seeds_cmd(seeds_algo, members):
    return seeds.seeds_command(seeds_algo, SCRIPTS, members, True, COMPILE_CUDAGRAPHS)


def plan(parts):
    """The checks of `parts`, in the order they start."""
    checks = []
    pytest = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    if "tests" in parts:
        fresh = str(ROOT / "tests" / "test_fresh_noise.py")
        for stem in graphed_runs():
            cmd = [*pytest, fresh, "-k", f"graphed_functions and {stem}"]
            checks.append(Check("tests", f"fresh noise: {stem}", cmd, 300))
        cmd = [*pytest, fresh, "-k", "graphed_updates"]
        checks.append(Check("tests", "graphed updates = eager updates", cmd, 300))
        for name in CUDA_TEST_FILES:
            checks.append(Check("tests", name, [*pytest, str(ROOT / "tests" / name)], 300))
    if "smoke" in parts:
        seeds_scripts = {a.script: a for a in seeds.ALGOS}
        for stem, flags in graphed_runs().items():
            if stem in seeds_scripts:  # each N of the `seeds` part: its kernels compiled beforehand
                for members in SEEDS_MEMBERS:
                    cmd = seeds_cmd(seeds_scripts[stem], members)
                    checks.append(Check("smoke", f"{stem} N={members}", cmd, 240))
            else:
                cmd = script_cmd(stem, *flags, *COMPILE_CUDAGRAPHS)
                checks.append(Check("smoke", stem, cmd, 240))
    if "learning" in parts:
        for name, (flags, bar) in LEARNING.items():
            cmd = script_cmd(algo(name).twin, *flags, "--seed", "1", *COMPILE_CUDAGRAPHS)
            checks.append(Check("learning", f"{name} > {bar}", cmd, 300))
    if "sps" in parts:
        timed = ("eager", "compile", "compile+cudagraphs")
        variants = [v for v in registry.VARIANTS if v.name in timed]
        for a in registry.ALGOS:
            for v in variants:
                cmd = script_cmd(a.script(v), *a.quick, "--seed", "1", *v.flags)
                checks.append(Check("sps", f"{a.name} {v.name}", cmd, 120))
    if "seeds" in parts:
        for a in seeds.ALGOS:
            for members in SEEDS_MEMBERS:
                checks.append(Check("seeds", f"{a.name} N={members}", seeds_cmd(a, members), 120))
    return checks


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
        many = "--num-seeds" in check.cmd
        summary = (seeds.read_summary if many else parse_summary)(check.cmd, proc)
    except BenchmarkError as error:
        check.status, check.detail = "failed", str(error).splitlines()[0]
        return
    check.summary = {key: value for key, value in summary.items() if key not in ("curve", "curves")}
    graphed = "--cudagraphs" in check.cmd
    device = str(summary.get("device"))
    on_cuda = device.startswith("cuda") and summary.get("cudagraphs") == graphed
    check.value = summary["return_mean"] if check.part == "learning" else summary["sps"]
    bar = LEARNING[check.name.split(" >")[0]][1] if check.part == "learning" else None
    learned = bar is None or (check.value is not None and check.value > bar)
    check.status = "passed" if on_cuda and learned else "failed"
    check.detail = f"device {device}, return {optional(summary.get('return_mean'), '.1f')}"


def execute(check, deadline, cwd, env=None):
    """Run `check` in `cwd` (pytest in the repository) unless `deadline` (time.monotonic) has
    passed, `env` added to its environment; it may run until the sooner of its cap and the
    deadline."""
    left = deadline - time.monotonic()
    if left < 10:
        check.detail = "no time left"
        return check
    timeout = min(check.cap_s, left)
    started = time.monotonic()
    try:
        where = ROOT if check.part == "tests" else cwd
        env = os.environ | (env or {})
        options = dict(capture_output=True, text=True, timeout=timeout, cwd=where, env=env)
        proc = subprocess.run(check.cmd, **options)
    except subprocess.TimeoutExpired:
        check.status, check.detail = "failed", f"ran past {timeout:.0f} s"
    else:
        judge(check, proc)
    check.seconds = time.monotonic() - started
    note = f"[{check.part}] {check.name}: {check.status} ({check.seconds:.0f} s)"
    print(note, file=sys.stderr, flush=True)
    return check


def run_checks(checks, minutes, jobs, cwd):
    """The parallel parts with `jobs` processes until PARALLEL_SHARE of `minutes`, then the timed
    ones alone until `minutes`."""
    start = time.monotonic()
    # the learning runs are the longest: they start first, beside the first tests
    parallel = [c for c in checks if c.part in PARALLEL_PARTS]
    parallel.sort(key=lambda c: c.part != "learning")
    # each process its share of the cores
    threads = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))}
    deadline = start + PARALLEL_SHARE * 60 * minutes
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda c: execute(c, deadline, cwd, threads), parallel))
    for check in checks:
        if check.part not in PARALLEL_PARTS:
            execute(check, start + 60 * minutes, cwd)
    return checks


def speed_rows(checks):
    """Per algorithm: the sps of each variant, the ratios to eager, LeanRL's H100 ratio."""
    sps = {}
    for c in checks:
        if c.part == "sps" and c.status == "passed":
            name, variant = c.name.rsplit(" ", 1)
            sps.setdefault(name, {})[variant] = c.value
    rows = []
    for name, by_variant in sps.items():
        eager = by_variant.get("eager")
        ratio = {v: sps_v / eager if eager else None for v, sps_v in by_variant.items()}
        rows.append(
            {
                "algo": name,
                "sps": by_variant,
                "compile_vs_eager": ratio.get("compile"),
                "graphs_vs_eager": ratio.get("compile+cudagraphs"),
                "leanrl_h100": LEANRL_H100.get(name),
            }
        )
    return rows


def seeds_rows(checks):
    """Per seeds script: its aggregate sps at each number of members."""
    rows = {}
    for c in checks:
        if c.part == "seeds" and c.status == "passed":
            name, members = c.name.split(" N=")
            rows.setdefault(name, {})[int(members)] = c.value
    return [{"algo": name, "sps": by_members} for name, by_members in rows.items()]


def markdown(result):
    """The report: the machine, each check's outcome, the speed table and the seeds table."""
    lines = [
        f"# GPU check, {result['started']}",
        "",
        machine_line(result["machine"]),
        f"Total: {result['seconds']:.0f} s; {result['passed']} of {len(result['checks'])} passed.",
        "",
        "| part | check | result | seconds | detail |",
        "|---|---|---|---:|---|",
    ]
    for c in result["checks"]:
        detail = c["detail"].replace("|", "/")
        cells = [c["part"], c["name"], c["status"], f"{c['seconds']:.0f}", detail]
        lines.append(f"| {' | '.join(cells)} |")
    lines += [
        "",
        "| algo | eager sps | compile sps | compile+cudagraphs sps | compile / eager "
        "| compile+cudagraphs / eager | LeanRL H100 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["speed"]:
        sps = [optional(r["sps"].get(v), ".0f") for v in ("eager", "compile", "compile+cudagraphs")]
        ratios = [optional(r[key], ".2f", "x") for key in ("compile_vs_eager", "graphs_vs_eager")]
        leanrl = optional(r["leanrl_h100"], ".1f", "x")
        lines.append(f"| {r['algo']} | {' | '.join(sps + ratios)} | {leanrl} |")
    header = " | ".join(f"N={n} sps" for n in SEEDS_MEMBERS)
    rule = "|---|" + "---:|" * len(SEEDS_MEMBERS)
    lines += ["", f"| seeds script, `--compile --cudagraphs` | {header} |", rule]
    for r in result["seeds"]:
        cells = " | ".join(optional(r["sps"].get(n), ".0f") for n in SEEDS_MEMBERS)
        lines.append(f"| {r['algo']} | {cells} |")
    return "\n".join(lines) + "\n"


def report(checks, machine, started, seconds):
    """The JSON document of a check: its checks, the speed and seeds tables, the machine."""
    return {
        "started": started,
        "seconds": seconds,
        "machine": machine,
        "passed": sum(c.status == "passed" for c in checks),
        "checks": [asdict(c) for c in checks],
        "speed": speed_rows(checks),
        "seeds": seeds_rows(checks),
    }


def write(result, out_dir):
    """gpu_check.md and gpu_check.json in `out_dir`; returns the folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "gpu_check.md").write_text(markdown(result))
    return out_dir


def parse_args(argv):
    description = __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=description)
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="parts")
    parser.add_argument("--minutes", type=float, default=8.0, help="the check ends within this")
    parser.add_argument("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check needs a CUDA device and torch sees none", file=sys.stderr)
        return 2
    started, start = datetime.now(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-runs-") as cwd:  # the scripts' runs/ folders
        checks = run_checks(plan(args.only), args.minutes, args.jobs, cwd)
    seconds = time.monotonic() - start
    result = report(checks, machine_info(), started.isoformat(timespec="seconds"), seconds)
    folder = write(result, args.out_dir / f"gpu_check-{started:%Y%m%d-%H%M%S}")
    print(folder)
    return 0 if result["passed"] == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
