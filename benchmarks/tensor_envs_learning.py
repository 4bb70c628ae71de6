"""Learning and speed on the tensor envs beside gymnasium's: the same script, seeds and budget,
with and without `--tensor-envs` in turn, and a two-sided Mann-Whitney test of the final returns
(the mean of the last 20 training episodes).

    python -m benchmarks.tensor_envs_learning --jobs 2  # pqn_cpu, dqn_cpu and ppo_lstm, seeds 1-10

The budgets are the learning tests' (tests/test_pqn.py, tests/test_dqn.py), ppo_lstm's default on
its velocity-hidden CartPole, and for pqn_torchcompile a speed check at 64 envs. Prints one line
per run and `TENSOR_ENVS_LEARNING {json}`; `--out` writes the JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from benchmarks.machine import machine_info
from benchmarks.report import mann_whitney
from benchmarks.tensor_envs import report

ROOT = Path(__file__).resolve().parents[1]
RUNS = {  # script -> its flags (the learning test's budget; ppo_lstm's default budget)
    "pqn_cpu": ("--total-timesteps", "122880", "--threads", "1"),
    "dqn_cpu": ("--total-timesteps", "60000", "--threads", "1"),
    "ppo_lstm": ("--total-timesteps", "200000"),  # one thread on a CPU by itself
    # the whole rollout compiled (tensor envs) against stepping gymnasium's envs: the speed
    "pqn_torchcompile": ("--compile", "--num-envs", "64", "--num-steps", "32")
    + ("--total-timesteps", "204800"),
}


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
    add = parser.add_argument
    add("--scripts", nargs="+", default=list(RUNS), choices=list(RUNS))
    add("--seeds", type=int, default=10, help="how many seeds")
    add("--first-seed", type=int, default=1)
    add("--jobs", type=int, default=1)
    add("--work-dir", type=Path, default=Path("/tmp/tensor_envs_learning"))
    add("--out", type=Path)
    args = parser.parse_args(argv)
    result = dict(machine=machine_info(), scripts={})
    with ThreadPoolExecutor(args.jobs) as pool:
        for script in args.scripts:
            # with and without the flag alternating, seed by seed: a busy machine slows both
            seeds = range(args.first_seed, args.first_seed + args.seeds)
            jobs = [(seed, kind) for seed in seeds for kind in ("gymnasium", "tensor")]
            folders = [args.work_dir / f"{script}-{kind}-{seed}" for seed, kind in jobs]
            tensor = [kind == "tensor" for _, kind in jobs]
            one = partial(train, script, RUNS[script])
            done = pool.map(one, [seed for seed, _ in jobs], tensor, folders)
            runs = {"gymnasium": [], "tensor": []}
            for (_, kind), run in zip(jobs, done):
                runs[kind].append(run)
                print(script, kind, run, flush=True)
            returns = {kind: [r["return_mean"] for r in rs] for kind, rs in runs.items()}
            u, p = mann_whitney(returns["tensor"], returns["gymnasium"])
            stats = {
                kind: dict(mean=statistics.mean(r), std=statistics.stdev(r), min=min(r), max=max(r))
                | dict(sps=statistics.mean(run["sps"] for run in runs[kind]))
                for kind, r in returns.items()
            }
            result["scripts"][script] = dict(flags=RUNS[script], runs=runs, stats=stats, u=u, p=p)
            print(script, stats, f"Mann-Whitney U {u}, p {p:.3f}", flush=True)
    report("TENSOR_ENVS_LEARNING", result, args.out)


if __name__ == "__main__":
    main()
