"""PPO (continuous actions): both twins run, GAE bootstraps truncations from the true final observation and
not terminations, the compiled GAE and update are the eager ones, nothing recompiles, bad input exits 2, and
both twins learn InvertedPendulum-v4."""


import pytest
import torch
from conftest import assert_user_error, load_script, requires_cuda, run_script, summary
from tensordict import TensorDict

EAGER, TWIN = "ppo_continuous_action", "ppo_continuous_action_torchcompile"
# Pendulum-v1 truncates every 200 steps: 640 steps are 10 iterations of 64, 3 episodes, 40 minibatch updates
SMOKE = ("--env-id", "Pendulum-v1", "--total-timesteps", "640", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2")


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile",))],
    ids=["eager", "twin", "twin-compile"],
)
def test_smoke(script, flags):
    result = summary(run_script(script, *SMOKE, "--measure-burnin", "2", *flags))
    assert result["script"] == script
    assert result["compile"] is ("--compile" in flags)
    assert (result["env_id"], result["total_timesteps"], result["num_envs"]) == ("Pendulum-v1", 640, 1)
    assert result["episodes"] == 3
    assert -2000 < result["return_mean"] < 0
    assert result["sps"] > 0 and result["sps_wall"] > 0


@pytest.mark.parametrize("script", [EAGER, TWIN])
def test_several_envs_log_every_episode(script):
    # two Pendulum envs truncate on the same step: 800 steps are 4 iterations of 100 vector steps, 2 episodes per env
    result = summary(run_script(script, *SMOKE[:2], "--total-timesteps", "800", "--num-steps", "100", "--num-envs", "2",
                                "--num-minibatches", "4", "--update-epochs", "1", "--measure-burnin", "1"))
    assert (result["num_envs"], result["total_timesteps"], result["episodes"]) == (2, 800, 4)


def gae_functions():
    eager, twin = load_script(EAGER), load_script(TWIN)
    return {"eager": eager.gae, "twin": twin.gae, "twin-compiled": torch.compile(twin.gae, fullgraph=True)}


def hand_made_rollout(final_value_truncated=10.0, final_value_terminated=99.0):
    """One env, 3 steps: step 1 is truncated (cut off, true final obs worth `final_value_truncated`), step 2
    terminates. `values[2]` is the value of the reset obs that follows the truncation."""
    return dict(
        rewards=torch.tensor([[1.0], [2.0], [3.0]]),
        values=torch.tensor([[0.5], [1.0], [1.5]]),
        next_value=torch.tensor([7.0]),
        final_values=torch.tensor([[0.0], [final_value_truncated], [final_value_terminated]]),
        terminations=torch.tensor([[0.0], [0.0], [1.0]]),
        truncations=torch.tensor([[0.0], [1.0], [0.0]]),
    )


@pytest.mark.parametrize("name", ["eager", "twin", "twin-compiled"])
def test_gae_bootstraps_truncation_from_final_obs_and_not_termination(name):
    gae = gae_functions()[name]
    gamma, lam = 0.9, 0.5
    advantages, returns = gae(**hand_made_rollout(), gamma=gamma, gae_lambda=lam)
    # by hand: delta_0 = 1 + 0.9 * V(s_1) - 0.5 = 1.4; delta_1 = 2 + 0.9 * 10 (the final obs, not the reset obs'
    # 1.5) - 1.0 = 10; delta_2 = 3 + 0 (terminal: neither 99 nor next_value 7) - 1.5 = 1.5. GAE stops at both ends:
    # A_2 = 1.5, A_1 = 10, A_0 = 1.4 + 0.9 * 0.5 * 10 = 5.9
    torch.testing.assert_close(advantages, torch.tensor([[5.9], [10.0], [1.5]]))
    torch.testing.assert_close(returns, advantages + torch.tensor([[0.5], [1.0], [1.5]]))
    # the truncated step's bootstrap moves with its final obs' value; the terminated step's does not
    more, _ = gae(**hand_made_rollout(final_value_truncated=20.0, final_value_terminated=-50.0), gamma=gamma, gae_lambda=lam)
    torch.testing.assert_close(more - advantages, torch.tensor([[0.9 * 0.5 * 9.0], [9.0], [0.0]]))


