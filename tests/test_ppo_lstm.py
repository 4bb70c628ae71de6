"""Recurrent PPO (LSTM): both twins run, an episode start resets the LSTM state exactly, the twin's
written-out LSTM cell and categorical are torch's, the compiled sequence loss and GAE are the eager
ones, nothing recompiles, bad input exits 2, and with the velocities hidden the LSTM learns CartPole
where the same network without memory does not."""

import numpy as np
import pytest
import torch
from conftest import (
    assert_user_error,
    load_script,
    long_learning,
    requires_cuda,
    run_script,
    summary,
)
from tensordict import TensorDict
from test_ppo_continuous_action import flat_parameters

EAGER, TWIN = "ppo_lstm", "ppo_lstm_torchcompile"
# 6 iterations of 2 envs x 8 steps, one minibatch of both sequences; CartPole episodes of a random
# policy last ~20 steps, so several end. The compiled functions' shapes (8 steps of 2 envs, acting
# on 2 envs) are those of the unit tests below, which then find the smoke run's kernels in the
# compile cache.
SMOKE = "--total-timesteps 96 --num-envs 2 --num-steps 8 --num-minibatches 1 --update-epochs 1"
SMOKE = tuple(SMOKE.split())
N_OBS, N_ACT = 2, 2  # velocity-hidden CartPole


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile",))],
    ids=["eager", "twin", "twin-compile"],
)
def test_smoke(script, flags):
    result = summary(run_script(script, *SMOKE, "--measure-burnin", "2", *flags))
    assert result["script"] == script
    assert result["compile"] is ("--compile" in flags)
    assert (result["env_id"], result["total_timesteps"]) == ("CartPole-v1", 96)
    assert result["num_envs"] == 2
    # resolved: CartPole-v1's positions, its velocities hidden
    assert result["obs_indices"] == [0, 2]
    assert result["episodes"] >= 2
    assert 5 <= result["return_mean"] <= 48
    assert result["sps"] > 0 and result["sps_wall"] > 0


@pytest.mark.parametrize("script", [EAGER, TWIN])
def test_observed_indices_are_cartpoles_positions_there_and_every_entry_elsewhere(script):
    observed_indices = load_script(script).observed_indices
    assert observed_indices("CartPole-v1", None) == (0, 2)
    assert observed_indices("Acrobot-v1", None) == ()
    assert observed_indices("popgym:popgym-RepeatFirstEasy-v0", None) == ()
    assert observed_indices("CartPole-v1", ()) == ()
    assert observed_indices("Acrobot-v1", [1, 3]) == (1, 3)


def test_observations_keep_only_the_chosen_entries():
    module = load_script(EAGER)
    hidden, full = (
        module.make_envs("CartPole-v1", 2, 0, wrap=module.observation_wrap((0, 2))),
        module.make_envs("CartPole-v1", 2, 0, wrap=module.observation_wrap(())),
    )
    assert hidden.single_observation_space.shape == (
        2,
    ) and full.single_observation_space.shape == (4,)
    obs, _ = hidden.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    np.testing.assert_array_equal(obs, full_obs[:, [0, 2]])
    for _ in range(5):
        obs, *_ = hidden.step(np.array([0, 1]))
        full_obs, *_ = full.step(np.array([0, 1]))
        np.testing.assert_array_equal(obs, full_obs[:, [0, 2]])


@pytest.mark.parametrize("script", [EAGER, TWIN])
def test_episode_starts_reset_the_memory_or_every_step_without_it(script):
    module = load_script(script)
    terminations, truncations = np.array([True, False, False]), np.array([False, True, False])
    np.testing.assert_array_equal(
        module.episode_starts(terminations, truncations, memory=True), [1, 1, 0]
    )
    np.testing.assert_array_equal(
        module.episode_starts(terminations, truncations, memory=False), [1, 1, 1]
    )


