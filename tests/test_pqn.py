"""PQN's eager script, twin and CPU script on classic control: smoke runs, epsilon-greedy acting
with a coin per env, the numpy Q network, the Q(lambda) returns (bootstrapping through truncation,
not termination; every implementation = the recursion), the twin's and the CPU script's updates =
the eager one, no recompilation, no host sync where a CUDA graph records, models across the scripts,
divergence, learning, bad inputs."""

import numpy as np
import pytest
import torch
from conftest import (
    assert_measured_threads,
    assert_no_host_sync,
    load_script,
    requires_cuda,
    run_script,
    slow_unless,
    summary,
)
from tensordict import TensorDict
from test_divergence import assert_diverged

EAGER, TWIN, CPU = "pqn", "pqn_torchcompile", "pqn_cpu"
# 4 iterations of 4 envs x 128 steps, 16 minibatch updates each
SMOKE = ("--total-timesteps", 2048, "--measure-burnin", 1)


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory):
    """The eager twin's smoke run, which saves its model and evaluates it for 2 episodes."""
    flags = (*SMOKE, "--save-model", "--eval-episodes", 2)
    return summary(run_script(EAGER, *flags, cwd=tmp_path_factory.mktemp(EAGER)))


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile",)), (CPU, ("--no-compile",))],
    ids=["eager", "twin", "twin-compile", "cpu"],
)
def test_smoke(script, flags, request):
    run = request.getfixturevalue("eager_run") if script == EAGER else None
    s = run or summary(run_script(script, *SMOKE, *flags))
    assert (s["script"], s["env_id"], s["device"]) == (script, "CartPole-v1", "cpu")
    assert s["compile"] is ("--compile" in flags) and s["cudagraphs"] is False
    assert (s["num_envs"], s["total_timesteps"]) == (4, 2048)
    # epsilon starts at 1 (random CartPole episodes last ~20 steps, at least 8) and reaches 0.05
    # at half the run
    assert s["episodes"] > 10 and s["return_mean"] >= 8
    assert s["sps"] > 0 and s["sps_wall"] > 0
    if script == CPU:  # the CPU script chooses its thread count
        assert_measured_threads(s)


def test_a_model_saved_by_one_script_evaluates_alike_in_the_others(eager_run, tmp_path):
    """The eager twin's model, evaluated greedily by the twin and the CPU script on the same seed,
    plays the same episodes; the Q networks have the same keys and shapes."""
    assert len(eager_run["eval_returns"]) == 2
    flags = ("--eval-model", eager_run["model_file"], "--eval-episodes", 2)
    for script in (TWIN, CPU):
        replayed = summary(run_script(script, *flags, cwd=tmp_path))
        assert replayed["eval_returns"] == eager_run["eval_returns"], script
    shapes = [
        {k: v.shape for k, v in load_script(name).QNetwork(4, 2).state_dict().items()}
        for name in (EAGER, TWIN, CPU)
    ]
    assert shapes[0] == shapes[1] == shapes[2]


# --- acting


@pytest.mark.parametrize("script", [EAGER, TWIN, CPU])
def test_linear_schedule(script):
    """1 -> 0.05 over 1000 steps: start, middle, end of exploration, and flat after it."""
    linear_schedule = load_script(script).linear_schedule
    for t, expected in ((0, 1.0), (500, 0.525), (1000, 0.05), (5000, 0.05)):
        value = linear_schedule(1.0, 0.05, 1000, torch.tensor(t) if script == TWIN else t)
        assert float(value) == pytest.approx(expected, abs=1e-6), t


def prefer_action_0(q_network):
    """A Q network whose every state has Q = [1, 0]."""
    with torch.no_grad():
        q_network.network[-1].weight.zero_()
        q_network.network[-1].bias.copy_(torch.tensor([1.0, 0.0]))


def make_learner(script, args):
    """`script`'s learner for CartPole's 4 obs and 2 actions, on the CPU."""
    module = load_script(script)
    device = () if script == CPU else (torch.device("cpu"),)
    return module.make_learner(args, 4, 2, *device)


