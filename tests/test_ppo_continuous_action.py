"""PPO (continuous actions): the eager script, its twin and the CPU script run; GAE bootstraps
truncations from the true final observation and not terminations; the twin's compiled update is its
eager one and the CPU script's functional update is the eager script's module update, and nothing
recompiles; the numpy policy is the agent's; bad input exits 2; the eager and CPU scripts learn
InvertedPendulum-v4. Saving, evaluating and loading another script's model are in
test_run_folder.py, `--env-id`'s forms in test_contract.py."""

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro
from conftest import (
    assert_measured_threads,
    assert_user_error,
    load_script,
    requires_cuda,
    run_script,
    summary,
)
from tensordict import TensorDict

EAGER = "ppo_continuous_action"
TWIN, CPU = f"{EAGER}_torchcompile", f"{EAGER}_cpu"
# Pendulum-v1 truncates every 200 steps: 640 steps are 10 iterations of 64, 3 episodes, 40 minibatch
# updates
PENDULUM = ("--env-id", "Pendulum-v1")
SMOKE = (*PENDULUM, *"--total-timesteps 640 --num-steps 64 --num-minibatches 2".split())
SMOKE += ("--update-epochs", "2")
CPU_DEVICE = torch.device("cpu")
# gymnasium's `module:EnvId` form: gym.make imports the module, then makes the env it registers
MODULE_PENDULUM = "gymnasium.envs.classic_control:Pendulum-v1"


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile",))],
    ids=["eager", "twin", "twin-compile"],
)
def test_smoke(script, flags):
    """The CPU script's smoke runs are test_several_envs_log_every_episode's (`--no-compile`) and
    the learning check's (compiled, its summary checked as here)."""
    result = summary(run_script(script, *SMOKE, "--measure-burnin", "2", *flags))
    assert result["script"] == script
    assert result["compile"] is ("--compile" in flags)
    assert (result["env_id"], result["total_timesteps"]) == ("Pendulum-v1", 640)
    assert result["num_envs"] == 1
    assert result["episodes"] == 3
    assert -2000 < result["return_mean"] < 0
    assert result["sps"] > 0 and result["sps_wall"] > 0


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (CPU, ("--no-compile",))],
    ids=["eager", "twin", "cpu"],
)
def test_several_envs_log_every_episode(script, flags):
    """Two Pendulum envs truncate on the same step: 4 iterations of 100 vector steps, 2 episodes
    per env. The env is named in `module:EnvId` form; the run folder's name drops the ':'."""
    budget = "--total-timesteps 800 --num-steps 100 --num-envs 2 --num-minibatches 4"
    flags = ("--env-id", MODULE_PENDULUM, *budget.split(), *flags)
    result = summary(run_script(script, *flags, *"--update-epochs 1 --measure-burnin 1".split()))
    got = (result["env_id"], result["num_envs"], result["total_timesteps"], result["episodes"])
    assert got == (MODULE_PENDULUM, 2, 800, 4)
    assert ":" not in Path(result["summary_file"]).parent.name


def hand_made_rollout(final_value_truncated=10.0, final_value_terminated=99.0):
    """One env, 3 steps: step 1 is truncated (cut off, true final obs worth
    `final_value_truncated`), step 2 terminates. `values[2]` is the value of the reset obs that
    follows the truncation."""
    return dict(
        rewards=torch.tensor([[1.0], [2.0], [3.0]]),
        values=torch.tensor([[0.5], [1.0], [1.5]]),
        next_value=torch.tensor([7.0]),
        final_values=torch.tensor([[0.0], [final_value_truncated], [final_value_terminated]]),
        terminations=torch.tensor([[0.0], [0.0], [1.0]]),
        truncations=torch.tensor([[0.0], [1.0], [0.0]]),
    )


