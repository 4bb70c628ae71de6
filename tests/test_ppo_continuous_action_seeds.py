"""PPO's seeds script (continuous actions), N runs as one vmapped program: each member's update is
the CPU script's on its own parameters, Adam state and minibatch (eager and compiled, no
recompilation), reset steps weighing nothing, independent of the other members; members start from
the CPU script's weights for their seeds; the numpy envpool wrappers are gymnasium's per env; the
members learn; the per-member summary, model files the single-seed scripts evaluate, bad inputs."""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import assert_every_member_replays, load_script, long_learning, run_script, summary
from test_ppo_continuous_action import make_minibatch

SEEDS_SCRIPT, CPU_SCRIPT = "ppo_continuous_action_seeds", "ppo_continuous_action_cpu"
SEEDS = [1, 2, 3]
CPU = torch.device("cpu")
# Pendulum-v1 truncates every 200 steps: 640 steps per member are 10 iterations of 64, 3 episodes,
# 40 updates
SMOKE = "--env-id Pendulum-v1 --total-timesteps 640 --num-steps 64 --num-minibatches 2".split()


def stacked_minibatches(step, members=3):
    """A minibatch per member (test_ppo_continuous_action's, a different one each) and the same
    stacked on a seeds axis with `valid` (1: a step; 0: an envpool reset step), as the seeds
    update takes them. Member 1's first 8 rows are reset steps: the single-seed update gets its
    other 56 rows."""
    minibatches = [make_minibatch(10 * step + k) for k in range(members)]
    stacked = torch.stack(minibatches)
    stacked["valid"] = torch.ones(stacked.shape)
    stacked["valid"][1, :8] = 0
    minibatches[1] = minibatches[1][8:]
    return minibatches, stacked


def build_seeds_learner(seeds=SEEDS, **flags):
    """The seeds script's optimizer and update with `flags` for the members `seeds` (3
    observations, 2 actions)."""
    mod = load_script(SEEDS_SCRIPT)
    learner = mod.make_learner(mod.Args(num_seeds=1, **flags), 3, 2, seeds, CPU)
    return learner.optimizer, learner.update


# a sweep of two values of the learning rate and of the loss's coefficients (16 settings, a member
# each), with a norm that clips every gradient
SWEEP = dict(learning_rate=(3e-4, 3e-3), clip_coef=(0.2, 0.05), ent_coef=(0.0, 0.05))
SWEEP |= dict(vf_coef=(0.5, 2.0), max_grad_norm=0.1)


def build_cpu_update(params, member, **flags):
    """ppo_continuous_action_cpu.py's functional update with `flags` on a copy of member `member`'s
    parameters (a fresh Adam, as the seeds update's); returns it, its Adam and its agent."""
    mod = load_script(CPU_SCRIPT)
    learner = mod.make_learner(mod.Args(**flags), 3, 2, CPU)
    learner.agent.load_state_dict({name: param[member] for name, param in params.items()})
    return learner.update, learner.optimizer, learner.agent


