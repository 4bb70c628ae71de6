"""DQN's three scripts, the eager reference, the optimized twin and the CPU script: smoke runs, the
epsilon schedule, the replay buffers, compiled == eager updates, the CPU script's functional update
== the eager script's module update, its numpy policy == the torch Q network, no recompilation,
models that load across the scripts, learning, bad inputs."""

import numpy as np
import pytest
import torch
from conftest import assert_measured_threads, load_script, requires_cuda, run_script, summary

SCRIPTS = ("dqn", "dqn_torchcompile", "dqn_cpu")
# 3000 env steps, learning from 1000, one update every 10 iterations: ~200 updates and 3 target
# updates
SMOKE = ("--total-timesteps", 3000, "--learning-starts", 1000, "--target-network-frequency", 500)
# gymnasium's `module:EnvId` form, which `gym.make` imports (no registry lookup may refuse it)
MODULE_ENV_ID = "gymnasium.envs.classic_control:CartPole-v1"


def check_smoke(s, script, compiled=False, num_envs=1, env_id="CartPole-v1"):
    assert s["script"] == script
    assert s["env_id"] == env_id
    assert s["device"] == "cpu"  # a script a test launches sees no GPU (conftest.script_env)
    assert s["compile"] is compiled and s["cudagraphs"] is False
    assert s["num_envs"] == num_envs
    assert s["total_timesteps"] == 3000
    assert s["episodes"] > 10  # epsilon starts at 1: random CartPole episodes last ~20 steps
    assert s["return_mean"] >= 8  # the shortest CartPole episode
    assert s["sps"] > 0 and s["sps_wall"] > 0 and s["wall_s"] > 0
    assert s["torch_version"] == torch.__version__
    # the CPU script chooses its thread count
    if script == "dqn_cpu":
        assert_measured_threads(s)
    else:
        assert "threads" not in s


@pytest.mark.parametrize(
    "script, flags", [(SCRIPTS[0], ()), (SCRIPTS[1], ()), (SCRIPTS[1], ("--compile",))]
)
def test_smoke(script, flags):
    check_smoke(summary(run_script(script, *SMOKE, *flags)), script, compiled=bool(flags))


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The CPU script's smoke run, eager (its compiled run learns), 3 envs named in the
    `module:EnvId` form; it saves its model and evaluates it."""
    flags = (
        "--no-compile",
        "--num-envs",
        3,
        "--env-id",
        MODULE_ENV_ID,
        "--save-model",
        "--eval-episodes",
        2,
    )
    return summary(run_script("dqn_cpu", *SMOKE, *flags, cwd=tmp_path_factory.mktemp("dqn_cpu")))


@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_num_envs_and_a_module_env_id(script, request):
    """--num-envs counts env steps: 3 envs x 1000 iterations = 3000 steps, every finished episode
    counted; the env is named in gymnasium's `module:EnvId` form."""
    flags = (*SMOKE, "--num-envs", 3, "--env-id", MODULE_ENV_ID)
    s = (
        request.getfixturevalue("cpu_run")
        if script == "dqn_cpu"
        else summary(run_script(script, *flags))
    )
    check_smoke(s, script, num_envs=3, env_id=MODULE_ENV_ID)


def test_a_model_saved_by_any_script_loads_in_the_others(cpu_run, tmp_path):
    """The CPU script's trained model, evaluated greedily, gives the same returns in the eager
    script and the twin; the three scripts' Q networks have the same state_dict keys and shapes,
    so any script's model loads in the others (`load_state_dict` is strict)."""
    assert len(cpu_run["eval_returns"]) == 2
    for script in SCRIPTS[:2]:
        flags = (
            "--env-id",
            MODULE_ENV_ID,
            "--eval-model",
            cpu_run["model_file"],
            "--eval-episodes",
            2,
        )
        replayed = summary(run_script(script, *flags, cwd=tmp_path))
        assert replayed["eval_returns"] == cpu_run["eval_returns"], script
    shapes = [
        {k: v.shape for k, v in load_script(name).QNetwork(4, 2).state_dict().items()}
        for name in SCRIPTS
    ]
    assert shapes[0] == shapes[1] == shapes[2]


# --- the epsilon schedule and acting


@pytest.mark.parametrize("script", SCRIPTS)
def test_linear_schedule(script):
    """1 -> 0.05 over 1000 steps: start, middle, end of exploration, and flat after it."""
    linear_schedule = load_script(script).linear_schedule
    for t, expected in ((0, 1.0), (500, 0.525), (1000, 0.05), (5000, 0.05)):
        value = linear_schedule(
            1.0, 0.05, 1000, torch.tensor(t) if script.endswith("torchcompile") else t
        )
        assert float(value) == pytest.approx(expected, abs=1e-6), t