@pytest.mark.parametrize("script", [EAGER, TWIN, CPU])
def test_gae_bootstraps_truncation_from_final_obs_and_not_termination(script):
    """Each script's GAE as written (the compiled one is held to the eager loop below)."""
    gae = load_script(script).gae
    gamma, lam = 0.9, 0.5
    advantages, returns = gae(**hand_made_rollout(), gamma=gamma, gae_lambda=lam)
    # by hand: delta_0 = 1 + 0.9 * V(s_1) - 0.5 = 1.4; delta_1 = 2 + 0.9 * 10 (the final obs, not
    # the reset obs' 1.5) - 1.0 = 10; delta_2 = 3 + 0 (terminal: neither 99 nor next_value 7) - 1.5
    # = 1.5. GAE stops at both ends: A_2 = 1.5, A_1 = 10, A_0 = 1.4 + 0.9 * 0.5 * 10 = 5.9
    torch.testing.assert_close(advantages, torch.tensor([[5.9], [10.0], [1.5]]))
    torch.testing.assert_close(returns, advantages + torch.tensor([[0.5], [1.0], [1.5]]))
    # the truncated step's bootstrap moves with its final obs' value; the terminated step's does not
    more, _ = gae(
        **hand_made_rollout(final_value_truncated=20.0, final_value_terminated=-50.0),
        gamma=gamma,
        gae_lambda=lam,
    )
    torch.testing.assert_close(more - advantages, torch.tensor([[0.9 * 0.5 * 9.0], [9.0], [0.0]]))


