"""PQN on Atari (envpool): both twins run and count whole games, the Q(lambda) returns bootstrap a
truncation from envpool's final observation and not a termination (the twin's doubling = the eager
loop), the twin's update (channels-last, compiled or not) = the eager twin's, nothing recompiles,
bad input exits 2. PPO Atari's tests lend their smoke budget and minibatches."""

import pytest
import torch
from conftest import load_script, requires_cuda, run_script, summary
from test_ppo_atari_envpool import SMOKE, flat_parameters, make_minibatch
from test_pqn import recursive_returns, returns_functions

EAGER, TWIN = "pqn_atari_envpool", "pqn_atari_envpool_torchcompile"


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile",))],
    ids=["eager", "twin", "twin-compile"],
)
def test_smoke(script, flags):
    """8 Breakout games x 256 agent steps, 8 iterations of 2 minibatch updates: epsilon stays near
    1, so the games are a random player's, scored in whole points."""
    result = summary(run_script(script, *SMOKE, *flags))
    assert (result["script"], result["compile"]) == (script, "--compile" in flags)
    assert (result["env_id"], result["total_timesteps"]) == ("Breakout-v5", 2048)
    assert result["num_envs"] == 8
    assert result["episodes"] >= 4 and 0 <= result["return_mean"] < 10
    assert all(point[2] == int(point[2]) for point in result["curve"])
    assert result["sps"] > 0 and result["sps_wall"] > 0


@requires_cuda
@pytest.mark.parametrize(
    "flags",
    [("--cudagraphs",), ("--compile", "--cudagraphs")],
    ids=["cudagraphs", "compile-cudagraphs"],
)
def test_cudagraphs_smoke(flags):
    result = summary(run_script(TWIN, *SMOKE, *flags))
    assert result["cudagraphs"] is True and result["device"].startswith("cuda")
    assert result["episodes"] >= 4 and 0 <= result["return_mean"] < 10


@pytest.mark.parametrize("name", ["eager", "twin", "twin-compiled"])
def test_returns_bootstrap_truncation_from_the_next_obs_and_not_termination(name):
    """One env, 4 steps: step 1 truncated, step 2 terminates; envpool's values[2] (10) is the
    truncated episode's final obs, values[3] the terminated one's (never read)."""
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [10.0], [99.0]])
    terminations = torch.tensor([[0.0], [0.0], [1.0], [0.0]])
    truncations = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    returns = returns_functions(EAGER, TWIN)[name](
        rewards, values, torch.tensor([7.0]), terminations, truncations, 0.9, 0.5
    )
    # by hand: R_3 = 3 + 0.9 * 7 = 9.3; R_2 = 0 (terminal); R_1 = 2 + 0.9 * 10 = 11; R_0 = 1 + 0.9
    # * (0.5 * 1 + 0.5 * 11) = 6.4
    torch.testing.assert_close(returns, torch.tensor([[6.4], [11.0], [0.0], [9.3]]))


def test_returns_are_the_recursion_and_doubling_equals_the_loop():
    """128 steps x 8 envs with episode ends, against the recursion in float64, to 1e-5."""
    g = torch.Generator().manual_seed(0)
    n, e = 128, 8
    terminations = (torch.rand(n, e, generator=g) < 0.02).float()
    truncations = (torch.rand(n, e, generator=g) < 0.01).float() * (1 - terminations)
    rewards, values = torch.randn(n, e, generator=g), torch.randn(n, e, generator=g)
    next_value = torch.randn(e, generator=g)
    next_values = torch.cat([values[1:], next_value[None]]) * (1 - terminations)
    dones = torch.maximum(terminations, truncations)
    expected = recursive_returns(rewards.double(), next_values.double(), dones, 0.99, 0.65)
    data = (rewards, values, next_value, terminations, truncations, 0.99, 0.65)
    for name, function in returns_functions(EAGER, TWIN).items():
        got = function(*data)
        torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-5, msg=name)


