"""The environment-only limit of a script: its own vector env, stepped with random actions and
nothing else.

    python -m benchmarks.env_limit leanrl/dqn.py  # CartPole-v1, 1 env
    python -m benchmarks.env_limit --seconds 5 leanrl/sac_continuous_action.py \
        --env-id HalfCheetah-v4

The script's own `Args` parse the flags after it and its `make_envs` builds the env it trains on;
actions are drawn before the clock starts. Prints one line, `ENV_ONLY {json}`, with `sps`,
`env_steps`, `seconds`, `env_id` and `num_envs`.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.scripts import load_script, script_envs

ACTION_BATCHES = 64  # distinct random action batches, cycled through while timing
WARMUP_STEPS = 10  # vector steps before the clock starts


def random_actions(space, num_envs, seed, batches=ACTION_BATCHES):
    """`batches` arrays of `num_envs` actions from the action `space`, seeded."""
    space.seed(seed)
    return [np.stack([space.sample() for _ in range(num_envs)]) for _ in range(batches)]


def step_for(envs, actions, seconds, clock=time.perf_counter):
    """Step `envs` through `actions` (cycled) for at least `seconds` after a warm-up."""
    for index in range(WARMUP_STEPS):
        envs.step(actions[index % len(actions)])
    steps, start = 0, clock()
    while (elapsed := clock() - start) < seconds:
        envs.step(actions[steps % len(actions)])
        steps += 1
    return steps, elapsed


def measure(script, flags, seconds):
    """The env-only throughput of `script` (a path) under `flags`."""
    module = load_script(script.stem, script.parent)
    args, envs = script_envs(module, flags)
    num_envs = envs.num_envs  # a seeds script's: every member's
    try:
        envs.reset()  # make_envs seeded the env (envpool takes its seeds only there)
        actions = random_actions(envs.single_action_space, num_envs, args.seed)
        steps, elapsed = step_for(envs, actions, seconds)
    finally:
        envs.close()
    env_steps = steps * num_envs
    return {
        "env_id": args.env_id,
        "num_envs": num_envs,
        "env_steps": env_steps,
        "seconds": elapsed,
        "sps": env_steps / elapsed,
    }


def main(argv=None):
    """Measure the script named on the command line and print its `ENV_ONLY` line."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.env_limit", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add("--seconds", type=float, default=2.0, help="how long to step the env, after a warm-up")
    add("script", type=Path, help="a training script, e.g. leanrl/dqn.py")
    add("flags", nargs=argparse.REMAINDER, help="the script's flags (env id, number of envs, seed)")
    args = parser.parse_args(argv)
    print("ENV_ONLY " + json.dumps(measure(args.script, args.flags, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
