"""PPO on Atari (envpool): both twins run and count whole games, the written-out categorical is
torch's, GAE bootstraps truncations from envpool's final observation, the twin's update (compiled or
not) is the eager twin's, nothing recompiles, bad input exits 2."""

import functools

import numpy as np
import pytest
import torch
from conftest import load_script, requires_cuda, run_script, summary
from tensordict import TensorDict
from torch.distributions import Categorical

EAGER, TWIN = "ppo_atari_envpool", "ppo_atari_envpool_torchcompile"
# 8 Breakout games x 256 agent steps: random play loses a game in ~120-300 steps, so games end; 8
# iterations of 32 vector steps, 2 minibatches each
SMOKE = (
    "--total-timesteps 2048 --num-steps 32 --num-minibatches 2 --update-epochs 1 --measure-burnin 2"
)
SMOKE = tuple(SMOKE.split())


@functools.cache
def twin_smoke_run():
    """The twin's smoke run, made once a session: test_smoke reads it, and
    test_ppo_atari_envpool_async.py plays its games again."""
    return summary(run_script(TWIN, *SMOKE))


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile",))],
    ids=["eager", "twin", "twin-compile"],
)
def test_smoke(script, flags):
    result = twin_smoke_run() if (script, flags) == (TWIN, ()) else None
    result = result or summary(run_script(script, *SMOKE, *flags))
    assert result["script"] == script
    assert result["compile"] is ("--compile" in flags)
    assert (result["env_id"], result["total_timesteps"]) == ("Breakout-v5", 2048)
    assert result["num_envs"] == 8
    # a random policy scores 0-5 points in a Breakout game of 5 lives
    assert result["episodes"] >= 4
    assert 0 <= result["return_mean"] < 10
    # unclipped scores are whole points
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


def step_infos(reward, terminated):
    """The part of envpool's info that `finished_games` reads, for two envs."""
    return {
        "reward": np.array(reward, dtype=np.float32),
        "terminated": np.array(terminated, dtype=np.int32),
    }


@pytest.mark.parametrize("script", [EAGER, TWIN])
def test_a_game_is_counted_across_lives_with_unclipped_scores(script):
    finished_games = load_script(script).finished_games
    game_returns = np.zeros(2)
    no_truncation = np.array([False, False])
    # env 0 scores 4 (clipped to 1 for learning) then loses a life: the learner's episode ends, the
    # game goes on
    assert finished_games(game_returns, step_infos([4.0, 1.0], [0, 0]), no_truncation) == []
    # env 0 scores 7 more and loses its last life: one game of 11 points; env 1 is cut off on the
    # same step
    finished = finished_games(game_returns, step_infos([7.0, 2.0], [1, 0]), np.array([False, True]))
    assert finished == [11.0, 3.0]
    # both counters start again from 0
    assert finished_games(game_returns, step_infos([1.0, 0.0], [1, 0]), no_truncation) == [1.0]


def test_written_out_categorical_is_torchs():
    agent = load_script(TWIN).Agent(4)
    g = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8, generator=g)
    actions = torch.randint(0, 4, (16,), generator=g)
    with torch.no_grad():
        _, log_prob, entropy, value = agent.get_action_and_value(obs, actions)
        hidden = agent.network(obs.float() / 255.0)
        dist = Categorical(logits=agent.actor(hidden))
        torch.testing.assert_close(log_prob, dist.log_prob(actions))
        torch.testing.assert_close(entropy, dist.entropy())
        torch.testing.assert_close(value, agent.critic(hidden))


def test_gumbel_max_samples_follow_the_softmax():
    agent = load_script(TWIN).Agent(4)
    # the CNN's features left out (zeros): the logits are the actor's bias
    agent.network = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(1, 512).requires_grad_(False)
    )
    with torch.no_grad():
        agent.network[1].weight.zero_()
        agent.network[1].bias.zero_()
        agent.actor.bias.copy_(torch.tensor([0.0, 1.0, 2.0, -1.0]))
        obs = torch.zeros(20_000, 1, 1, 1, dtype=torch.uint8)
        torch.manual_seed(0)
        actions, log_prob, _, _ = agent.get_action_and_value(obs)
    frequencies = torch.bincount(actions, minlength=4) / len(actions)
    probs = log_prob.new_tensor([0.0, 1.0, 2.0, -1.0]).softmax(-1)
    # 20,000 draws: the standard error of a frequency is at most 0.0035
    torch.testing.assert_close(frequencies, probs, rtol=0, atol=0.015)


def gae_functions():
    eager, twin = load_script(EAGER), load_script(TWIN)
    return {
        "eager": eager.gae,
        "twin": twin.gae,
        "twin-compiled": torch.compile(twin.gae, fullgraph=True),
    }


@pytest.mark.parametrize("name", ["eager", "twin", "twin-compiled"])
def test_gae_bootstraps_truncation_from_the_final_obs_and_not_termination(name):
    """One env, 4 steps: step 1 is truncated, step 2 terminates. envpool returns the final
    observation after a done step, so values[2] (here 10) is the truncated episode's final obs,
    values[3] the terminated one's."""
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [10.0], [99.0]])
    terminations = torch.tensor([[0.0], [0.0], [1.0], [0.0]])
    truncations = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    gamma, lam = 0.9, 0.5
    advantages, returns = gae_functions()[name](
        rewards, values, torch.tensor([7.0]), terminations, truncations, gamma, lam
    )
    # by hand: delta_0 = 1 + 0.9 * 1 - 0.5 = 1.4; delta_1 = 2 + 0.9 * 10 - 1 = 10 (the final obs'
    # value); delta_2 = 0 + 0 (terminal) - 10 = -10; delta_3 = 3 + 0.9 * 7 - 99 = -89.7. GAE stops
    # after steps 1 and 2: A_3 = -89.7, A_2 = -10, A_1 = 10, A_0 = 1.4 + 0.45 * 10 = 5.9
    torch.testing.assert_close(advantages, torch.tensor([[5.9], [10.0], [-10.0], [-89.7]]))
    torch.testing.assert_close(returns, advantages + values)