def test_compiled_policy_follows_schedule_with_one_coin_without_recompiling():
    """The twin's compiled acting function's exploration rate at the start, middle and end of the
    schedule (the step lives in a tensor the policy advances in place: LeanRL's DQN kept epsilon at
    its final value from step 0). One coin for all envs, as CleanRL flips: with a Q network that
    always prefers action 0, a call explores with probability epsilon, and then draws uniform
    actions for its 8 envs, which show an action 1 unless all 8 are 0. So the share of calls with an
    action 1 is epsilon * 255/256; one coin per env would give 1 - (1 - epsilon/2)^8 (0.93 at
    epsilon 0.525). 2,000 calls per point: standard error below 0.012, tolerance 0.04."""
    mod = load_script("dqn_torchcompile")
    torch.manual_seed(0)
    args = mod.Args(start_e=1.0, end_e=0.05, exploration_fraction=1.0, total_timesteps=100_000)
    learner = mod.make_learner(args, 4, 2, torch.device("cpu"))
    q_network, global_step = learner.q_network, learner.global_step
    with torch.no_grad():
        q_network.network[4].weight.zero_()
        q_network.network[4].bias.copy_(torch.tensor([1.0, 0.0]))
    policy = torch.compile(learner.policy, fullgraph=True)
    obs = torch.randn(8, 4)

    policy(obs)  # warm-up: compiles
    assert int(global_step) == 8, "the policy advances the step by the number of envs"
    with torch.compiler.set_stance("fail_on_recompile"):
        for step, epsilon in ((0, 1.0), (50_000, 0.525), (100_000, 0.05), (400_000, 0.05)):
            explored = 0
            for _ in range(2000):
                global_step.fill_(step)
                actions = policy(obs)
                explored += int(actions.any())
            assert actions.dtype == torch.long and actions.shape == (8,)
            assert explored / 2000 == pytest.approx(epsilon * 255 / 256, abs=0.04), step
            assert int(global_step) == step + 8


def test_host_policy_follows_schedule_with_one_coin(monkeypatch):
    """The CPU script's acting: the eager script's host-side coin and the Q network in numpy. With
    the coin fixed at 0.6 and epsilon falling 1 -> 0.05 over 1,000 steps, 8 envs a call, the
    calls at steps 0, 8, ..., 416 explore (epsilon > 0.6) and the later ones exploit, returning
    the network's argmax for every env; with the coin at 0.04 no call exploits, even past the
    schedule's end (epsilon stays at 0.05). Exploring draws are marked -1 here."""
    mod = load_script("dqn_cpu")
    args = mod.Args(start_e=1.0, end_e=0.05, exploration_fraction=1.0, total_timesteps=1000)
    learner = mod.make_learner(args, 4, 2)
    with torch.no_grad():
        learner.q_network.network[4].weight.zero_()
        learner.q_network.network[4].bias.copy_(torch.tensor([0.0, 1.0]))
    monkeypatch.setattr(mod.np.random, "randint", lambda high, size: np.full(size, -1))
    obs = np.random.default_rng(0).standard_normal((8, 4), dtype=np.float32)

    monkeypatch.setattr(mod.random, "random", lambda: 0.6)
    policy = learner.policy
    actions = [policy(obs) for _ in range(100)]
    assert all(a.shape == (8,) and a.dtype.kind == "i" for a in actions)
    assert all((a == -1).all() for a in actions[:53]) and all((a == 1).all() for a in actions[53:])

    monkeypatch.setattr(mod.random, "random", lambda: 0.04)
    policy = mod.make_learner(args, 4, 2).policy  # from step 0 again
    assert all((policy(obs) == -1).all() for _ in range(300))  # 2,400 steps


def test_host_policy_is_the_torch_q_network_also_after_an_in_place_step():
    """The numpy policy restates `QNetwork.forward`: greedy (epsilon 0), it picks the torch Q
    network's argmax for 512 random observations, on random weights, and still after the weights
    change in place (as Adam's step changes them: the policy reads views of the same memory)."""
    mod = load_script("dqn_cpu")
    torch.manual_seed(0)
    learner = mod.make_learner(mod.Args(start_e=0.0, end_e=0.0), 4, 3)
    q_network, policy = learner.q_network, learner.policy
    obs = np.random.default_rng(0).standard_normal((512, 4), dtype=np.float32)
    for _ in range(2):  # before and after an in-place change
        with torch.no_grad():
            expected = q_network(torch.from_numpy(obs)).argmax(dim=1).numpy()
        np.testing.assert_array_equal(policy(obs), expected)
        assert len(set(expected.tolist())) > 1, "the actions are not all the same"
        with torch.no_grad():
            for param in q_network.parameters():
                param.add_(torch.randn_like(param))