def test_each_member_starts_from_the_weights_of_the_cpu_script_with_its_seed():
    """Member k's agent is the one the CPU script builds after seeding torch with `seed + k` (as its
    Run does), and building the members leaves the global generator as it was."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    optimizer, _ = build_seeds_learner()
    assert torch.equal(torch.get_rng_state(), before)
    for member, seed in enumerate(SEEDS):
        torch.manual_seed(seed)
        expected = load_script(CPU_SCRIPT).Agent(3, 2).state_dict()
        assert all(
            torch.equal(optimizer.params[name][member], value) for name, value in expected.items()
        ), seed


@pytest.mark.slow  # compiles both updates (16 s here)
def test_each_members_update_is_the_cpu_scripts_update_on_its_inputs_eager_and_compiled():
    """Four steps of a 16-member sweep (SWEEP), lr annealed in place, eager and compiled as main
    compiles it, against the CPU script's update with each member's flags on its own state and
    minibatch (member 1's without its 8 reset steps): statistics within 1e-5 relative, parameters
    within 1e-6 absolute (a step moves them by ~lr); from the third call on nothing recompiles."""
    seeds = list(range(16))
    optimizer, update = build_seeds_learner(seeds, **SWEEP)
    compiled_optimizer, compiled_update = build_seeds_learner(seeds, **SWEEP)
    compiled_update = torch.compile(compiled_update, fullgraph=True, options={"cpp_wrapper": True})
    settings = load_script(SEEDS_SCRIPT).settings(load_script(SEEDS_SCRIPT).Args(**SWEEP))
    singles = [
        build_cpu_update(optimizer.params, member, **{k: getattr(setting, k) for k in SWEEP})
        for member, setting in enumerate(settings)
    ]
    rates = torch.tensor([setting.learning_rate for setting in settings])
    start = {name: param.clone() for name, param in optimizer.params.items()}
    for step in range(4):
        for adam in (optimizer, compiled_optimizer):
            adam.param_groups[0]["lr"].copy_(rates * (1 - step / 8))
        for rate, (_, adam, _) in zip(rates.tolist(), singles):
            adam.param_groups[0]["lr"].copy_(rate * (1 - step / 8))
        minibatches, stacked = stacked_minibatches(step, len(seeds))
        expected = [single_update(mb) for (single_update, _, _), mb in zip(singles, minibatches)]
        with torch.compiler.set_stance("fail_on_recompile" if step >= 2 else "default"):
            results = [(update(stacked), optimizer), (compiled_update(stacked), compiled_optimizer)]
        for stats, adam in results:
            assert stats.shape == (len(seeds), 6)
            for member, (_, _, agent) in enumerate(singles):
                torch.testing.assert_close(
                    stats[member], expected[member], rtol=1e-5, atol=1e-6, msg=f"step {step}"
                )
                for name, reference in agent.state_dict().items():
                    torch.testing.assert_close(
                        adam.params[name][member], reference, rtol=0, atol=1e-6, msg=name
                    )
    params = optimizer.params
    assert all(not torch.equal(params[n][k], start[n][k]) for n in start for k in range(len(seeds)))


def test_a_members_update_depends_on_its_own_minibatch_alone():
    """Two seeds updates from the same state, on the same minibatches except member 0's: members 1
    and 2 come out with exactly the same statistics and parameters (bit for bit), member 0 with
    others."""
    outcomes = []
    for changed in (False, True):
        optimizer, update = build_seeds_learner()
        _, stacked = stacked_minibatches(0)
        if changed:
            stacked[0]["obs"] += 1.0
            stacked[0]["advantages"] *= -1
        outcomes.append((update(stacked), optimizer.params))
    (stats, params), (stats_changed, params_changed) = outcomes
    assert torch.equal(stats[1:], stats_changed[1:])
    assert all(torch.equal(params[name][1:], params_changed[name][1:]) for name in params)
    assert not torch.equal(stats[0], stats_changed[0])
    name = "actor_mean.0.weight"
    assert not torch.equal(params[name][0], params_changed[name][0])


def test_members_draw_their_own_noise_and_act_with_their_own_parameters():
    """The policy under the real generator, 4 envs per member. Members with weights of their own: at
    a vanishing std each member's actions are its own actor's mean and its values its own critic's
    (no member reads another's slice). Members with the same weights and observations: their actions
    differ (vmap's randomness="different"). The update draws nothing (vmap's default randomness
    refuses)."""
    mod = load_script(SEEDS_SCRIPT)
    learner = mod.make_learner(mod.Args(num_seeds=len(SEEDS)), 3, 2, SEEDS, CPU)
    policy, params, obs = learner.policy, learner.params, torch.randn(4, 3)
    params["actor_logstd"].fill_(-30.0)
    actions, _, _, values = policy(obs.repeat(len(SEEDS), 1))
    for member in range(len(SEEDS)):
        agent = mod.Agent(3, 2)
        agent.load_state_dict({name: param[member] for name, param in params.items()})
        with torch.no_grad():
            own = slice(4 * member, 4 * member + 4)
            torch.testing.assert_close(actions[own], agent.actor_mean(obs), rtol=0, atol=1e-6)
            torch.testing.assert_close(values[own], agent.critic(obs), rtol=0, atol=1e-6)
    for param in params.values():
        param.copy_(param[0].expand_as(param).clone())  # every member is member 0
    params["actor_logstd"].fill_(0.0)
    actions = policy(obs.repeat(len(SEEDS), 1))[0].unflatten(0, (len(SEEDS), 4))
    assert not torch.equal(actions[0], actions[1]) and not torch.equal(actions[1], actions[2])


def test_a_member_with_one_valid_row_or_none_stays_finite():
    """envpool's reset steps weigh 0, so a minibatch may hold one valid row of a member, or none:
    the masked means and the advantage std are then 0, not nan. Member 0 with one valid row keeps
    finite weights, member 1 with none reports zeros and keeps its weights (a zero gradient), member
    2 updates exactly as beside members with full minibatches."""
    outcomes = []
    for sparse in (False, True):
        optimizer, update = build_seeds_learner()
        start = {name: param.clone() for name, param in optimizer.params.items()}
        _, stacked = stacked_minibatches(0)
        stacked["valid"][:] = 1
        if sparse:
            stacked["valid"][:2] = 0
            stacked["valid"][0, 5] = 1
        outcomes.append((update(stacked), optimizer.params))
    (stats, params), (stats_sparse, params_sparse) = outcomes
    assert stats_sparse.isfinite().all() and all(p.isfinite().all() for p in params_sparse.values())
    assert torch.equal(stats_sparse[1], torch.zeros(6))
    assert all(torch.equal(params_sparse[name][1], start[name][1]) for name in start)
    assert stats_sparse[0, 1] > 0  # the value loss of member 0's one row
    assert torch.equal(stats_sparse[2], stats[2])
    assert all(torch.equal(params_sparse[name][2], params[name][2]) for name in start)


def test_a_nan_member_leaves_the_others_as_they_were_bit_for_bit():
    """Member 0's weights turn nan: three updates and the policy raise nothing, give member 0 nan
    statistics and actions, and give members 1 and 2 the statistics, parameters and actions they
    have without it, bit for bit (the same draws): the clipped norm and the sum of the losses are
    each member's own."""
    outcomes = []
    for poisoned in (False, True):
        mod = load_script(SEEDS_SCRIPT)
        learner = mod.make_learner(mod.Args(num_seeds=len(SEEDS)), 3, 2, SEEDS, CPU)
        optimizer, policy, update = learner.optimizer, learner.policy, learner.update
        if poisoned:
            optimizer.params["actor_mean.2.weight"][0, 1, 3] = float("nan")
        stats = torch.stack([update(stacked_minibatches(step)[1]) for step in range(3)])
        torch.manual_seed(0)
        outcomes.append((stats, optimizer.params, policy(torch.randn(len(SEEDS) * 4, 3))[0]))
    (stats, params, actions), (stats_nan, params_nan, actions_nan) = outcomes
    assert stats_nan[:, 0, 0].isnan().all() and stats_nan[-1, 0, 1].isnan()
    assert actions_nan[:4].isnan().any()
    assert torch.equal(stats[:, 1:], stats_nan[:, 1:]) and torch.equal(actions[4:], actions_nan[4:])
    assert all(torch.equal(params[name][1:], params_nan[name][1:]) for name in params)


def test_gae_with_each_envs_gamma_and_lambda_is_the_cpu_scripts_per_env():
    """A sweep's GAE: 300 random steps of 4 envs with episode ends, each env with a gamma and a
    lambda of its own (tensors [envs]), against the CPU script's GAE of each env alone with its
    numbers: the same within float32 rounding (1e-5)."""
    g = torch.Generator().manual_seed(0)
    n, e = 300, 4
    terminations = (torch.rand(n, e, generator=g) < 0.02).float()
    truncations = (torch.rand(n, e, generator=g) < 0.02).float() * (1 - terminations)
    data = dict(rewards=torch.randn(n, e, generator=g), values=torch.randn(n, e, generator=g))
    data |= dict(
        next_value=torch.randn(e, generator=g), final_values=torch.randn(n, e, generator=g)
    )
    data |= dict(terminations=terminations, truncations=truncations)
    gammas, lambdas = [0.99, 0.9, 0.99, 0.5], [0.95, 0.95, 0.5, 1.0]
    got = load_script(SEEDS_SCRIPT).gae(
        **data, gamma=torch.tensor(gammas), gae_lambda=torch.tensor(lambdas)
    )
    for env, (gamma, lam) in enumerate(zip(gammas, lambdas)):
        own = {key: value[..., env : env + 1] for key, value in data.items()}
        want = load_script(CPU_SCRIPT).gae(**own, gamma=gamma, gae_lambda=lam)
        for x, y in zip(got, want):
            torch.testing.assert_close(x[:, env : env + 1], y, rtol=1e-5, atol=1e-5)


class ScriptedPool:
    """envpool's interface for two envs replaying raw steps (observations, rewards, ends) in
    next-step autoreset: the step after an episode's end returns the next episode's first
    observation, with reward 0 and no end."""

    action_space = gym.spaces.Box(-2.0, 2.0, (1,))
    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,))

    def __init__(self, obs, rewards, terminations, truncations):
        self.obs, self.rewards, self.terminations, self.truncations = (
            obs,
            rewards,
            terminations,
            truncations,
        )
        self.t = 0

    def reset(self):
        return self.obs[0], {}

    def close(self):
        pass

    def step(self, actions):
        self.t += 1
        resetting = self.terminations[self.t - 1] | self.truncations[self.t - 1]
        rewards = np.where(resetting, 0.0, self.rewards[self.t])
        return self.obs[self.t], rewards, self.terminations[self.t], self.truncations[self.t], {}