# the twin's compiles its acting (36 s here)
@pytest.mark.parametrize("script", slow_unless(lambda s: s != TWIN, [EAGER, TWIN, CPU]))
def test_acting_flips_a_coin_per_env_on_the_schedule(script):
    """With Q = [1, 0], an env plays 1 with probability epsilon / 2 and all 8 play 0 with (1 -
    epsilon / 2)^8 (one coin for all, DQN's, would give 0.09 against 0.48 at 0.525); the twin's
    compiled policy reads epsilon from its device step and never recompiles. 2,000 calls a point:
    standard errors below 0.004 and 0.012, tolerances 0.02 and 0.04."""
    mod = load_script(script)
    torch.manual_seed(0)
    args = mod.Args(start_e=1.0, end_e=0.05, exploration_fraction=1.0, total_timesteps=100_000)
    learner = make_learner(script, args)
    prefer_action_0(learner.q_network)
    obs = torch.randn(8, 4)
    if script == TWIN:
        policy = torch.compile(learner.policy, fullgraph=True)
        with torch.no_grad():  # as the loop acts
            policy(obs)  # warm-up: compiles
        assert int(learner.global_step) == 8, "the policy advances the step by the number of envs"
    with torch.compiler.set_stance("fail_on_recompile"), torch.no_grad():
        for step, epsilon in ((0, 1.0), (50_000, 0.525), (100_000, 0.05), (400_000, 0.05)):
            calls = []
            for _ in range(2000):
                if script == TWIN:
                    learner.global_step.fill_(step - 8)  # the policy adds the call's 8 envs
                    calls.append(policy(obs))
                elif script == CPU:
                    actions, values = learner.policy(obs.numpy(), epsilon)
                    calls.append((torch.from_numpy(actions), torch.from_numpy(values)))
                else:
                    calls.append(learner.policy(obs, epsilon))
            actions = torch.stack([a for a, _ in calls])
            assert actions.dtype == torch.long and actions.shape == (2000, 8)
            assert torch.equal(torch.stack([v for _, v in calls]), torch.ones(2000, 8))
            share = actions.float().mean().item()
            all_greedy = (actions == 0).all(dim=1).float().mean().item()
            assert share == pytest.approx(epsilon / 2, abs=0.02), step
            assert all_greedy == pytest.approx((1 - epsilon / 2) ** 8, abs=0.04), step


def test_numpy_q_network_is_the_torch_module_also_after_an_in_place_step():
    """The CPU script's numpy `QNetwork.forward` gives the module's argmax and max on 512 random
    observations, also after the weights change in place (as RAdam changes them)."""
    torch.manual_seed(0)
    learner = make_learner(CPU, load_script(CPU).Args())
    obs = np.random.default_rng(0).standard_normal((512, 4), dtype=np.float32)
    for _ in range(2):  # before and after an in-place change
        with torch.no_grad():
            q = learner.q_network(torch.from_numpy(obs))
        actions, values = learner.policy(obs, 0.0)
        np.testing.assert_array_equal(actions, q.argmax(dim=1).numpy())
        np.testing.assert_allclose(values, q.max(dim=1).values.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(learner.get_value(obs), values)
        assert len(set(actions.tolist())) > 1, "the actions are not all the same"
        with torch.no_grad():
            for param in learner.q_network.parameters():
                param.add_(torch.randn_like(param))  # LayerNorm's gain and shift too


# --- the Q(lambda) returns


def returns_functions(eager=EAGER, twin=TWIN, cpu=None):
    """The eager loop, the twin's doubling (also compiled) and the CPU script's numpy loop."""
    twin_returns = load_script(twin).q_lambda_returns
    functions = {"eager": load_script(eager).q_lambda_returns, "twin": twin_returns}
    functions["twin-compiled"] = torch.compile(twin_returns, fullgraph=True)
    if cpu:
        numpy_returns = load_script(cpu).q_lambda_returns

        def on_numpy(*data):
            data = [x.numpy() if isinstance(x, torch.Tensor) else x for x in data]
            return torch.from_numpy(numpy_returns(*data))

        functions["cpu"] = on_numpy
    return functions


@pytest.mark.parametrize("name", ["eager", "twin", "twin-compiled", "cpu"])
def test_returns_bootstrap_truncation_from_the_final_obs_and_not_termination(name):
    """One env, 4 steps: step 1 is truncated (its final obs' value 10), step 2 terminates (its
    final value, 55, is never read); the rollout ends after step 3 (value 7 after it)."""
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [4.0], [99.0]])
    final_values = torch.tensor([[-1.0], [10.0], [55.0], [-1.0]])
    terminations = torch.tensor([[0.0], [0.0], [1.0], [0.0]])
    truncations = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    gamma, lam = 0.9, 0.5
    returns = returns_functions(cpu=CPU)[name](
        rewards, values, torch.tensor([7.0]), final_values, terminations, truncations, gamma, lam
    )
    # by hand: R_3 = 3 + 0.9 * 7 = 9.3 (the rollout's end); R_2 = 0 (terminal); R_1 = 2 + 0.9 * 10
    # = 11 (the truncated episode's final obs); R_0 = 1 + 0.9 * (0.5 * 1 + 0.5 * 11) = 6.4
    torch.testing.assert_close(returns, torch.tensor([[6.4], [11.0], [0.0], [9.3]]))


