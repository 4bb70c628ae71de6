"""What every script promises alike (CONTRIBUTING.md): the true final observation of an ended episode is the
one stored, every finished episode is counted, an off-policy replay buffer wraps around, and `--cudagraphs`
without CUDA is a user error."""

import numpy as np
import pytest
import torch
from conftest import assert_user_error, load_script, run_script
from tensordict import TensorDict

ALGOS = ("sac_continuous_action", "td3_continuous_action", "dqn", "ppo_continuous_action")
SCRIPTS = [name for algo in ALGOS for name in (algo, f"{algo}_torchcompile")]
OFF_POLICY_CONTINUOUS = [name for algo in ALGOS[:2] for name in (algo, f"{algo}_torchcompile")]


@pytest.mark.parametrize("script", SCRIPTS)
def test_true_final_observation_replaces_the_reset_one(script):
    module = load_script(script)
    next_obs = np.array([[1.0, 1.0], [2.0, 2.0]], dtype=np.float32)  # env 1 has already been reset
    final_obs = np.array([None, np.array([9.0, 9.0], dtype=np.float32)], dtype=object)
    infos = {"final_obs": final_obs, "_final_obs": np.array([False, True])}
    np.testing.assert_array_equal(module.true_next_obs(next_obs, infos), [[1.0, 1.0], [9.0, 9.0]])
    np.testing.assert_array_equal(next_obs, [[1.0, 1.0], [2.0, 2.0]])  # the reset obs is kept for acting
    assert module.true_next_obs(next_obs, {}) is not next_obs


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_finished_episode_is_counted(script):
    module = load_script(script)
    episode = {"r": np.array([-5.0, 0.0, -7.0]), "l": np.array([200, 0, 200])}
    infos = {"final_info": {"episode": episode, "_episode": np.array([True, False, True])}}
    assert module.finished_episodes(infos) == [-5.0, -7.0]
    assert module.finished_episodes({}) == []


@pytest.mark.parametrize("script", OFF_POLICY_CONTINUOUS)
def test_replay_buffer_wraps_around_and_samples_what_was_added(script):
    module = load_script(script)
    rb = module.ReplayBuffer(buffer_size=5, n_obs=1, n_act=1, device="cpu")
    for step in range(7):  # 14 transitions through a buffer of 5
        values = torch.tensor([2.0 * step, 2.0 * step + 1])
        transition = {
            "obs": values[:, None],
            "next_obs": values[:, None] + 0.5,
            "actions": -values[:, None],
            "rewards": values,
            "terminations": torch.zeros(2),
        }
        rb.add(TensorDict(transition, [2]) if script.endswith("_torchcompile") else transition)
    assert (rb.size, rb.cursor) == (5, 4)
    batch = rb.sample(200)
    assert set(batch["rewards"].tolist()) == {9.0, 10.0, 11.0, 12.0, 13.0}
    torch.testing.assert_close(batch["obs"][:, 0], batch["rewards"])
    torch.testing.assert_close(batch["next_obs"][:, 0], batch["rewards"] + 0.5)
    torch.testing.assert_close(batch["actions"][:, 0], -batch["rewards"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --cudagraphs is valid here")
@pytest.mark.parametrize("script", [name for name in SCRIPTS if name.endswith("_torchcompile")])
def test_cudagraphs_without_cuda_exits_2(script):
    assert_user_error(run_script(script, "--cudagraphs", timeout=120), "--cudagraphs", "CUDA")
