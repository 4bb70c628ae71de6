"""Learning on the tensor envs beside gymnasium's: the same script, seeds and budget, with and
without `--tensor-envs`, and a two-sided Mann-Whitney test of the final returns (the mean of the
last 20 training episodes).

    python -m benchmarks.tensor_envs_learning --jobs 2  # pqn_cpu, dqn_cpu and ppo_lstm, seeds 1-10

The budgets are the learning tests' (tests/test_pqn.py, tests/test_dqn.py), and ppo_lstm's default
on its velocity-hidden CartPole. Prints one line per
run and `TENSOR_ENVS_LEARNING {json}`; `--out` writes the JSON.
"""

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.machine import machine_info
from benchmarks.tensor_envs import report

ROOT = Path(__file__).resolve().parents[1]
RUNS = {  # script -> its flags (the learning test's budget; ppo_lstm's default budget)
    "pqn_cpu": ("--total-timesteps", "122880", "--threads", "1"),
    "dqn_cpu": ("--total-timesteps", "60000", "--threads", "1"),
    "ppo_lstm": ("--total-timesteps", "200000"),  # one thread on a CPU by itself
}


def mann_whitney(a, b):
    """U of `a` against `b` and its exact two-sided p-value (every split of the pooled values,
    ties counted half), for samples of a few tens."""
    pooled = list(a) + list(b)
    observed = sum((x > y) + 0.5 * (x == y) for x in a for y in b)
    centre = len(a) * len(b) / 2
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    extreme = 0
    for split in splits:
        chosen = set(split)
        left = [pooled[i] for i in chosen]
        right = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        value = sum((x > y) + 0.5 * (x == y) for x in left for y in right)
        extreme += abs(value - centre) >= abs(observed - centre) - 1e-9
    return observed, extreme / len(splits)


def train(script, flags, seed, tensor, folder):
    """One run's final return and sps; a run whose folder holds its summary is not run again."""
    done = sorted(folder.glob("runs/*/summary.json"))
    if done:
        summary = json.loads(done[-1].read_text())
        return dict(seed=seed, return_mean=summary["return_mean"], sps=summary["sps"])
    command = [sys.executable, str(ROOT / "leanrl" / f"{script}.py"), *flags, "--seed", str(seed)]
    command += ["--tensor-envs"] if tensor else []
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("SUMMARY ")]
    if not lines:
        raise RuntimeError(f"{' '.join(command)} ended without a summary: {out.stderr[-2000:]}")
    line = lines[0]
    summary = json.loads(line[len("SUMMARY ") :])
    return dict(seed=seed, return_mean=summary["return_mean"], sps=summary["sps"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scripts", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/tensor_envs_learning"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = dict(machine=machine_info(), scripts={})
    with ThreadPoolExecutor(args.jobs) as pool:
        for script in args.scripts:
            runs = {}
            for tensor in (False, True):
                kind = "tensor" if tensor else "gymnasium"
                seeds = range(args.first_seed, args.first_seed + args.seeds)
                folders = [args.work_dir / f"{script}-{kind}-{s}" for s in seeds]
                jobs = [(script, RUNS[script], s, tensor, f) for s, f in zip(seeds, folders)]
                runs[kind] = list(pool.map(lambda job: train(*job), jobs))
                for run in runs[kind]:
                    print(script, kind, run, flush=True)
            returns = {kind: [r["return_mean"] for r in rs] for kind, rs in runs.items()}
            u, p = mann_whitney(returns["tensor"], returns["gymnasium"])
            stats = {
                kind: dict(mean=statistics.mean(r), std=statistics.stdev(r), min=min(r), max=max(r))
                for kind, r in returns.items()
            }
            result["scripts"][script] = dict(flags=RUNS[script], runs=runs, stats=stats, u=u, p=p)
            print(script, stats, f"Mann-Whitney U {u}, p {p:.3f}", flush=True)
    report("TENSOR_ENVS_LEARNING", result, args.out)


if __name__ == "__main__":
    main()