@pytest.mark.parametrize("script", SCRIPTS)
def test_replay_buffer_extends_wraps_around_and_samples_what_was_added(script):
    """Transitions are the env's numpy arrays (booleans for terminations, integers for actions),
    written at the buffer's dtypes: every step in the eager script, once per `train_frequency`
    iterations in the others (the CPU script through numpy views of the buffer's tensors)."""
    mod = load_script(script)
    device = {} if script == "dqn_cpu" else {"device": torch.device("cpu")}
    rb = mod.ReplayBuffer(buffer_size=5, n_obs=1, **device)
    for write in range(3):  # 12 transitions through a buffer of 5, in writes of 2 steps of 2 envs
        steps = [np.array([4.0 * write + 2 * i, 4.0 * write + 2 * i + 1]) for i in range(2)]
        transitions = [
            dict(obs=v[:, None], next_obs=v[:, None] + 0.5, actions=v.astype(int) % 2)
            for v in steps
        ]
        rb.extend([t | dict(rewards=v, terminations=v > 10) for t, v in zip(transitions, steps)])
    assert (rb.size, rb.cursor) == (5, 2)
    batch = rb.sample(200)
    assert set(batch["rewards"].tolist()) == {7.0, 8.0, 9.0, 10.0, 11.0}
    torch.testing.assert_close(batch["next_obs"][:, 0], batch["rewards"] + 0.5)
    assert batch["actions"].dtype == torch.long and torch.equal(
        batch["actions"], batch["rewards"].long() % 2
    )
    torch.testing.assert_close(batch["terminations"], (batch["rewards"] > 10).float())


# --- the updates: compiled == eager, functional == module


def make_batch(n_obs=4, n_act=2, batch_size=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(batch_size, n_obs, generator=g),
        "next_obs": torch.randn(batch_size, n_obs, generator=g),
        "actions": torch.randint(0, n_act, (batch_size,), generator=g),
        "rewards": torch.rand(batch_size, generator=g),
        "terminations": (torch.rand(batch_size, generator=g) < 0.1).float(),
    }


def make_learner(script, args):
    """`script`'s learner for 4 observations and 2 actions on the CPU."""
    mod = load_script(script)
    if script == "dqn_cpu":
        return mod.make_learner(args, 4, 2)
    return mod.make_learner(args, 4, 2, torch.device("cpu"))


def build_update(script):
    """A script's TD update from the same starting parameters (seeded) and a target network that
    differs from the online one, as its `make_learner` builds it: the eager script's module update
    (torch.optim.Adam), the twin's (fused Adam), or the CPU script's functional update with
    optimizers.py's Adam."""
    args = load_script(script).Args(learning_rate=2.5e-4, gamma=0.99)
    torch.manual_seed(0)
    learner = make_learner(script, args)
    learner.target_network.network[0].weight.data.mul_(0.9)
    return learner.update, learner.q_network


def test_twin_compiled_update_matches_eager_and_does_not_recompile():
    """One step on the same batch: the twin's module update (fused Adam) compiled, as `--compile`
    runs it, against the same update run eagerly; losses within 1e-5 (relative) and parameters
    within 1e-6 (absolute; one Adam step moves them by ~lr = 2.5e-4). Then more steps on fresh
    batches compile nothing new."""
    batch = make_batch()
    eager_update, eager_q = build_update("dqn_torchcompile")
    compiled_update, compiled_q = build_update("dqn_torchcompile")
    compiled_update = torch.compile(compiled_update)
    start = [p.detach().clone() for p in eager_q.parameters()]

    eager_loss, eager_q_mean = eager_update(batch)
    compiled_loss, compiled_q_mean = compiled_update(batch)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(compiled_q_mean, eager_q_mean, rtol=1e-5, atol=1e-7)
    for p_eager, p_compiled, p_start in zip(eager_q.parameters(), compiled_q.parameters(), start):
        assert not torch.equal(p_eager, p_start), "the step moved the parameters"
        torch.testing.assert_close(p_compiled, p_eager, rtol=0, atol=1e-6)

    # second call: may still specialise (e.g. the optimizer's step count)
    compiled_update(make_batch(seed=2))
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed in range(3, 6):
            compiled_update(make_batch(seed=seed))


