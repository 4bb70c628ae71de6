"""What every script promises alike (CONTRIBUTING.md): the true final observation of an ended episode is the
one stored, every finished episode is counted, an off-policy replay buffer wraps around, and `--cudagraphs`
without CUDA is a user error; SAC and TD3 share their bad inputs and their CUDA-graph smoke runs. Every smoke run's
SUMMARY `curve` (one point per counted episode, steps in order) is checked by `conftest.summary`."""

import numpy as np
import pytest
import torch
from conftest import assert_user_error, load_script, requires_cuda, run_script, summary

ALGOS = ("sac_continuous_action", "td3_continuous_action", "dqn", "ppo_continuous_action")
# the scripts that scale a twin out keep its contract: plainly run, they are one process of it
SCALED_OUT = ["ppo_continuous_action_distributed"]
SCRIPTS = [name for algo in ALGOS for name in (algo, f"{algo}_torchcompile")] + SCALED_OUT
OFF_POLICY_CONTINUOUS = [name for algo in ALGOS[:2] for name in (algo, f"{algo}_torchcompile")]
# 3 Pendulum episodes of 200 steps; 100 gradient steps after the random phase
PENDULUM_SMOKE = ("--env-id", "Pendulum-v1", "--total-timesteps", "600", "--learning-starts", "500", "--batch-size", "32")


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


# the optimized twins write Adam out for their CPU fast path, and so does the script that scales PPO's twin out
WRITTEN_OUT_ADAM = [f"{algo}_torchcompile" for algo in ALGOS] + SCALED_OUT


@pytest.mark.parametrize("script", WRITTEN_OUT_ADAM)
def test_written_out_adam_takes_torch_adams_steps_over_a_long_run(script):
    """The written-out Adam keeps beta1**t and beta2**t as running products, not powers of a step count: over
    3,000 steps, past where the bias corrections fade, its parameters stay on torch.optim.Adam's."""
    module = load_script(script)
    torch.manual_seed(0)
    start = {"weight": torch.randn(8, 5), "bias": torch.randn(5)}
    lr, eps = 1e-3, 1e-5  # the PPO scripts' Adam takes its learning rate as a tensor, as the loop anneals it
    params = {name: p.clone() for name, p in start.items()}
    adam = module.Adam(params, torch.tensor(lr) if "ppo" in script else lr, eps=eps)
    reference = {name: p.clone().requires_grad_() for name, p in start.items()}
    torch_adam = torch.optim.Adam(reference.values(), lr=lr, eps=eps)
    for step in range(3000):
        grads = {name: torch.randn_like(p) * (1 + step % 7) for name, p in start.items()}
        adam.step(grads)
        for name, p in reference.items():
            p.grad = grads[name]
        torch_adam.step()
        if step in (0, 9, 99, 2999):
            for name, p in params.items():
                torch.testing.assert_close(p, reference[name].detach(), rtol=0, atol=1e-5, msg=f"{name}, step {step + 1}")
    assert (params["weight"] - start["weight"]).abs().max() > 0.01  # it moved: the comparison is not of two starts


HOST_MODES = [(s, False) for s in OFF_POLICY_CONTINUOUS] + [(s, True) for s in OFF_POLICY_CONTINUOUS if "_torchcompile" in s]


@pytest.mark.parametrize("script, host", HOST_MODES)
def test_replay_buffer_wraps_around_and_samples_what_was_added(script, host):
    """The eager twins add tensors, the optimized ones the env's numpy arrays; `host`: the CPU fast path, which
    writes them through numpy views of the buffer's tensors."""
    module = load_script(script)
    rb = module.ReplayBuffer(buffer_size=5, n_obs=1, n_act=1, device="cpu", **({"host": True} if host else {}))
    for step in range(7):  # 14 transitions through a buffer of 5
        values = np.array([2.0 * step, 2.0 * step + 1])
        transition = {
            "obs": values[:, None],
            "next_obs": values[:, None] + 0.5,
            "actions": -values[:, None],
            "rewards": values,
            "terminations": np.zeros(2),
        }
        if not script.endswith("_torchcompile"):
            transition = {k: torch.as_tensor(v, dtype=torch.float) for k, v in transition.items()}
        rb.add(transition)
    assert (rb.size, rb.cursor) == (5, 4)
    batch = rb.sample(200)
    assert set(batch["rewards"].tolist()) == {9.0, 10.0, 11.0, 12.0, 13.0}
    torch.testing.assert_close(batch["obs"][:, 0], batch["rewards"])
    torch.testing.assert_close(batch["next_obs"][:, 0], batch["rewards"] + 0.5)
    torch.testing.assert_close(batch["actions"][:, 0], -batch["rewards"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --cudagraphs is valid here")
@pytest.mark.parametrize("script", [name for name in SCRIPTS if name not in ALGOS] + ["ppo_atari_envpool_torchcompile"])
def test_cudagraphs_without_cuda_exits_2(script):
    assert_user_error(run_script(script, "--cudagraphs", timeout=120), "--cudagraphs", "CUDA")


@pytest.mark.parametrize("script", OFF_POLICY_CONTINUOUS)
@pytest.mark.parametrize(
    "flags, words",
    [
        (("--env-id", "NoSuchEnv-v0"), ("--env-id", "NoSuchEnv-v0")),
        (("--env-id", "CartPole-v1"), ("--env-id", "Discrete")),
        (("--batch-size", "0"), ("--batch-size",)),
        (("--batch-size", "512", "--buffer-size", "256"), ("--batch-size", "--buffer-size")),
    ],
    ids=["unknown-env", "discrete-env", "zero-batch", "batch-over-buffer"],
)
def test_off_policy_bad_input_exits_2(script, flags, words):
    assert_user_error(run_script(script, *flags, timeout=120), *words)


@requires_cuda
@pytest.mark.parametrize("script", [name for name in OFF_POLICY_CONTINUOUS if name.endswith("_torchcompile")])
@pytest.mark.parametrize("flags", [("--cudagraphs",), ("--compile", "--cudagraphs")], ids=["cudagraphs", "compile-cudagraphs"])
def test_off_policy_cudagraphs_smoke(script, flags):
    result = summary(run_script(script, *PENDULUM_SMOKE, "--measure-burnin", "5", *flags))
    assert (result["device"], result["cudagraphs"], result["episodes"]) == ("cuda", True, 3)
    assert -2000 < result["return_mean"] < 0
