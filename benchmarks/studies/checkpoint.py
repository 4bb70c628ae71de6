"""What a checkpoint costs: SAC on HalfCheetah-v4 with its replay buffer full (1M transitions, the
default `--buffer-size`), the state `sac_continuous_action.py` writes every `--checkpoint-minutes`.

    python -m benchmarks.studies.checkpoint             # 3 writes and 3 loads
    python -m benchmarks.studies.checkpoint --quick     # a 10,000-transition buffer, 1 write

It builds the script's learner, buffer and envs as `main` does, fills the buffer with random
transitions, and times `Run.checkpoint` (the state gathered, `torch.save` to a temporary file, the
rename) and `torch.load` of the file, in a temporary folder. The sps cost of the default interval
is the median write time over the interval. Writes benchmarks/results/checkpoint-<time>.json (or
to --out-dir) and prints it.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from benchmarks.machine import machine_info
from benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "sac_continuous_action"


def fill(rb, rng):
    """The buffer full of random transitions."""
    for value in rb.storage.values():
        value.copy_(torch.as_tensor(rng.standard_normal(value.shape), dtype=value.dtype))
    rb.cursor, rb.size = 0, rb.buffer_size


def measure(buffer_size, rounds):
    module = load_script(SCRIPT)
    args = module.Args(buffer_size=buffer_size, run_name="checkpoint-study")
    run = module.Run(args, SCRIPT)
    envs = module.make_envs(args.env_id, args.num_envs, args.seed)
    space, device = envs.single_action_space, torch.device("cpu")
    n_obs, n_act = envs.single_observation_space.shape[0], space.shape[0]
    learner = module.make_learner(args, n_obs, n_act, space.low, space.high, device)
    rb = module.ReplayBuffer(args.buffer_size, n_obs, n_act, device)
    fill(rb, np.random.default_rng(0))
    obs, _ = envs.reset(seed=args.seed)
    state = lambda: dict(learner=learner, rb=rb, envs=(envs, obs))  # noqa: E731
    run.resume(state())
    run.progress(range(args.total_timesteps // args.num_envs))  # makes the run folder
    path = Path(run.dir) / "checkpoint.pt"
    writes, loads = [], []
    for _ in range(rounds):
        run.next_checkpoint = 0.0  # due now
        start = time.perf_counter()
        run.checkpoint(0, state, args.num_envs)
        writes.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.load(path, map_location="cpu", weights_only=False)
        loads.append(time.perf_counter() - start)
    envs.close()
    write_s = statistics.median(writes)
    return dict(
        script=SCRIPT,
        env_id=args.env_id,
        buffer_size=buffer_size,
        checkpoint_bytes=path.stat().st_size,
        write_s=writes,
        load_s=loads,
        default_minutes=module.Args.checkpoint_minutes,
        sps_cost=write_s / (60 * module.Args.checkpoint_minutes + write_s),
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 10,000-transition buffer, 1 write")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    out = args.out_dir.resolve()
    with tempfile.TemporaryDirectory() as folder:
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            result = measure(10_000 if args.quick else 1_000_000, 1 if args.quick else 3)
        finally:
            os.chdir(cwd)
    result = dict(machine=machine_info(), **result)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"checkpoint-{datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(path)
    return result


if __name__ == "__main__":
    main()