def test_doubling_gae_equals_the_reference_loop():
    """The twin's GAE (doubling, eager and compiled) against the eager twin's loop, 128 steps x 8
    envs with episode ends: float32 sums in another order agree to 1e-5."""
    functions = gae_functions()
    g = torch.Generator().manual_seed(0)
    n, e = 128, 8
    terminations = (torch.rand(n, e, generator=g) < 0.02).float()
    truncations = (torch.rand(n, e, generator=g) < 0.01).float() * (1 - terminations)
    data = (
        torch.randn(n, e, generator=g),
        torch.randn(n, e, generator=g),
        torch.randn(e, generator=g),
        terminations,
        truncations,
    )
    expected = functions["eager"](*data, 0.99, 0.95)
    for name in ("twin", "twin-compiled"):
        for got, want in zip(functions[name](*data, 0.99, 0.95), expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def build_update(module, seed=0, **args):
    """`module`'s update, agent (channels-last in the twin, as its main builds it on a CPU) and
    Adam (fused, its learning rate a tensor, in the twin)."""
    torch.manual_seed(seed)
    learner = module.make_learner(module.Args(**args), 4, torch.device("cpu"))
    agent, optimizer = learner.agent, learner.optimizer
    if module.__name__.endswith(TWIN):
        assert agent.network[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert optimizer.defaults["fused"] and torch.is_tensor(optimizer.defaults["lr"])
    return learner.update, agent, optimizer


def make_minibatch(seed, size=32):
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        obs=torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8, generator=g),
        actions=torch.randint(0, 4, (size,), generator=g),
        logprobs=torch.randn(size, generator=g) - 1.4,
        values=torch.randn(size, generator=g),
        advantages=torch.randn(size, generator=g),
        returns=torch.randn(size, generator=g),
        batch_size=[size],
    )


def flat_parameters(agent):
    return torch.cat([p.detach().flatten() for p in agent.parameters()])


@pytest.mark.slow  # compiles the update twice (12 s here)
def test_twin_update_compiled_or_not_equals_the_eager_twins():
    eager_module, twin_module = load_script(EAGER), load_script(TWIN)
    updates = {
        "eager": build_update(eager_module),
        "twin": build_update(twin_module),
        "twin-compiled": build_update(twin_module, compile=True),
    }
    before = flat_parameters(updates["eager"][1])
    for seed in range(2):  # two steps: Adam's moments carry over
        batch = make_minibatch(seed)
        # the eager twin stores float frames, a dict of tensors
        expected = updates["eager"][0](
            {key: value.float() if key == "obs" else value for key, value in batch.items()}
        )
        for name in ("twin", "twin-compiled"):
            # float32, the same ops in another order or layout: statistics agree to 1e-5 relative
            torch.testing.assert_close(
                updates[name][0](batch.clone()), expected, rtol=1e-5, atol=1e-6
            )
    after = flat_parameters(updates["eager"][1])
    assert not torch.equal(after, before)
    for name in ("twin", "twin-compiled"):
        # Adam turns a last-bit gradient difference near 0 into up to ~lr * 1e-2 (see the PPO
        # continuous test)
        torch.testing.assert_close(flat_parameters(updates[name][1]), after, rtol=1e-5, atol=1e-5)


def test_no_recompilation_after_warmup():
    """The compiled update, GAE and acting policy, the policy fed slices of the rollout as the
    script feeds it."""
    module = load_script(TWIN)
    update, agent, optimizer = build_update(module, compile=True)
    policy = torch.compile(agent.get_action_and_value, fullgraph=True)
    gae = torch.compile(module.gae, fullgraph=True)
    rollout_obs = torch.randint(0, 256, (4, 8, 4, 84, 84), dtype=torch.uint8)
    zeros = torch.zeros(4, 8)

    def iteration(seed):
        with torch.no_grad():
            for step in range(2 if seed < 2 else 4):
                action, *_ = policy(rollout_obs[step])
        gae(torch.randn(4, 8), torch.randn(4, 8), torch.randn(8), zeros, zeros, 0.99, 0.95)
        update(make_minibatch(seed))
        return action

    for seed in range(2):
        iteration(seed)
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed in range(2, 4):
            # the annealed learning rate, in place
            optimizer.param_groups[0]["lr"].copy_(1e-4 * seed)
            action = iteration(seed)
    assert action.shape == (8,) and action.dtype == torch.long
    assert optimizer.param_groups[0]["lr"].item() == pytest.approx(3e-4)


@pytest.mark.parametrize("script", [EAGER, TWIN])
@pytest.mark.parametrize(
    "flags, words",
    [
        (
            ("--env-id", "Breakout-v9"),
            ("--env-id", "Breakout-v9", "not one of envpool's Atari games"),
        ),
        (
            ("--env-id", "CartPole-v1"),
            ("--env-id", "CartPole-v1", "not one of envpool's Atari games"),
        ),
        (("--num-envs", "0"), ("--num-envs", "positive")),
        (("--num-minibatches", "3"), ("--num-minibatches", "divisible")),
        (("--total-timesteps", "512"), ("--total-timesteps", "one rollout")),
    ],
    ids=["unknown-task", "not-atari", "no-envs", "minibatches", "budget"],
)
def test_bad_input_exits_2(script, flags, words, refused):
    refused(script, flags, words)
