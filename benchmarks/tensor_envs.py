"""The tensor envs' speed, env steps per second with random actions drawn before the clock, beside
vector_envs.py's `SyncVectorEnv` and gymnasium's numpy `CartPoleVectorEnv`, at several batch sizes.

    python -m benchmarks.tensor_envs --threads 1  # every classic-control env id, on the CPU
    python -m benchmarks.tensor_envs --env-ids CartPole-v1 --device cuda --sizes 4 1024 65536
    python -m benchmarks.tensor_envs --env-ids mujoco --sizes 1 4 64  # the MuJoCo Warp tasks

Rows: `sync` (vector_envs.py's vector env of gymnasium's envs, same-step autoreset), `numpy`
(gymnasium's `CartPoleVectorEnv`, CartPole only, next-step autoreset), `tensor` (tensor_envs.py or
mujoco_envs.py, eager) and `tensor-compiled` (its step compiled whole; on CUDA also recorded as a
CUDA graph). `--env-ids mujoco` names the five MuJoCo tasks.
Each row is the median of `--rounds` timings, the rows of one size in turn. Prints one
`TENSOR_ENVS {json}` line with the machine and every row; `--out` writes it too.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from benchmarks.machine import machine_info
from benchmarks.scripts import load_script

ACTION_BATCHES = 16


def timed(step, actions, seconds, sync=lambda: None):
    """Vector steps per second of `step` over `actions` (cycled), after a warm-up, for at least
    `seconds`."""
    for a in actions[:3]:
        step(a)
    sync()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for a in actions:
            step(a)
        steps += len(actions)
        sync()
    return steps / (time.perf_counter() - start)


def report(tag, result, out=None):
    """`result` as one line, `<tag> {json}`, and to the file `out` if given."""
    line = json.dumps(result)
    print(f"{tag} {line}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(line + "\n")


def gymnasium_steppers(env_id, num_envs):
    """kind -> (step, actions, sync) for vector_envs.py's `SyncVectorEnv` and, for CartPole,
    gymnasium's numpy `CartPoleVectorEnv`."""
    vector_envs = load_script("vector_envs")
    envs = {"sync": vector_envs.make_envs(env_id, num_envs, 0)}
    if env_id == "CartPole-v1":
        envs["numpy"] = gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point")
    steppers = {}
    for kind, env in envs.items():
        env.reset(seed=0)
        space = env.single_action_space
        actions = [np.stack([space.sample() for _ in range(num_envs)]) for _ in range(4)]
        steppers[kind] = (env.step, actions, lambda: None)
    return steppers


def tensor_steppers(env_id, num_envs, device, compiled):
    """kind -> (step, actions, sync) for the tensor envs, eager and compiled (on CUDA, also
    recorded as a CUDA graph)."""
    envs = make_tensor_envs(env_id, num_envs, device)
    space = envs.single_action_space
    actions = [
        torch.as_tensor(np.stack([space.sample() for _ in range(num_envs)]), device=device)
        for _ in range(ACTION_BATCHES)
    ]
    sync = torch.cuda.synchronize if envs.device.type == "cuda" else (lambda: None)
    steppers = {"tensor": (envs.step, actions, sync)}
    if compiled:
        torch._dynamo.reset()  # the envs share one `step`: each size and env compiles it afresh
        step = torch.compile(envs.step, fullgraph=True)
        if envs.device.type == "cuda":
            from tensordict.nn import CudaGraphModule

            step = CudaGraphModule(step, warmup=2)
        steppers["tensor-compiled"] = (step, actions, sync)
    return steppers


def make_tensor_envs(env_id, num_envs, device):
    mujoco_envs = load_script("mujoco_envs")
    if env_id in mujoco_envs.MUJOCO_ENVS:
        return mujoco_envs.make_mujoco_envs(env_id, num_envs, device=device, seed=0)
    return load_script("tensor_envs").make_tensor_envs(env_id, num_envs, device=device, seed=0)


def timed_rows(steppers, num_envs, seconds, rounds):
    """Each kind's median env steps per second over `rounds` timings, the kinds in turn in each
    round: a machine whose load drifts slows them alike."""
    timings = {kind: [] for kind in steppers}
    for _ in range(rounds):
        for kind, (step, actions, sync) in steppers.items():
            timings[kind].append(num_envs * timed(step, actions, seconds, sync))
    return [
        dict(kind=kind, sps=statistics.median(sps), rounds=sps) for kind, sps in timings.items()
    ]


def main(argv=None):
    tensor_envs = load_script("tensor_envs")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--env-ids", nargs="+", default=list(tensor_envs.TENSOR_ENVS))
    add("--sizes", nargs="+", type=int, default=[1, 4, 64, 1024, 16384])
    add("--device", default="cpu")
    add("--threads", type=int, default=1, help="torch's threads on the CPU")
    add("--seconds", type=float, default=0.5, help="each timing")
    add("--rounds", type=int, default=3, help="timings of each row, the rows in turn")
    add("--no-compile", action="store_true", help="leave out the compiled rows")
    add("--no-gymnasium", action="store_true", help="the tensor envs' rows only")
    add("--out", type=Path)
    args = parser.parse_args(argv)
    if args.env_ids == ["mujoco"]:
        args.env_ids = list(load_script("mujoco_envs").MUJOCO_ENVS)
    torch.set_num_threads(args.threads)
    rows = []
    for env_id in args.env_ids:
        for n in args.sizes:
            steppers = {}
            if not args.no_gymnasium and n <= 1024:  # past that, gymnasium's envs take minutes
                steppers |= gymnasium_steppers(env_id, n)
            steppers |= tensor_steppers(env_id, n, args.device, not args.no_compile)
            for row in timed_rows(steppers, n, args.seconds, args.rounds):
                rows.append(dict(env_id=env_id, num_envs=n, **row))
                print(f"{env_id:26} {n:6} {row['kind']:16} {row['sps']:14,.0f}", flush=True)
    result = dict(machine=machine_info(), device=args.device, threads=args.threads, rows=rows)
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    report("TENSOR_ENVS", result, args.out)


if __name__ == "__main__":
    main()