def random_sequence(seed, steps=6, envs=3, hidden_size=128):
    """Observations [steps, envs, N_OBS] and a nonzero LSTM state: what a rollout replays."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(steps, envs, N_OBS, generator=g)
    return obs, (
        torch.randn(envs, hidden_size, generator=g),
        torch.randn(envs, hidden_size, generator=g),
    )


@pytest.mark.parametrize("script", [EAGER, TWIN])
def test_an_episode_start_resets_the_state_exactly(script):
    """Env 0 starts an episode at step 3: its outputs are the suffix's fed alone from a zero state
    (1e-6: other batch shapes sum in another order, ~2e-8 here); env 1 carries its memory."""
    module = load_script(script)
    torch.manual_seed(0)
    agent = module.Agent(N_OBS, N_ACT)
    obs, state = random_sequence(0)
    done = torch.zeros(6, 3)
    done[3, 0] = 1.0
    zeros = (torch.zeros(1, 128), torch.zeros(1, 128))
    with torch.no_grad():
        hidden, (h, c) = agent.get_states(obs, state, done)
        suffix, (h_suffix, c_suffix) = agent.get_states(obs[3:, :1], zeros, done[3:, :1])
        torch.testing.assert_close(hidden[3:, :1], suffix, rtol=0, atol=1e-6)
        torch.testing.assert_close((h[:1], c[:1]), (h_suffix, c_suffix), rtol=0, atol=1e-6)
        fresh, _ = agent.get_states(obs[3:, 1:2], zeros, done[3:, 1:2])
        assert (hidden[3:, 1:2] - fresh).abs().max() > 1e-3


def test_the_twins_agent_is_the_eager_agent():
    """Same weights, same outputs, values, log-probabilities and entropies: the twin's written-out
    LSTM cell and categorical are nn.LSTMCell's and Categorical's (1e-5)."""
    eager, twin = load_script(EAGER), load_script(TWIN)
    torch.manual_seed(0)
    eager_agent = eager.Agent(N_OBS, N_ACT)
    twin_agent = twin.Agent(N_OBS, N_ACT)
    twin_agent.load_state_dict(eager_agent.state_dict())
    obs, state = random_sequence(1, steps=8)
    done = (torch.rand(8, 3, generator=torch.Generator().manual_seed(1)) < 0.3).float()
    actions = torch.randint(0, N_ACT, (8, 3), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = eager_agent.get_action_and_value(obs, state, done, actions)
        got = twin_agent.get_action_and_value(obs, state, done, actions)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_doubling_gae_equals_the_reference_loop():
    """The twin's doubling GAE (eager and compiled) is the eager loop to 1e-5 at the smoke shape."""
    g = torch.Generator().manual_seed(0)
    terminations = (torch.rand(8, 2, generator=g) < 0.2).float()
    data = dict(rewards=torch.randn(8, 2, generator=g), values=torch.randn(8, 2, generator=g))
    data |= dict(
        next_value=torch.randn(2, generator=g), final_values=torch.randn(8, 2, generator=g)
    )
    truncations = (torch.rand(8, 2, generator=g) < 0.2).float() * (1 - terminations)
    data |= dict(terminations=terminations, truncations=truncations)
    twin = load_script(TWIN)
    expected = load_script(EAGER).gae(**data, gamma=0.99, gae_lambda=0.95)
    for gae in (twin.gae, torch.compile(twin.gae, fullgraph=True)):
        torch.testing.assert_close(
            gae(**data, gamma=0.99, gae_lambda=0.95), expected, rtol=1e-5, atol=1e-5
        )


def build_update(module, compile_loss, seed=0, lr=2.5e-4):
    """The twin's update, agent and fused Adam with a tensor learning rate, from a fixed seed;
    `compile_loss`: its sequence loss compiled (as under --compile)."""
    torch.manual_seed(seed)
    args = module.Args(compile=compile_loss, learning_rate=lr)
    learner = module.make_learner(args, N_OBS, N_ACT, torch.device("cpu"))
    return learner.update, learner.agent, learner.optimizer


def make_minibatch(seed, steps=8, envs=2):
    """Whole sequences [steps, envs] with episode starts, and the LSTM state they start from."""
    g = torch.Generator().manual_seed(seed)
    mb = TensorDict(
        obs=torch.randn(steps, envs, N_OBS, generator=g),
        actions=torch.randint(0, N_ACT, (steps, envs), generator=g),
        logprobs=torch.log(torch.rand(steps, envs, generator=g) * 0.5 + 0.25),
        values=torch.randn(steps, envs, generator=g),
        dones=(torch.rand(steps, envs, generator=g) < 0.2).float(),
        advantages=torch.randn(steps, envs, generator=g),
        returns=torch.randn(steps, envs, generator=g),
        batch_size=[steps, envs],
    )
    return mb, (torch.randn(envs, 128, generator=g), torch.randn(envs, 128, generator=g))


def assert_compiled_loss_equals_eager(twin, make_minibatch):
    """Three update steps, the loss compiled against eager: the same statistics and parameters."""
    module = load_script(twin)
    (eager, eager_agent, _), (compiled, compiled_agent, _) = (
        build_update(module, False),
        build_update(module, True),
    )
    before = flat_parameters(eager_agent)
    for seed in range(3):  # three steps: Adam's moments carry over
        mb, state = make_minibatch(seed)
        # float32, the 8-step recurrence fused in another order: statistics agree to 1e-5 relative
        torch.testing.assert_close(
            compiled(mb.clone(), state), eager(mb, state), rtol=1e-5, atol=1e-6
        )
    after_eager, after_compiled = flat_parameters(eager_agent), flat_parameters(compiled_agent)
    assert not torch.equal(after_eager, before)
    # Adam moves a parameter by about lr * g / (|g| + eps): a last-bit difference in a tiny g shows
    # up as up to ~lr * 1e-2, so parameters agree to 1e-5 absolute
    torch.testing.assert_close(after_compiled, after_eager, rtol=1e-5, atol=1e-5)