def test_doubling_gae_equals_the_reference_loop():
    """The twin's GAE (doubling, eager and compiled) against the eager twin's loop, on 1000 random steps of 3 envs
    with episode ends: float32 sums in another order agree to 1e-5."""
    functions = gae_functions()
    g = torch.Generator().manual_seed(0)
    n, e = 1000, 3
    terminations = (torch.rand(n, e, generator=g) < 0.01).float()
    truncations = (torch.rand(n, e, generator=g) < 0.01).float() * (1 - terminations)
    data = dict(
        rewards=torch.randn(n, e, generator=g),
        values=torch.randn(n, e, generator=g),
        next_value=torch.randn(e, generator=g),
        final_values=torch.randn(n, e, generator=g),
        terminations=terminations,
        truncations=truncations,
    )
    expected = functions["eager"](**data, gamma=0.99, gae_lambda=0.95)
    for name in ("twin", "twin-compiled"):
        for got, want in zip(functions[name](**data, gamma=0.99, gae_lambda=0.95), expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def build_update(module, compile_loss, seed=0, n_obs=3, n_act=2, lr=3e-4, functional=False):
    """The twin's agent, its Adam with a tensor learning rate and its update, from a fixed seed: the module update
    with fused Adam (`compile_loss`: its loss compiled, as on CUDA) or, with `functional`, the functional update
    compiled whole as `--compile` runs it on a CPU."""
    torch.manual_seed(seed)
    agent = module.Agent(n_obs, n_act)
    if functional:
        update, optimizer = module.make_functional_update(agent, torch.tensor(lr), module.Args())
        return (torch.compile(update, fullgraph=True) if compile_loss else update), agent, optimizer
    optimizer = torch.optim.Adam(agent.parameters(), lr=torch.tensor(lr), eps=1e-5, fused=True)
    return module.make_update(agent, optimizer, module.Args(), compile_loss=compile_loss), agent, optimizer


def make_minibatch(seed, size=64, n_obs=3, n_act=2):
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        obs=torch.randn(size, n_obs, generator=g),
        actions=torch.randn(size, n_act, generator=g),
        logprobs=torch.randn(size, generator=g) - 2.0,
        values=torch.randn(size, generator=g),
        advantages=torch.randn(size, generator=g),
        returns=torch.randn(size, generator=g),
        batch_size=[size],
    )


def flat_parameters(agent):
    return torch.cat([p.detach().flatten() for p in agent.parameters()])


@pytest.mark.parametrize("functional", [False, True], ids=["module-compiled-loss", "functional-compiled-whole"])
def test_compiled_update_equals_eager_update(functional):
    """The compiled update (the functional one is what `--compile` runs on a CPU) against the eager module update."""
    module = load_script(TWIN)
    eager, eager_agent, _ = build_update(module, False)
    compiled, compiled_agent, _ = build_update(module, True, functional=functional)
    before = flat_parameters(eager_agent)
    torch.testing.assert_close(flat_parameters(compiled_agent), before, rtol=0, atol=0)
    for seed in range(3):  # three steps: Adam's moments carry over
        batch = make_minibatch(seed)
        # float32, the same ops fused in another order: statistics agree to 1e-5 relative
        torch.testing.assert_close(compiled(batch.clone()), eager(batch), rtol=1e-5, atol=1e-6)
    after_eager, after_compiled = flat_parameters(eager_agent), flat_parameters(compiled_agent)
    assert not torch.equal(after_eager, before)
    # Adam moves a parameter by about lr * g / (|g| + eps): where g is tiny a last-bit difference in g shows up
    # as up to ~lr * 1e-2 in the parameter, so parameters agree to 1e-5 absolute (3% of lr)
    torch.testing.assert_close(after_compiled, after_eager, rtol=1e-5, atol=1e-5)