def replay(env, obs, reward=None, terminated=False, truncated=False):
    """One raw reset (`reward` None) or step through gymnasium's wrappers of `env`: the wrapped
    (obs, reward, finished returns)."""
    unwrapped = env.unwrapped
    unwrapped.reset = lambda **kwargs: (obs, {})
    unwrapped.step = lambda action: (obs, reward, terminated, truncated, {})
    if reward is None:
        return env.reset()[0], 0.0, []
    obs, reward, _, _, info = env.step(np.zeros(1, dtype=np.float32))
    return obs, reward, [info["episode"]["r"]] if "episode" in info else []


def test_the_numpy_wrappers_are_the_cpu_scripts_gymnasium_wrappers_per_env():
    """EnvpoolWrappers against the CPU script's gymnasium wrappers per env (vector_envs.make_envs),
    each env with a gamma of its own, on the same raw steps (env 0 terminates at step 3, env 1
    truncates at step 5): observations and rewards to 1e-6 (float64 statistics), finished returns
    exactly."""
    mod = load_script(SEEDS_SCRIPT)
    rng = np.random.default_rng(0)
    # as envpool's
    obs, rewards = rng.uniform(-1, 1, (9, 2, 3)).astype(np.float32), rng.standard_normal((9, 2)) * 3
    terminations, truncations = np.zeros((9, 2), dtype=bool), np.zeros((9, 2), dtype=bool)
    terminations[3, 0], truncations[5, 1] = True, True
    pool = ScriptedPool(obs, rewards, terminations, truncations)
    wrappers = mod.EnvpoolWrappers(pool, 2, np.array([0.99, 0.8]))
    cpu = load_script(CPU_SCRIPT)
    wraps = [functools.partial(cpu.wrap, gamma=gamma) for gamma in (0.99, 0.8)]
    envs = [cpu.make_envs("Pendulum-v1", 1, 0, wrap=wrap).envs[0] for wrap in wraps]
    outputs = [wrappers.reset()[0], np.zeros(2), [[], []]]
    expected = [replay(env, obs[0, e]) for e, env in enumerate(envs)]
    for t in range(9):
        if t:
            next_obs, rewards_out, _, _, infos = wrappers.step(np.zeros((2, 1), dtype=np.float32))
            # two members of one env
            outputs = (next_obs, rewards_out, mod.finished_member_episodes(infos, 2))
            # envpool's reset step; gymnasium's reset
            resetting = terminations[t - 1] | truncations[t - 1]
            raw = [
                (
                    obs[t, e],
                    None if resetting[e] else rewards[t, e],
                    terminations[t, e],
                    truncations[t, e],
                )
                for e in range(2)
            ]
            expected = [replay(env, *raw[e]) for e, env in enumerate(envs)]
        for e, (expected_obs, expected_reward, expected_finished) in enumerate(expected):
            np.testing.assert_allclose(outputs[0][e], expected_obs, 1e-6, 1e-6, err_msg=f"step {t}")
            assert outputs[1][e] == pytest.approx(expected_reward, rel=1e-6, abs=1e-6)
            assert outputs[2][e] == expected_finished