def assert_no_recompilation_after_warmup(twin, make_minibatch, state):
    """Compiled loss and acting, warmed up on two calls, compile nothing new on three more (fresh
    batches, episode starts, the annealed learning rate) from the recurrent `state`."""
    module = load_script(twin)
    update, agent, optimizer = build_update(module, compile_loss=True)
    policy = torch.compile(agent.get_action_and_value)
    for seed in range(2):
        update(*make_minibatch(seed))
        with torch.no_grad():
            policy(torch.randn(1, 2, N_OBS), state, torch.zeros(1, 2))
    with torch.compiler.set_stance("fail_on_recompile"), torch.no_grad():
        for seed in range(2, 5):
            # the annealed learning rate, in place
            optimizer.param_groups[0]["lr"].copy_(1e-4 * seed)
            with torch.enable_grad():
                update(*make_minibatch(seed))
            _, _, _, _, state = policy(
                torch.randn(1, 2, N_OBS), state, torch.ones(1, 2) * (seed % 2)
            )
    assert optimizer.param_groups[0]["lr"].item() == pytest.approx(4e-4)


@pytest.mark.slow  # compiles the sequence loss (27 s here)
def test_compiled_sequence_loss_equals_eager_loss():
    assert_compiled_loss_equals_eager(TWIN, make_minibatch)


def test_no_recompilation_after_warmup():
    assert_no_recompilation_after_warmup(
        TWIN, make_minibatch, (torch.zeros(2, 128), torch.zeros(2, 128))
    )


@pytest.mark.parametrize("script", [EAGER, TWIN])
@pytest.mark.parametrize(
    "flags, words",
    [
        (("--env-id", "NoSuchEnv-v0"), ("--env-id", "NoSuchEnv-v0")),
        (("--env-id", "Pendulum-v1"), ("--env-id", "Box", "Discrete")),
        (("--num-envs", "5"), ("--num-envs", "--num-minibatches")),
        (("--obs-indices", "0", "4"), ("--obs-indices", "0 4", "4 entries")),
    ],
    ids=["unknown-env", "box-actions", "envs-do-not-divide", "index-outside-obs"],
)
def test_bad_input_exits_2(script, flags, words, refused):
    refused(script, flags, words)


def assert_other_observation_flags_exit_2(script, tmp_path):
    """A model trained on both positions, evaluated with the full observation or without memory,
    stops with one line naming the flag and the value it was trained with."""
    trained = summary(run_script(script, *SMOKE, "--save-model", cwd=tmp_path))
    evaluate = ("--eval-model", trained["model_file"], "--eval-episodes", "1")
    full = run_script(script, *evaluate, "--obs-indices", cwd=tmp_path)
    assert_user_error(full, "--eval-model", "trained with --obs-indices (0, 2)")
    memoryless = run_script(script, *evaluate, "--no-memory", cwd=tmp_path)
    assert_user_error(memoryless, "trained with --memory True")


@pytest.mark.slow  # trains and saves a model first (12-19 s each here)
@pytest.mark.parametrize("script", [EAGER, TWIN])
def test_a_model_saved_under_other_observation_flags_exits_2(script, tmp_path):
    assert_other_observation_flags_exit_2(script, tmp_path)


@requires_cuda
@pytest.mark.parametrize(
    "flags",
    [("--cudagraphs",), ("--compile", "--cudagraphs")],
    ids=["cudagraphs", "compile-cudagraphs"],
)
def test_cudagraphs_smoke(flags):
    result = summary(run_script(TWIN, *SMOKE, "--measure-burnin", "2", *flags))
    assert (result["device"], result["cudagraphs"], result["total_timesteps"]) == ("cuda", True, 96)
    assert result["episodes"] >= 2


def late_return_mean(result):
    """The mean return of the episodes that ended in the run's second half (less noisy)."""
    late = [ret for step, _, ret in result["curve"] if step > result["total_timesteps"] // 2]
    return sum(late) / len(late)


@long_learning
def test_learns_velocity_hidden_cartpole_beyond_a_memoryless_policy():
    """30,720 steps on velocity-hidden CartPole, seed 1: the second half's episodes above 56.
    Seeds 1-10 gave 65.3 to 85.5 (Xeon); `--no-memory` 42.6 to 47.0; random play ~22."""
    flags = ("--total-timesteps", "30720", "--seed", "1")
    result = summary(run_script(EAGER, *flags, env={"OMP_NUM_THREADS": "1"}))
    assert result["total_timesteps"] == 30720
    assert late_return_mean(result) > 56, result["return_mean"]