def recursive_returns(rewards, next_values, dones, gamma, q_lambda):
    """The paper's Q(lambda) recursion, one step at a time, in float64: R_t = r_t + gamma *
    ((1 - lambda) * V_{t+1} + lambda * R_{t+1}), with R_{t+1} = V_{t+1} at an episode's end and
    after the last step; `next_values` is V_{t+1}, 0 after a termination."""
    returns = torch.zeros_like(rewards)
    for t in reversed(range(len(rewards))):
        for e in range(rewards.shape[1]):
            last = t == len(rewards) - 1 or bool(dones[t, e])
            later = next_values[t, e] if last else returns[t + 1, e]
            mixed = (1 - q_lambda) * next_values[t, e] + q_lambda * later
            returns[t, e] = rewards[t, e] + gamma * mixed
    return returns


def test_returns_are_the_recursion_and_doubling_equals_the_loop():
    """128 steps x 4 envs with terminations and truncations: the eager loop, the doubling, the
    doubling compiled and the CPU script's numpy loop against the recursion written out in float64,
    to 1e-5 (float32 summed in another order)."""
    g = torch.Generator().manual_seed(0)
    n, e = 128, 4
    terminations = (torch.rand(n, e, generator=g) < 0.03).float()
    truncations = (torch.rand(n, e, generator=g) < 0.02).float() * (1 - terminations)
    rewards, values = torch.randn(n, e, generator=g), torch.randn(n, e, generator=g)
    next_value, final_values = torch.randn(e, generator=g), torch.randn(n, e, generator=g)
    dones = torch.maximum(terminations, truncations)
    next_values = torch.cat([values[1:], next_value[None]])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    expected = recursive_returns(rewards.double(), next_values.double(), dones, 0.99, 0.65)
    data = (rewards, values, next_value, final_values, terminations, truncations, 0.99, 0.65)
    for name, function in returns_functions(cpu=CPU).items():
        got = function(*data)
        torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-5, msg=name)


# --- the update: twin (compiled or not) == eager


def make_minibatch(seed, size=128, n_obs=4, n_act=2):
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        obs=torch.randn(size, n_obs, generator=g),
        actions=torch.randint(0, n_act, (size,), generator=g),
        returns=torch.randn(size, generator=g) * 10,
        batch_size=[size],
    )


def build_update(script, seed=0, compile=False):
    """`script`'s update from the same starting parameters (seeded), as `main` builds it: the twin's
    RAdam with a tensor learning rate, its update compiled whole under `--compile`."""
    module = load_script(script)
    torch.manual_seed(seed)
    learner = module.make_learner(module.Args(), 4, 2, torch.device("cpu"))
    update = torch.compile(learner.update) if compile else learner.update
    return update, learner.q_network