@long_learning
def test_the_members_learn_inverted_pendulum():
    """Three members as a user runs them, at test_ppo_continuous_action.py's budget and bar: the
    members' mean last-20 return above 500 (seeds 1-12 gave members 800.8 to 1000, 3-member means
    901.6 to 949.1; a random policy balances ~5-10 steps)."""
    flags = "--env-id InvertedPendulum-v4 --total-timesteps 40960 --num-seeds 3".split()
    s = summary(run_script(SEEDS_SCRIPT, *flags))
    assert s["compile"] is True and s["seeds"] == SEEDS and s["total_timesteps"] == 40960
    assert np.mean(s["return_means"]) > 500, s["return_means"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """Two members, eagerly, saving their models and evaluating each twice."""
    flags = (*SMOKE, *"--num-seeds 2 --no-compile --save-model --eval-episodes 2".split())
    flags += ("--measure-burnin", 2)
    return summary(run_script(SEEDS_SCRIPT, *flags, cwd=tmp_path_factory.mktemp("smoke")))


def test_smoke_summary_reports_every_member_and_saves_a_file_each(smoke_run):
    """The summary reports each member and a model file per member, in the single-seed format with
    the member's seed and its observation normalization."""
    s = smoke_run
    want = (SEEDS_SCRIPT, 2, [1, 2], 640)
    assert (s["script"], s["num_seeds"], s["seeds"], s["total_timesteps"]) == want
    assert s["compile"] is False and s["cudagraphs"] is False and s["device"] == "cpu"
    assert s["sps_wall"] == pytest.approx(2 * 640 / s["wall_s"], rel=0.01) and s["sps"] > 0
    assert s["episodes"] == 6 and [len(curve) for curve in s["curves"]] == [3, 3]
    assert all(-2000 < mean < 0 for mean in s["return_means"])
    assert s["return_mean"] == pytest.approx(np.mean(s["return_means"]))
    assert [len(returns) for returns in s["eval_returns"]] == [2, 2]
    assert s["eval_return_means"] == [np.mean(returns) for returns in s["eval_returns"]]
    names = [path.rsplit("/", 1)[1] for path in s["model_files"]]
    assert names == [f"{SEEDS_SCRIPT}_seed{k}.pt" for k in (1, 2)]
    saved = torch.load(s["model_files"][1], weights_only=True)
    assert (saved["script"], saved["args"]["seed"], saved["args"]["num_seeds"]) == (
        SEEDS_SCRIPT,
        2,
        2,
    )
    cpu_agent = load_script(CPU_SCRIPT).Agent(3, 1)
    cpu_format = {name: value.shape for name, value in cpu_agent.state_dict().items()}
    assert {name: value.shape for name, value in saved["model"]["agent"].items()} == cpu_format
    rms = saved["model"]["obs_rms"]
    # the first observation and one per step (envpool's reset steps return the next episode's first)
    assert rms["mean"].shape == rms["var"].shape == (3,)
    assert float(rms["count"]) == pytest.approx(1 + 640 + 1e-4)


def test_a_single_seed_script_evaluates_a_member_file(smoke_run, script="ppo_continuous_action"):
    """The eager script loads member 2's file and plays it (on gymnasium's env; the member played
    envpool's)."""
    flags = ("--env-id", "Pendulum-v1", "--eval-model", smoke_run["model_files"][1])
    s = summary(run_script(script, *flags, "--eval-episodes", 2))
    assert len(s["eval_returns"]) == 2 and all(-2000 < r < 0 for r in s["eval_returns"])


def test_eval_model_evaluates_a_file_as_every_member(smoke_run):
    flags = ("--env-id", "Pendulum-v1", "--eval-episodes", 2, "--no-compile")
    assert_every_member_replays(SEEDS_SCRIPT, smoke_run, *flags)


# the other flag checks are the CPU script's (test_ppo_continuous_action.py)
BAD_INPUTS = [
    (("--num-seeds", 0), ("--num-seeds",)),
    # ~34 TiB of rollouts
    (
        (*"--num-seeds 1000 --num-steps 100000000 --total-timesteps 100000000".split(),),
        ("--num-seeds", "GiB"),
    ),
    (("--cudagraphs",), ("--cudagraphs",)),
    (("--capture-video",), ("--capture-video",)),
    (("--env-id", "gymnasium.envs.classic_control:Pendulum-v1"), ("--env-id", "envpool")),
    (("--env-id", "CartPole-v1"), ("--env-id", "Discrete")),
]


@pytest.mark.parametrize("flags,words", BAD_INPUTS, ids=lambda x: " ".join(map(str, x)))
def test_bad_inputs_exit_2(flags, words, refused):
    refused(SEEDS_SCRIPT, flags, words)
