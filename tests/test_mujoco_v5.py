"""MuJoCo v5: every script that trains on a MuJoCo Box env runs Hopper-v5 and HalfCheetah-v5 as it
runs the v4 defaults, `--env-id` alone changed. Each script runs once for a tiny budget (without
compiling), each family across both envs: exit 0, a SUMMARY naming the env and budget, a finite mean
return where an episode ended. The Ray script's env runner steps both envs in this process."""

import math

import numpy as np
import pytest
import torch
from conftest import load_script, run_script, slow_unless, summary

# off-policy: 8 gradient steps after 40 random steps; on-policy: 2 iterations of 32 steps
OFF_POLICY = ("--total-timesteps", 48, "--learning-starts", 40, "--batch-size", 16)
ON_POLICY = ("--total-timesteps", 64, "--num-steps", 32, "--num-minibatches", 2)
SEEDS = ("--num-seeds", 2)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# (script, env id, flags): each family's eager twin on Hopper, the rest alternating
RUNS = [
    ("sac_continuous_action", "Hopper-v5", OFF_POLICY),
    ("sac_continuous_action_torchcompile", "HalfCheetah-v5", OFF_POLICY),
    ("sac_continuous_action_cpu", "Hopper-v5", (*OFF_POLICY, "--no-compile")),
    ("sac_continuous_action_seeds", "HalfCheetah-v5", (*OFF_POLICY, *SEEDS, "--no-compile")),
    ("td3_continuous_action", "Hopper-v5", OFF_POLICY),
    ("td3_continuous_action_torchcompile", "HalfCheetah-v5", OFF_POLICY),
    ("td3_continuous_action_cpu", "Hopper-v5", (*OFF_POLICY, "--no-compile")),
    ("td3_continuous_action_seeds", "HalfCheetah-v5", (*OFF_POLICY, *SEEDS, "--no-compile")),
    ("ppo_continuous_action", "Hopper-v5", ON_POLICY),
    ("ppo_continuous_action_torchcompile", "HalfCheetah-v5", ON_POLICY),
    ("ppo_continuous_action_cpu", "HalfCheetah-v5", (*ON_POLICY, "--no-compile")),
    # envpool 1.2.5 has both v5 ids
    ("ppo_continuous_action_seeds", "Hopper-v5", (*ON_POLICY, *SEEDS, "--no-compile")),
    # without torchrun: one process, world size 1
    ("ppo_continuous_action_distributed", "Hopper-v5", ON_POLICY),
]


# the quick tier keeps the eager scripts (Hopper) and SAC's twin (HalfCheetah)
QUICK = ("sac_continuous_action", "sac_continuous_action_torchcompile", "td3_continuous_action")
QUICK += ("ppo_continuous_action",)


@pytest.mark.parametrize(
    "script, env_id, flags",
    slow_unless(lambda run: run[0] in QUICK, RUNS, [f"{s}-{e}" for s, e, _ in RUNS]),
)
def test_script_trains_on_v5(script, env_id, flags, tmp_path):
    # one thread: the networks are small, and on a shared machine a second thread waits for a core
    proc = run_script(script, "--env-id", env_id, *flags, cwd=tmp_path, timeout=300, env=ONE_THREAD)
    result = summary(proc)
    assert (result["script"], result["env_id"]) == (script, env_id)
    assert result["total_timesteps"] == flags[flags.index("--total-timesteps") + 1]
    if env_id == "Hopper-v5":
        assert result["episodes"] > 0 and math.isfinite(result["return_mean"])
    else:
        assert (result["episodes"], result["return_mean"]) == (0, None)


@pytest.mark.parametrize("env_id", ["Hopper-v5", "HalfCheetah-v5"])
def test_ray_env_runner_samples_v5(env_id):
    """The Ray script's env runner, as a plain object: a 64-step fragment of finite transitions."""
    module = load_script("ppo_continuous_action_ray")
    threads = torch.get_num_threads()
    try:
        runner = module.EnvRunner(env_id, 1, 1, 0.99)  # sets one thread, as in a Ray actor
        (n_obs,) = runner.envs.single_observation_space.shape
        (n_act,) = runner.envs.single_action_space.shape
        agent = module.Agent(n_obs, n_act)
        obs_rms = {"mean": np.zeros(n_obs), "var": np.ones(n_obs)}
        fragment = runner.sample({"agent": agent.state_dict(), "obs_rms": obs_rms}, 64)
    finally:
        torch.set_num_threads(threads)
    assert fragment["obs"].shape == (64, 1, n_obs) and fragment["actions"].shape == (64, 1, n_act)
    assert all(torch.isfinite(fragment[key]).all() for key in ("obs", "rewards", "final_obs"))
    returns = [episodic_return for _, episodic_return in fragment["episodes"]]
    assert all(map(math.isfinite, returns))
    assert (len(returns) > 0) == (env_id == "Hopper-v5")
