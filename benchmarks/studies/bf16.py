"""Does `--bf16` learn as float32 does? The SAC and TD3 `_cpu` scripts at their learning tests'
budgets, each seed with and without `--bf16`: the two sets of returns in one distribution test,
and the speed of each beside the other, in one run.

    python -m benchmarks.studies.bf16           # SAC and TD3, seeds 1-10 (the lead's run)
    python -m benchmarks.studies.bf16 --jobs 2  # two runs at a time: sps under contention
    python -m benchmarks.studies.bf16 --algos sac --seeds 3 --quick  # tiny, eager: a smoke test

Budgets (tests/test_sac_continuous_action.py and tests/test_td3_continuous_action.py, whose bars
the table repeats): SAC on Pendulum-v1, 8,000 steps, 1,000 of them random; TD3 on Pendulum-v1,
10,000 steps, 1,000 random. Each seed runs float32, then `--bf16`, with the same `--threads`
(default 1: the two differ in the arithmetic only). A run's return is its SUMMARY's
`return_mean` (the last 20 episodes). The test: Mann-Whitney's U, two-sided, its p-value exact
(every split of the pooled returns into two groups of the same sizes, ties at mid-ranks); a small
p says the two sets of returns come from different distributions. It needs a CPU with native
bfloat16 (AMX or AVX-512 BF16). Writes benchmarks/results/bf16-<time>.{json,md} (or to --out-dir).
"""

import argparse
import itertools
import math
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import numpy as np

from benchmarks.machine import machine_info
from benchmarks.report import machine_line, write_result
from benchmarks.run import BenchmarkError, failure, note
from benchmarks.scripts import SCRIPTS, load_script
from benchmarks.studies.seeds import read_summary

ROOT = Path(__file__).resolve().parents[2]
PENDULUM = ("--env-id", "Pendulum-v1", "--learning-starts", "1000")
# algo: (script, the learning test's flags, its bar on the mean return)
ALGOS = {
    "sac": ("sac_continuous_action_cpu", (*PENDULUM, "--total-timesteps", "8000"), -400),
    "td3": ("td3_continuous_action_cpu", (*PENDULUM, "--total-timesteps", "10000"), -700),
}
QUICK = ("--env-id", "Pendulum-v1", "--total-timesteps", "500", "--learning-starts", "300")
QUICK += ("--batch-size", "32", "--no-compile")
EXACT_SPLITS = 2_000_000  # beyond this many splits, the p-value from as many random ones


def midranks(x):
    """The ranks of `x` from 1, tied values sharing the mean of their ranks."""
    x = np.asarray(x, dtype=float)
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        ranks[x == value] = ranks[x == value].mean()
    return ranks


def mann_whitney(a, b, seed=0):
    """Mann-Whitney's U of `a` against `b` and its two-sided p-value: the share of the splits of the
    pooled values into groups of len(a) and len(b) whose U lies at least as far from its mean,
    n_a * n_b / 2, as the observed one (every split, or EXACT_SPLITS random ones)."""
    n, ranks = len(a), midranks([*a, *b])
    total = len(ranks)
    if math.comb(total, n) <= EXACT_SPLITS:
        splits = np.array(list(itertools.combinations(range(total), n)))
    else:
        rng = np.random.default_rng(seed)
        splits = rng.permuted(np.tile(np.arange(total), (EXACT_SPLITS, 1)), axis=1)[:, :n]
    u = ranks[splits].sum(1) - n * (n + 1) / 2
    observed = ranks[:n].sum() - n * (n + 1) / 2
    middle = n * len(b) / 2
    # a split as extreme as the observed one, up to rounding in the sums
    p = np.mean(np.abs(u - middle) >= abs(observed - middle) - 1e-9)
    return float(observed), float(p)


def command(algo, seed, bf16, threads, quick):
    script, flags, _ = ALGOS[algo]
    flags = QUICK if quick else flags
    extra = ("--bf16",) if bf16 else ()
    flags = (*flags, "--seed", str(seed), "--threads", str(threads), *extra)
    return [sys.executable, str(SCRIPTS / f"{script}.py"), *flags]