def test_cpu_functional_update_matches_the_eager_scripts_module_update_step_for_step():
    """Six steps on fresh batches from the same start: the eager script's module update
    (torch.optim.Adam), the CPU script's functional update run eagerly (`--no-compile`) and compiled
    as `main` compiles it (one graph, C++ wrapper). After each step the losses and mean Qs agree
    within 1e-5 (relative) and the parameters within 1e-6 (absolute; each Adam step moves them by
    ~lr = 2.5e-4; optimizers.py's Adam rounds in another order than torch's). From the third call
    on, the compiled update compiles nothing new."""
    reference, reference_q = build_update("dqn")
    functional, functional_q = build_update("dqn_cpu")
    compiled, compiled_q = build_update("dqn_cpu")
    compiled = torch.compile(compiled, fullgraph=True, options={"cpp_wrapper": True})
    start = [p.detach().clone() for p in reference_q.parameters()]
    for step in range(6):
        if step == 2:
            torch.compiler.set_stance("fail_on_recompile")
        try:
            batch = make_batch(seed=step)
            expected = reference(batch)
            for update, q_network in ((functional, functional_q), (compiled, compiled_q)):
                for value, reference_value in zip(update(batch), expected):
                    torch.testing.assert_close(
                        value, reference_value, rtol=1e-5, atol=1e-7, msg=f"step {step}"
                    )
                for param, reference_param in zip(q_network.parameters(), reference_q.parameters()):
                    torch.testing.assert_close(
                        param, reference_param, rtol=0, atol=1e-6, msg=f"step {step}"
                    )
        finally:
            torch.compiler.set_stance("default")
    assert all(not torch.equal(p, p_start) for p, p_start in zip(reference_q.parameters(), start))


@pytest.mark.parametrize("script", SCRIPTS)
def test_target_update_is_a_copy_at_tau_one(script):
    mod = load_script(script)
    learner = make_learner(script, mod.Args(tau=1.0))
    online, target = learner.q_network, learner.target_network
    target.load_state_dict(mod.QNetwork(4, 2).state_dict())  # in place: a random target
    learner.update_target()
    for p, tp in zip(online.parameters(), target.parameters()):
        assert torch.equal(p, tp)


# --- learning


@pytest.mark.learning
def test_learns_cartpole():
    """The CPU script as a user runs it, seed 1, 60k steps: the last 20 episodes above 80. Seeds
    1-10 gave 144.1 to 379.2 (Xeon); `--gamma 0` 12.7 and 21.9, random play ~22 (a broken epsilon
    schedule is the policy tests' to catch)."""
    s = summary(run_script("dqn_cpu", "--seed", 1, "--total-timesteps", 60_000))
    assert s["compile"] is True and s["return_mean"] > 80, s


# --- bad inputs

# an unknown `--env-id` and a `module:EnvId` whose module is missing: test_contract.py, for every
# script
BAD_INPUTS = [
    (("--env-id", "Pendulum-v1"), ("--env-id", "Box")),
    (("--batch-size", 0), ("--batch-size",)),
    (("--buffer-size", -5), ("--buffer-size",)),
    (("--num-envs", 0), ("--num-envs",)),
    (("--total-timesteps", 0), ("--total-timesteps",)),
    (("--train-frequency", 0), ("--train-frequency",)),
    (("--batch-size", 512, "--buffer-size", 256), ("--batch-size", "--buffer-size")),
    (("--exploration-fraction", 0), ("--exploration-fraction",)),
    (("--exploration-fraction", 1.5), ("--exploration-fraction",)),
]


@pytest.mark.parametrize("flags,words", BAD_INPUTS, ids=lambda x: " ".join(map(str, x)))
def test_bad_inputs_optimized_twin(flags, words, refused):
    refused("dqn_torchcompile", flags, words)


@pytest.mark.parametrize("script", ["dqn", "dqn_cpu"])
@pytest.mark.parametrize(
    "flags,words", BAD_INPUTS[:1] + BAD_INPUTS[-3:-1], ids=lambda x: " ".join(map(str, x))
)
def test_bad_inputs(script, flags, words, refused):
    refused(script, flags, words)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("flags", [("--cudagraphs",), ("--compile", "--cudagraphs")])
def test_cudagraphs(flags):
    s = summary(run_script("dqn_torchcompile", *SMOKE, *flags))
    assert s["device"].startswith("cuda") and s["cudagraphs"] is True
    assert s["episodes"] > 10 and s["sps"] > 0