def test_twin_update_compiled_or_not_takes_the_eager_twins_steps():
    """Three steps on fresh minibatches: losses and mean Qs within 1e-5 relative, gradients within
    1e-5/1e-6, parameters within 1e-6 absolute (a step moves them by ~lr = 2.5e-4)."""
    updates = {"eager": build_update(EAGER), "twin": build_update(TWIN)}
    updates["twin-compiled"] = build_update(TWIN, compile=True)
    start = [p.detach().clone() for p in updates["eager"][1].parameters()]
    for step in range(3):
        batch = make_minibatch(step)
        expected = updates["eager"][0](dict(batch.items()))
        reference = list(updates["eager"][1].parameters())
        for name in ("twin", "twin-compiled"):
            update, q_network = updates[name]
            for value, want in zip(update(batch.clone()), expected):
                torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-7, msg=name)
            for param, want in zip(q_network.parameters(), reference):
                torch.testing.assert_close(param.grad, want.grad, rtol=1e-5, atol=1e-6, msg=name)
                torch.testing.assert_close(param, want, rtol=0, atol=1e-6, msg=name)
    moved = [not torch.equal(p, p0) for p, p0 in zip(updates["eager"][1].parameters(), start)]
    assert all(moved), "every parameter moved"


@pytest.mark.slow  # compiles the functional update (16 s here)
def test_cpu_functional_update_takes_the_eager_twins_steps_without_recompiling():
    """Eight steps (RAdam's rectification begins at the sixth, gradients clipped, lr annealed in
    place from the fourth): the CPU script's functional update, eager and compiled as `main` does,
    gives the eager twin's losses within 1e-5 relative and parameters within 1e-6 absolute; from
    the third call on the compiled update compiles nothing new."""
    torch.manual_seed(0)
    reference = make_learner(EAGER, load_script(EAGER).Args())
    cpu = {}
    for name in ("functional", "compiled"):
        torch.manual_seed(0)
        cpu[name] = make_learner(CPU, load_script(CPU).Args())
    compiled = torch.compile(cpu["compiled"].update, fullgraph=True, options={"cpp_wrapper": True})
    updates = {"functional": cpu["functional"].update, "compiled": compiled}
    start = [p.detach().clone() for p in reference.q_network.parameters()]
    for step in range(8):
        if step == 2:
            torch.compiler.set_stance("fail_on_recompile")
        if step >= 3:
            lr = 2.5e-4 / step
            reference.optimizer.param_groups[0]["lr"] = lr
            for learner in cpu.values():
                learner.optimizer.param_groups[0]["lr"].fill_(lr)
        try:
            batch = dict(make_minibatch(step).items())
            expected = reference.update(batch)
            for name, update in updates.items():
                for value, want in zip(update(batch), expected):
                    torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-7, msg=name)
                for param, want in zip(
                    cpu[name].q_network.parameters(), reference.q_network.parameters()
                ):
                    torch.testing.assert_close(param, want, rtol=0, atol=1e-6, msg=name)
        finally:
            torch.compiler.set_stance("default")
    moved = [not torch.equal(p, p0) for p, p0 in zip(reference.q_network.parameters(), start)]
    assert all(moved), "every parameter moved"


def test_written_out_radam_takes_torch_radams_steps_over_a_long_run():
    """optimizers.py's RAdam against torch.optim.RAdam for 3,000 steps, its lr changed in place."""
    module = load_script(CPU)
    torch.manual_seed(0)
    start = {"weight": torch.randn(8, 5), "bias": torch.randn(5)}
    params = {name: p.clone() for name, p in start.items()}
    lr = torch.tensor(1e-3)
    radam = module.RAdam(params, lr)
    reference = {name: p.clone().requires_grad_() for name, p in start.items()}
    torch_radam = torch.optim.RAdam(reference.values(), lr=1e-3)
    for step in range(3000):
        if step == 1000:
            lr.fill_(5e-4)
            torch_radam.param_groups[0]["lr"] = 5e-4
        grads = {name: torch.randn_like(p) * (1 + step % 7) for name, p in start.items()}
        radam.step(grads)
        for name, p in reference.items():
            p.grad = grads[name]
        torch_radam.step()
        if step in (0, 4, 5, 9, 99, 2999):
            for name, p in params.items():
                want = reference[name].detach()
                torch.testing.assert_close(p, want, rtol=0, atol=1e-5, msg=f"{name}, {step + 1}")
    assert (params["weight"] - start["weight"]).abs().max() > 0.01