def build_update(module, seed=0, compile=False):
    """`module`'s update and Q network as `main` builds them (the twin's channels-last, RAdam's lr a
    tensor), compiled whole under `compile`."""
    torch.manual_seed(seed)
    learner = module.make_learner(module.Args(), 4, torch.device("cpu"))
    q_network, update = learner.q_network, learner.update
    if module.__name__.endswith(TWIN):
        assert q_network.network[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert torch.is_tensor(learner.optimizer.defaults["lr"])
    return torch.compile(update) if compile else update, q_network


@pytest.mark.slow  # compiles the update twice (24 s here)
def test_twin_update_compiled_or_not_equals_the_eager_twins():
    """Two steps on PPO Atari's minibatches: losses and mean Qs within 1e-5 relative, parameters
    within 1e-5 (float32 convolutions in another memory layout)."""
    eager_module, twin_module = load_script(EAGER), load_script(TWIN)
    updates = {"eager": build_update(eager_module), "twin": build_update(twin_module)}
    updates["twin-compiled"] = build_update(twin_module, compile=True)
    before = flat_parameters(updates["eager"][1])
    for seed in range(2):  # RAdam's moments carry over
        batch = make_minibatch(seed)
        # the eager twin stores float frames, a dict of tensors
        frames = {key: value.float() if key == "obs" else value for key, value in batch.items()}
        expected = updates["eager"][0](frames)
        for name in ("twin", "twin-compiled"):
            got = updates[name][0](batch.clone())
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=name)
    after = flat_parameters(updates["eager"][1])
    assert not torch.equal(after, before)
    for name in ("twin", "twin-compiled"):
        got = flat_parameters(updates[name][1])
        torch.testing.assert_close(got, after, rtol=1e-5, atol=1e-5, msg=name)


def test_no_recompilation_after_warmup():
    """The compiled policy (fed slices of a uint8 rollout, as the loop feeds it), returns and
    update, the learning rate annealed in place between iterations."""
    module = load_script(TWIN)
    torch.manual_seed(0)
    learner = module.make_learner(module.Args(), 4, torch.device("cpu"))
    policy = torch.compile(learner.policy, fullgraph=True)
    update = torch.compile(learner.update)
    returns_fn = torch.compile(module.q_lambda_returns, fullgraph=True)
    rollout_obs = torch.randint(0, 256, (4, 8, 4, 84, 84), dtype=torch.uint8)
    zeros = torch.zeros(4, 8)

    def iteration(seed):
        with torch.no_grad():
            for step in range(4):
                action, value = policy(rollout_obs[step])
            returns_fn(torch.randn(4, 8), torch.randn(4, 8), value, zeros, zeros, 0.99, 0.65)
        update(make_minibatch(seed))
        return action

    for seed in range(2):
        iteration(seed)
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed in range(2, 4):
            learner.optimizer.param_groups[0]["lr"].copy_(1e-4 * seed)
            action = iteration(seed)
    assert action.shape == (8,) and action.dtype == torch.long
    assert int(learner.global_step) == 4 * 4 * 8


@pytest.mark.parametrize("script", [EAGER, TWIN])
@pytest.mark.parametrize(
    "flags, words",
    [
        (("--env-id", "Breakout-v9"), ("--env-id", "Breakout-v9", "not one of envpool's Atari")),
        (("--env-id", "CartPole-v1"), ("--env-id", "CartPole-v1", "not one of envpool's Atari")),
        (("--num-envs", "0"), ("--num-envs", "positive")),
        (("--num-minibatches", "3"), ("--num-minibatches", "equal parts")),
        (("--total-timesteps", "512"), ("--total-timesteps", "one rollout")),
        (("--end-e", "2"), ("--end-e",)),
    ],
    ids=["unknown-task", "not-atari", "no-envs", "minibatches", "budget", "epsilon"],
)
def test_bad_input_exits_2(script, flags, words, refused):
    refused(script, flags, words)