def test_host_policy_is_the_agents_policy_on_its_current_weights():
    """The numpy policy of the CPU fast path: the agent's log-density, entropy and value of the action it draws,
    a seeded Gaussian draw around the agent's mean, and still the agent's after an update changes the weights."""
    module = load_script(TWIN)
    update, agent, _ = build_update(module, False, functional=True)
    policy, get_value = module.make_host_policy(agent, seed=3)
    obs = torch.randn(4096, 3, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        action, logprob, entropy, value = policy(obs.numpy())
        with torch.no_grad():
            mean = agent.actor_mean(obs)
            _, agent_logprob, agent_entropy, agent_value = agent.get_action_and_value(obs, torch.from_numpy(action))
        torch.testing.assert_close(torch.from_numpy(logprob), agent_logprob, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.from_numpy(entropy), agent_entropy, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(torch.from_numpy(value), agent_value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.from_numpy(get_value(obs.numpy())), agent_value, rtol=1e-5, atol=1e-6)
        noise = (torch.from_numpy(action) - mean) / agent.actor_logstd.exp()
        assert abs(noise.mean()) < 0.03 and abs(noise.std() - 1) < 0.03
        update(make_minibatch(0, n_obs=3))  # in place: the policy's views see the new weights
    assert not torch.equal(agent.actor_logstd, torch.zeros_like(agent.actor_logstd))
    replay, _ = module.make_host_policy(agent, seed=3)
    fresh, _ = module.make_host_policy(agent, seed=3)
    assert (replay(obs.numpy())[0] == fresh(obs.numpy())[0]).all()


@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
def test_no_recompilation_after_warmup(functional):
    module = load_script(TWIN)
    update, agent, optimizer = build_update(module, compile_loss=True, functional=functional)
    gae = torch.compile(module.gae, fullgraph=True)
    rollout = hand_made_rollout()
    for seed in range(2):
        update(make_minibatch(seed))
        gae(**rollout, gamma=0.99, gae_lambda=0.95)
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed in range(2, 5):
            optimizer.param_groups[0]["lr"].copy_(1e-4 * seed)  # the annealed learning rate, in place
            update(make_minibatch(seed))
            gae(**hand_made_rollout(final_value_truncated=float(seed)), gamma=0.99, gae_lambda=0.95)
    assert optimizer.param_groups[0]["lr"].item() == pytest.approx(4e-4)


@pytest.mark.parametrize("script", [EAGER, TWIN])
@pytest.mark.parametrize(
    "flags, words",
    [
        (("--env-id", "NoSuchEnv-v0"), ("--env-id", "NoSuchEnv-v0")),
        (("--env-id", "CartPole-v1"), ("--env-id", "Discrete")),
        (("--num-steps", "0"), ("--num-steps",)),
        (("--num-steps", "100", "--num-minibatches", "3"), ("--num-steps", "--num-envs", "--num-minibatches")),
        (("--total-timesteps", "1000"), ("--total-timesteps", "--num-steps")),
        (("--num-steps", "32", "--num-minibatches", "32"), ("--num-minibatches",)),
    ],
    ids=["unknown-env", "discrete-env", "zero-steps", "minibatches-do-not-divide", "less-than-a-rollout", "minibatch-of-one"],
)
def test_bad_input_exits_2(script, flags, words):
    assert_user_error(run_script(script, *flags, timeout=120), *words)


@requires_cuda
@pytest.mark.parametrize("flags", [("--cudagraphs",), ("--compile", "--cudagraphs")], ids=["cudagraphs", "compile-cudagraphs"])
def test_cudagraphs_smoke(flags):
    result = summary(run_script(TWIN, *SMOKE, "--measure-burnin", "2", *flags))
    assert (result["device"], result["cudagraphs"], result["episodes"]) == ("cuda", True, 3)
    assert -2000 < result["return_mean"] < 0


@pytest.mark.learning
@pytest.mark.parametrize("script, flags", [(EAGER, ()), (TWIN, ("--compile",))], ids=["eager", "twin-compile"])
def test_learns_inverted_pendulum(script, flags):
    """40,960 steps (20 iterations of CleanRL's defaults): about 1 minute each on a 2-core CPU (the compiled twin
    ~60 s of which ~30 s compiling). A random policy balances the pole for ~5-10 steps, a PPO that does not learn
    stays far below 500; these runs reach the maximum, 1000. One intra-op thread (OMP_NUM_THREADS=1), as the twin
    sets itself: on a shared 2-core CPU the eager twin's default two threads ran ~18x slower (44 against 808 sps)."""
    flags = ("--env-id", "InvertedPendulum-v4", "--total-timesteps", "40960", "--seed", "1", *flags)
    result = summary(run_script(script, *flags, env={"OMP_NUM_THREADS": "1"}))
    assert result["total_timesteps"] == 40960
    assert result["return_mean"] > 500, result