def test_no_recompilation_after_warmup():
    """Policy, returns and update as an iteration calls them, lr annealed in place: after two
    iterations nothing compiles again."""
    module = load_script(TWIN)
    torch.manual_seed(0)
    learner = module.make_learner(module.Args(), 4, 2, torch.device("cpu"))
    policy = torch.compile(learner.policy, fullgraph=True)
    returns_fn = torch.compile(module.q_lambda_returns, fullgraph=True)
    update = torch.compile(learner.update)
    zeros = torch.zeros(8, 4)

    def iteration(seed):
        with torch.no_grad():
            for _ in range(3):
                action, value = policy(torch.randn(4, 4))
            data = (torch.randn(8, 4), torch.randn(8, 4), value, torch.randn(8, 4), zeros, zeros)
            returns = returns_fn(*data, 0.99, 0.65)
        update(make_minibatch(seed))
        return action, returns

    for seed in range(2):
        iteration(seed)
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed in range(2, 5):
            learner.optimizer.param_groups[0]["lr"].copy_(1e-4 * seed)
            action, returns = iteration(seed)
    assert action.shape == (4,) and returns.shape == (8, 4)
    assert int(learner.global_step) == 5 * 3 * 4


# --- the CUDA path, checked on the CPU


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_what_a_cuda_graph_records_never_syncs_with_the_host(compile):
    """Acting, the returns and the update run without a host sync under `--cudagraphs` (the update
    compiled only: RAdam's capturable step refuses the CPU eagerly)."""
    module = load_script(TWIN)
    torch.manual_seed(0)
    args = module.Args(cudagraphs=True, compile=compile)
    learner = module.make_learner(args, 4, 2, torch.device("cpu"))
    assert learner.optimizer.defaults["capturable"]
    zeros = torch.zeros(16, 4)
    rollout = (torch.randn(16, 4), torch.randn(16, 4), torch.randn(4), torch.randn(16, 4))
    functions = {
        "policy": (learner.policy, lambda: (torch.randn(4, 4),)),
        "returns": (module.q_lambda_returns, lambda: (*rollout, zeros, zeros, 0.99, 0.65)),
    }
    if compile:
        functions["update"] = (learner.update, lambda: (make_minibatch(0),))
    for name, (fn, inputs) in functions.items():
        fn = torch.compile(fn) if compile else fn
        with torch.no_grad() if name != "update" else torch.enable_grad():
            out = assert_no_host_sync(fn, inputs, compiled=compile)
        leaves = out if isinstance(out, tuple) else (out,)
        assert all(torch.isfinite(x).all() for x in leaves), f"{name}: {out}"


@pytest.mark.parametrize("script, flags", [(EAGER, ()), (TWIN, ()), (CPU, ("--no-compile",))])
def test_the_returns_see_the_rewards_times_reward_scale(script, flags, train, monkeypatch):
    """`--reward-scale` multiplies every reward the Q(lambda) returns read, in each script alike:
    CartPole's rewards are all 1."""
    module, seen = load_script(script), []
    returns = module.q_lambda_returns

    def spy(rewards, *args, **kwargs):
        seen.append(np.asarray(rewards))
        return returns(rewards, *args, **kwargs)

    monkeypatch.setattr(module, "q_lambda_returns", spy)
    # train runs this module
    scripts = lambda name, *rest: module if name == script else load_script(name, *rest)  # noqa: E731
    monkeypatch.setattr("conftest.load_script", scripts)
    assert train(script, *SMOKE, "--reward-scale", 0.25, "--no-tensorboard", *flags) == 0
    assert len(seen) == 4 and all(np.array_equal(r, np.full((128, 4), 0.25)) for r in seen)


# --- divergence and learning


@pytest.mark.parametrize("script", [EAGER, CPU])
def test_a_learning_rate_far_too_large_diverges_with_exit_3(script):
    """At a learning rate of 1e30 the Q values overflow in the first iteration."""
    flags = ("--total-timesteps", 2048, "--learning-rate", 1e30, "--save-model")
    flags += ("--no-compile",) if script == CPU else ()
    line = "error: diverged at step 512: td_loss is nan; maybe too large: --learning-rate 1e+30"
    diverged = {"step": 512, "metric": "td_loss", "value": "nan"}
    result = assert_diverged(run_script(script, *flags), line, diverged)
    assert result["total_timesteps"] == 512  # it stopped after the iteration it logged