def run_one(cmd, timeout, cwd):
    """The SUMMARY of one run; a BenchmarkError if it fails."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise failure(cmd, f"ran past the {timeout} s timeout") from None
    if proc.returncode != 0:
        raise failure(cmd, f"exited with status {proc.returncode}", proc.stderr)
    return read_summary(cmd, proc)


def measure(algos, seeds, threads, quick, jobs, timeout):
    """{algo: {"fp32" | "bf16": [{seed, return_mean, sps}, ...]}}: each seed float32 then bf16,
    `jobs` runs at a time."""
    plan = [(algo, seed, bf16) for algo in algos for seed in seeds for bf16 in (False, True)]
    with tempfile.TemporaryDirectory(prefix="bf16-") as cwd, ThreadPoolExecutor(jobs) as pool:
        commands = [command(algo, seed, bf16, threads, quick) for algo, seed, bf16 in plan]
        summaries = pool.map(lambda cmd: run_one(cmd, timeout, cwd), commands)
        results = {}
        for (algo, seed, bf16), s in zip(plan, summaries):
            arm = "bf16" if bf16 else "fp32"
            note(f"{algo} seed {seed} {arm}: return {s['return_mean']:.1f}, {s['sps']:.0f} sps")
            run = dict(seed=seed, return_mean=s["return_mean"], sps=s["sps"])
            results.setdefault(algo, {}).setdefault(arm, []).append(run)
    return results


def rows(results, bars):
    """One row per algorithm: each arm's returns (mean, std, range, share above the test's bar),
    Mann-Whitney's U and p, each arm's median sps and their ratio."""
    table = []
    for algo, arms in results.items():
        returns = {arm: [run["return_mean"] for run in runs] for arm, runs in arms.items()}
        sps = {arm: statistics.median(run["sps"] for run in runs) for arm, runs in arms.items()}
        u, p = mann_whitney(returns["bf16"], returns["fp32"])
        row = dict(algo=algo, seeds=len(returns["fp32"]), bar=bars[algo], u=u, p=p)
        for arm, values in returns.items():
            above = sum(value > bars[algo] for value in values) / len(values)
            row[arm] = dict(mean=statistics.fmean(values), std=statistics.pstdev(values))
            row[arm] |= dict(min=min(values), max=max(values), above_bar=above, sps=sps[arm])
        row["speedup"] = sps["bf16"] / sps["fp32"]
        table.append(row)
    return table


def markdown(result):
    settings = result["settings"]
    lines = [
        f"{machine_line(result['machine'])}; {settings['budget']} budgets, seeds "
        f"{settings['seeds'][0]}-{settings['seeds'][-1]}, --threads {settings['threads']}, "
        f"{settings['jobs']} run(s) at a time. Returns: the mean of each run's last 20 episodes.",
        "",
        "| algo | fp32 return | bf16 return | above the bar (fp32, bf16) | Mann-Whitney U, p | "
        "sps fp32 | sps bf16 | bf16 / fp32 |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        arms = [r[arm] for arm in ("fp32", "bf16")]
        returns = [
            f"{a['mean']:.1f} ± {a['std']:.1f} ({a['min']:.1f} to {a['max']:.1f})" for a in arms
        ]
        above = ", ".join(f"{a['above_bar']:.0%}" for a in arms)
        lines.append(
            f"| {r['algo']} | {returns[0]} | {returns[1]} | > {r['bar']}: {above} | "
            f"{r['u']:.1f}, {r['p']:.2f} | {arms[0]['sps']:.0f} | {arms[1]['sps']:.0f} | "
            f"{r['speedup']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=list(ALGOS))
    parser.add_argument("--seeds", type=int, default=10, help="seeds 1 to this")
    parser.add_argument("--threads", type=int, default=1, help="every run's --threads")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--quick", action="store_true", help="tiny budgets, eager: a smoke test")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for one run")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if set(args.algos) - set(ALGOS) or min(args.seeds, args.threads, args.jobs) < 1:
        print(
            f"error: --algos must name {list(ALGOS)}; --seeds, --threads, --jobs >= 1",
            file=sys.stderr,
        )
        sys.exit(2)
    if not load_script("threads").bf16_native():
        print(
            "error: this CPU computes no bfloat16 natively (AMX or AVX-512 BF16)", file=sys.stderr
        )
        sys.exit(2)
    seeds = list(range(1, args.seeds + 1))
    started = datetime.now()
    try:
        results = measure(args.algos, seeds, args.threads, args.quick, args.jobs, args.timeout)
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    settings = dict(seeds=seeds, threads=args.threads, jobs=args.jobs, started=started.isoformat())
    settings["budget"] = "quick" if args.quick else "the learning tests'"
    bars = {algo: ALGOS[algo][2] for algo in args.algos}
    result = dict(machine=machine_info(), settings=settings, results=results)
    result["rows"] = rows(results, bars)
    paths = write_result(result, args.out_dir, f"bf16-{started:%Y%m%d-%H%M%S}", markdown)
    print(markdown(result))
    note("wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