def test_doubling_gae_equals_the_reference_loop():
    """The twin's and the CPU script's GAE (doubling; the twin's also compiled) against the eager
    script's loop, on 1000 random steps of 3 envs with episode ends: float32 sums in another order
    agree to 1e-5."""
    twin = load_script(TWIN)
    functions = [twin.gae, load_script(CPU).gae, torch.compile(twin.gae, fullgraph=True)]
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
    expected = load_script(EAGER).gae(**data, gamma=0.99, gae_lambda=0.95)
    for gae in functions:
        for got, want in zip(gae(**data, gamma=0.99, gae_lambda=0.95), expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


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


def same_start(*learners):
    """`learners` with the first one's weights: every script's agent has the same state_dict keys.
    Loading copies in place, so the weights' views (acting, optimizers.py's Adam) stay valid."""
    for learner in learners[1:]:
        learner.agent.load_state_dict(learners[0].agent.state_dict())
    return learners


def run_updates(updates, set_lrs, steps=5, warmup=2):
    """Each of `updates` on the same minibatches, their statistics per step. The learning rate is
    annealed in place (`set_lrs(lr)`) before each step after the first; after `warmup` steps a
    recompilation fails the test."""
    stats = []
    for step in range(steps):
        if step:
            set_lrs(3e-4 * (1 - step / (2 * steps)))
        with torch.compiler.set_stance("fail_on_recompile" if step >= warmup else "default"):
            stats.append([update(make_minibatch(step)) for update in updates])
    return stats


def test_twin_compiled_update_equals_eager_update_without_recompiling():
    """The twin's update with its loss compiled (what `--compile` runs) against the same update run
    eagerly: five steps from the same weights, the learning rate annealed in place; after two
    warm-up steps nothing recompiles, neither the update nor GAE."""
    module = load_script(TWIN)
    torch.manual_seed(0)
    learners = same_start(
        *(module.make_learner(module.Args(compile=c), 3, 2, CPU_DEVICE) for c in (False, True))
    )
    eager_agent, compiled_agent = (learner.agent for learner in learners)
    updates = [learner.update for learner in learners]
    before = flat_parameters(eager_agent)

    def set_lrs(lr):
        for learner in learners:
            learner.optimizer.param_groups[0]["lr"].copy_(lr)

    for eager, compiled in run_updates(updates, set_lrs):
        # float32, the same ops fused in another order: statistics agree to 1e-5 relative
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    assert not torch.equal(flat_parameters(eager_agent), before)
    # Adam moves a parameter by about lr * g / (|g| + eps): where g is tiny a last-bit difference in
    # g shows up as up to ~lr * 1e-2 in the parameter, so parameters agree to 1e-5 absolute (3% of
    # lr)
    compiled, eager = flat_parameters(compiled_agent), flat_parameters(eager_agent)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    gae = torch.compile(module.gae, fullgraph=True)
    for seed in range(2):
        gae(**hand_made_rollout(final_value_truncated=float(seed)), gamma=0.99, gae_lambda=0.95)
    with torch.compiler.set_stance("fail_on_recompile"):
        gae(**hand_made_rollout(final_value_truncated=5.0), gamma=0.99, gae_lambda=0.95)


@pytest.mark.slow  # compiles the functional update (19 s here)
def test_cpu_functional_update_equals_eager_scripts_update_without_recompiling():
    """The CPU script's functional update (torch.func gradients, the clip written out,
    optimizers.Adam), eager and compiled whole, against the eager script's module update (autograd,
    clip_grad_norm_, torch.optim.Adam) from the same weights: five steps, the learning rate annealed
    in place (a tensor in the CPU script, a float in the eager one); after two warm-up steps the
    compiled update does not recompile. Statistics agree to 1e-5 relative (float32, the same math in
    another order, and torch.distributions' log-density against the written-out one); parameters to
    1e-5 absolute (Adam turns a last-bit difference in a tiny gradient into up to ~lr * 1e-2)."""
    eager, cpu = load_script(EAGER), load_script(CPU)
    torch.manual_seed(0)
    module_learner, *functional = same_start(
        eager.make_learner(eager.Args(), 3, 2, CPU_DEVICE),
        *(cpu.make_learner(cpu.Args(), 3, 2, CPU_DEVICE) for _ in range(2)),
    )
    eager_agent, agents = module_learner.agent, [learner.agent for learner in functional]
    updates = [module_learner.update, functional[0].update]
    updates.append(torch.compile(functional[1].update, fullgraph=True))
    before = flat_parameters(eager_agent)

    def set_lrs(lr):
        module_learner.optimizer.param_groups[0]["lr"] = lr
        for learner in functional:
            learner.optimizer.param_groups[0]["lr"].copy_(lr)

    for module_stats, functional_stats, compiled_stats in run_updates(updates, set_lrs):
        torch.testing.assert_close(functional_stats, module_stats, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled_stats, functional_stats, rtol=1e-5, atol=1e-6)
    assert not torch.equal(flat_parameters(eager_agent), before)
    for agent in agents:
        torch.testing.assert_close(
            flat_parameters(agent), flat_parameters(eager_agent), rtol=1e-5, atol=1e-5
        )


def test_host_policy_is_the_agents_policy_on_its_current_weights():
    """The CPU script's numpy policy (the one place that restates the actor) against its torch
    agent: the action is the agent's mean plus its std times the numpy generator's draws (the
    same noise), and its log-density, entropy and value are the agent's for that action; still
    so after an update changes the weights in place."""
    module = load_script(CPU)
    torch.manual_seed(0)
    learner = module.make_learner(module.Args(seed=3), 3, 2, CPU_DEVICE)
    agent, update = learner.agent, learner.update
    policy, get_value = learner.policy, learner.get_value
    noise = np.random.default_rng(3)  # the draws the policy makes, in the same order
    obs = torch.randn(256, 3, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        action, logprob, entropy, value = policy(obs.numpy())
        with torch.no_grad():
            mean, std = agent.actor_mean(obs), agent.actor_logstd.exp()
            _, agent_logprob, agent_entropy, agent_value = agent.get_action_and_value(
                obs, torch.from_numpy(action)
            )
        draws = torch.from_numpy(noise.standard_normal((256, 2), dtype=np.float32))
        action = torch.from_numpy(action)
        torch.testing.assert_close(action, mean + std * draws, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.from_numpy(logprob), agent_logprob, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.from_numpy(entropy), agent_entropy, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(torch.from_numpy(value), agent_value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            torch.from_numpy(get_value(obs.numpy())), agent_value, rtol=1e-5, atol=1e-6
        )
        update(make_minibatch(0))  # in place: the policy's views see the new weights
    assert not torch.equal(agent.actor_logstd, torch.zeros_like(agent.actor_logstd))


def test_cpu_wrappers_normalize_as_cleanrls_bit_for_bit():
    """The CPU script's running statistics (updated without np.mean and np.var) against
    gymnasium's: its wrapped env and the eager script's, stepped with the same actions through
    episode ends, give the same observations, rewards and statistics, bit for bit."""
    envs = [
        load_script(script).wrap(gym.make("Pendulum-v1"), gamma=0.99) for script in (EAGER, CPU)
    ]
    statistics = [env.get_wrapper_attr("obs_rms") for env in envs]
    assert type(statistics[1]) is not type(statistics[0])
    steps = [[env.reset(seed=5)[0]] for env in envs]
    actions = np.random.default_rng(0).uniform(-3, 3, size=(450, 1)).astype(np.float32)
    for action in actions:  # Pendulum-v1 truncates at 200 steps
        for env, outputs in zip(envs, steps):
            obs, reward, terminated, truncated, _ = env.step(action)
            outputs += [obs, reward]
            if truncated:
                outputs.append(env.reset()[0])
    for eager, cpu in zip(*steps, strict=True):
        assert np.asarray(eager).dtype == np.asarray(cpu).dtype
        np.testing.assert_array_equal(eager, cpu)
    # the observations of 450 steps and 3 resets, the rewards of 450 steps
    for name, count in (("obs_rms", 453), ("return_rms", 450)):
        eager, cpu = (env.get_wrapper_attr(name) for env in envs)
        np.testing.assert_array_equal(eager.mean, cpu.mean)
        np.testing.assert_array_equal(eager.var, cpu.var)
        assert eager.count == cpu.count == pytest.approx(count + 1e-4)


@pytest.mark.parametrize("script", [EAGER, TWIN, CPU])
@pytest.mark.parametrize(
    "flags, words",
    [
        (("--num-steps", "0"), ("--num-steps",)),
        (
            ("--num-steps", "100", "--num-minibatches", "3"),
            ("--num-steps", "--num-envs", "--num-minibatches"),
        ),
        (("--total-timesteps", "1000"), ("--total-timesteps", "--num-steps")),
        (("--num-steps", "32", "--num-minibatches", "32"), ("--num-minibatches",)),
    ],
    ids=["zero-steps", "minibatches-do-not-divide", "less-than-a-rollout", "minibatch-of-one"],
)
def test_bad_flags_exit_2(script, flags, words, capsys):
    """`main` checks its flags before it makes anything, so this runs in process: exit 2 and one
    line on stderr naming the flags."""
    module = load_script(script)
    with pytest.raises(SystemExit) as stopped:
        module.main(tyro.cli(module.Args, args=list(flags)))
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in words), lines


@pytest.mark.parametrize("script", [EAGER, TWIN, CPU])
def test_an_action_space_other_than_box_exits_2(script):
    """A whole run: the env is refused before training, with one line (unknown ids and missing
    modules are refused in test_contract.py, for every script)."""
    assert_user_error(
        run_script(script, "--env-id", "CartPole-v1", timeout=120), "--env-id", "Discrete"
    )


@requires_cuda
@pytest.mark.parametrize(
    "flags",
    [("--cudagraphs",), ("--compile", "--cudagraphs")],
    ids=["cudagraphs", "compile-cudagraphs"],
)
def test_cudagraphs_smoke(flags):
    result = summary(run_script(TWIN, *SMOKE, "--measure-burnin", "2", *flags))
    assert (result["device"], result["cudagraphs"], result["episodes"]) == ("cuda", True, 3)
    assert -2000 < result["return_mean"] < 0


@pytest.mark.learning
def test_the_cpu_script_learns_inverted_pendulum():
    """The CPU script, 40,960 steps, one thread: the last 20 episodes above 500. Seeds 1-10 gave
    673.2 to 1000 (Xeon), the eager script 909.6 to 1000; random play balances ~5-10 steps."""
    flags = ("--env-id", "InvertedPendulum-v4", "--total-timesteps", "40960", "--seed", "1")
    result = summary(run_script(CPU, *flags, env={"OMP_NUM_THREADS": "1"}))
    assert result["total_timesteps"] == 40960
    assert result["return_mean"] > 500, result
    # what a smoke run checks of the CPU script compiled (test_smoke runs the other two scripts):
    # compiled by default, on the CPU, on the threads it measured
    assert (result["script"], result["compile"], result["cudagraphs"]) == (CPU, True, False)
    assert result["device"] == "cpu" and result["sps"] > 0 and result["sps_wall"] > 0
    assert_measured_threads(result)