@pytest.mark.learning
def test_learns_cartpole():
    """Seed 1, 122,880 steps: the last 20 episodes' mean above 50. Seeds 1-10 gave 60.95 to 102.8
    (2-core EPYC); `--gamma 0` gave 19.45 and 34.6, random play ~22, one action ~9.5."""
    s = summary(run_script(EAGER, "--seed", 1, "--total-timesteps", 122_880))
    assert s["return_mean"] > 50, s


@pytest.mark.learning
def test_the_cpu_script_learns_cartpole():
    """As a user runs it (compiled), at the eager twin's budget and bar; seeds 1-10 gave 70.45 to
    151.2 (2-core EPYC)."""
    s = summary(run_script(CPU, "--seed", 1, "--total-timesteps", 122_880))
    assert s["compile"] is True and s["return_mean"] > 50, s


# the many-env settings (docs/time-to-solve.md): the flags every size shares, then a size's
MANY_ENVS = ("--exploration-fraction", 0.1, "--q-lambda", 0.95, "--reward-scale", 0.1)
SIZE_32 = ("--num-envs", 32, "--num-steps", 64, "--num-minibatches", 16, "--learning-rate", 5e-4)
SIZE_256 = ("--tensor-envs", "--num-envs", 256, "--num-steps", 8, "--num-minibatches", 16)


@pytest.mark.learning
def test_the_many_env_settings_learn_cartpole_at_32_envs():
    """The README's fastest command on a CPU, 40,960 steps (20 iterations), seed 1: the last 20
    episodes' mean above 100. Seeds 1-10 gave 118.5 to 500 (median 379.95; 2-core EPYC); CleanRL's
    flags at that budget gave 89.95 and 9.7 (seeds 1, 2)."""
    s = summary(run_script(EAGER, *MANY_ENVS, *SIZE_32, "--seed", 1, "--total-timesteps", 40_960))
    assert s["return_mean"] > 100, s


@pytest.mark.learning
def test_the_many_env_settings_learn_cartpole_at_256_tensor_envs():
    """The table's 256-env row on the tensor envs, 61,440 steps (30 iterations), seed 1: above 60.
    Seeds 1-10 gave 102.25 to 194.95 (median 157.2; 2-core EPYC, busy)."""
    s = summary(run_script(EAGER, *MANY_ENVS, *SIZE_256, "--seed", 1, "--total-timesteps", 61_440))
    assert s["return_mean"] > 60, s


# --- bad inputs

# an unknown `--env-id` and a `module:EnvId` whose module is missing, and `--cudagraphs` without
# CUDA: test_contract.py, for every script
BAD_INPUTS = [
    (("--env-id", "Pendulum-v1"), ("--env-id", "Box", "Discrete")),
    (("--num-envs", 0), ("--num-envs", "positive")),
    (("--num-steps", -1), ("--num-steps", "positive")),
    (("--max-grad-norm", 0), ("--max-grad-norm", "positive")),
    (("--num-minibatches", 3), ("--num-minibatches", "equal parts")),
    (("--total-timesteps", 511), ("--total-timesteps", "one rollout")),
    (("--q-lambda", 1.5), ("--q-lambda",)),
    (("--exploration-fraction", 0), ("--exploration-fraction",)),
    (("--reward-scale", 0), ("--reward-scale", "positive")),
]


@pytest.mark.parametrize("script", [EAGER, TWIN, CPU])
@pytest.mark.parametrize("flags, words", BAD_INPUTS, ids=lambda x: " ".join(map(str, x)))
def test_bad_input_exits_2(script, flags, words, refused):
    refused(script, flags, words)


@requires_cuda
@pytest.mark.parametrize("flags", [("--cudagraphs",), ("--compile", "--cudagraphs")])
def test_cudagraphs(flags):
    s = summary(run_script(TWIN, *SMOKE, *flags))
    assert s["device"].startswith("cuda") and s["cudagraphs"] is True
    assert s["episodes"] > 10 and s["return_mean"] >= 8
