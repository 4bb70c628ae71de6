"""DQN twins: smoke runs, compiled == eager update, the epsilon schedule, no recompilation, learning, bad inputs.

Compiling tests (cold torch.compile costs 15-30 s here): the `--compile` smoke run, the update equivalence and
the compiled policy. The rest run in a few seconds each.
"""

import numpy as np
import pytest
import torch
from conftest import assert_user_error, load_script, requires_cuda, run_script, summary

TWINS = ("dqn", "dqn_torchcompile")
# 3000 env steps, learning from 1000, one update every 10 iterations: ~200 updates and 3 target updates
SMOKE = ("--total-timesteps", 3000, "--learning-starts", 1000, "--target-network-frequency", 500)


def check_smoke(s, script, compiled=False, num_envs=1):
    assert s["script"] == script
    assert s["env_id"] == "CartPole-v1"
    assert s["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert s["compile"] is compiled and s["cudagraphs"] is False
    assert s["num_envs"] == num_envs
    assert s["total_timesteps"] == 3000
    assert s["episodes"] > 10  # epsilon starts at 1: random CartPole episodes last ~20 steps
    assert s["return_mean"] >= 8  # the shortest CartPole episode
    assert s["sps"] > 0 and s["sps_wall"] > 0 and s["wall_s"] > 0
    assert s["torch_version"] == torch.__version__


@pytest.mark.parametrize("script", TWINS)
def test_smoke(script):
    check_smoke(summary(run_script(script, *SMOKE)), script)


def test_smoke_compile():
    check_smoke(summary(run_script("dqn_torchcompile", *SMOKE, "--compile")), "dqn_torchcompile", compiled=True)


@pytest.mark.parametrize("script", TWINS)
def test_smoke_num_envs(script):
    """--num-envs counts env steps: 3 envs x 1000 iterations = 3000 steps, every finished episode counted."""
    check_smoke(summary(run_script(script, *SMOKE, "--num-envs", 3)), script, num_envs=3)


# --- the epsilon schedule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("script", TWINS)
def test_linear_schedule(script):
    """1 -> 0.05 over 1000 steps: start, middle, end of exploration, and flat after it."""
    linear_schedule = load_script(script).linear_schedule
    for t, expected in ((0, 1.0), (500, 0.525), (1000, 0.05), (5000, 0.05)):
        value = linear_schedule(1.0, 0.05, 1000, torch.tensor(t) if script.endswith("torchcompile") else t)
        assert float(value) == pytest.approx(expected, abs=1e-6), t


def test_compiled_policy_follows_schedule_with_one_coin_without_recompiling():
    """The compiled acting function's exploration rate at the start, middle and end of the schedule (the step
    lives in a tensor the policy advances in place: LeanRL's DQN kept epsilon at its final value from step 0).
    One coin for all envs, as CleanRL flips: with a Q network that always prefers action 0, a call explores with
    probability epsilon, and then draws uniform actions for its 8 envs, which show an action 1 unless all 8 are 0.
    So the share of calls with an action 1 is epsilon * 255/256; one coin per env would give 1 - (1 - epsilon/2)^8
    (0.93 at epsilon 0.525). 2,000 calls per point: standard error below 0.012, tolerance 0.04."""
    mod = load_script("dqn_torchcompile")
    torch.manual_seed(0)
    q_network = mod.QNetwork(4, 2)
    with torch.no_grad():
        q_network.network[4].weight.zero_()
        q_network.network[4].bias.copy_(torch.tensor([1.0, 0.0]))
    global_step = torch.zeros((), dtype=torch.long)
    policy = torch.compile(mod.make_policy(q_network, 2, global_step, 1.0, 0.05, 100_000), fullgraph=True)
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
    """The CPU fast path's acting (`--compile` on a CPU): the eager twin's host-side coin and the Q network in numpy.
    With the coin fixed at 0.6 and epsilon falling 1 -> 0.05 over 1,000 steps, 8 envs a call, the calls at steps
    0, 8, ..., 416 explore (epsilon > 0.6) and the later ones exploit, returning the network's argmax for every env,
    on its current weights (changed in place); with the coin at 0.04 no call exploits, even past the schedule's end
    (epsilon stays at 0.05). Exploring draws are marked -1 here."""
    mod = load_script("dqn_torchcompile")
    q_network = mod.QNetwork(4, 2)
    with torch.no_grad():
        q_network.network[4].weight.zero_()
        q_network.network[4].bias.copy_(torch.tensor([0.0, 1.0]))
    monkeypatch.setattr(mod.np.random, "randint", lambda high, size: np.full(size, -1))
    obs = np.random.default_rng(0).standard_normal((8, 4), dtype=np.float32)

    monkeypatch.setattr(mod.random, "random", lambda: 0.6)
    policy = mod.make_host_policy(q_network, 2, 1.0, 0.05, 1000)
    actions = [policy(obs) for _ in range(100)]
    assert all(a.shape == (8,) and a.dtype.kind == "i" for a in actions)
    assert all((a == -1).all() for a in actions[:53]) and all((a == 1).all() for a in actions[53:])
    with torch.no_grad():
        q_network.network[4].bias.copy_(torch.tensor([1.0, 0.0]))  # in place, as the fast path's Adam steps
    assert (policy(obs) == 0).all()

    monkeypatch.setattr(mod.random, "random", lambda: 0.04)
    policy = mod.make_host_policy(q_network, 2, 1.0, 0.05, 1000)
    assert all((policy(obs) == -1).all() for _ in range(300))  # 2,400 steps


@pytest.mark.parametrize("host", [False, True], ids=["device", "host"])
def test_replay_buffer_extends_wraps_around_and_samples_what_was_added(host):
    """Transitions are the env's numpy arrays, written once per `train_frequency` iterations; `host`: the CPU fast
    path, which writes them through numpy views of the buffer's tensors."""
    mod = load_script("dqn_torchcompile")
    rb = mod.ReplayBuffer(buffer_size=5, n_obs=1, device=torch.device("cpu"), host=host)
    for write in range(3):  # 12 transitions through a buffer of 5, in writes of 2 steps of 2 envs
        steps = [np.array([4.0 * write + 2 * i, 4.0 * write + 2 * i + 1]) for i in range(2)]
        transitions = [dict(obs=v[:, None], next_obs=v[:, None] + 0.5, actions=v.astype(int) % 2) for v in steps]
        rb.extend([t | dict(rewards=v, terminations=v > 10) for t, v in zip(transitions, steps)])
    assert (rb.size, rb.cursor) == (5, 2)
    batch = rb.sample(200)
    assert set(batch["rewards"].tolist()) == {7.0, 8.0, 9.0, 10.0, 11.0}
    torch.testing.assert_close(batch["next_obs"][:, 0], batch["rewards"] + 0.5)
    assert batch["actions"].dtype == torch.long and torch.equal(batch["actions"], batch["rewards"].long() % 2)
    torch.testing.assert_close(batch["terminations"], (batch["rewards"] > 10).float())


# --- the update: compiled == eager --------------------------------------------------------------------------


def make_batch(n_obs=4, n_act=2, batch_size=128):
    g = torch.Generator().manual_seed(1)
    return {
        "obs": torch.randn(batch_size, n_obs, generator=g),
        "next_obs": torch.randn(batch_size, n_obs, generator=g),
        "actions": torch.randint(0, n_act, (batch_size,), generator=g),
        "rewards": torch.rand(batch_size, generator=g),
        "terminations": (torch.rand(batch_size, generator=g) < 0.1).float(),
    }


def build_update(mod, compiled, functional=False):
    """The twin's update from the same starting parameters (seeded): the module update with fused Adam (what runs on
    CUDA, and on a CPU without `--compile`) or, with `functional`, the functional update that `--compile` compiles
    whole on a CPU."""
    torch.manual_seed(0)
    q_network = mod.QNetwork(4, 2)
    target_network = mod.QNetwork(4, 2)
    target_network.load_state_dict(q_network.state_dict())
    target_network.network[0].weight.data.mul_(0.9)  # a target that differs from the online network
    optimizer = torch.optim.Adam(q_network.parameters(), lr=2.5e-4, fused=True)
    update = mod.make_update(q_network, target_network, optimizer, 0.99)
    if functional:
        update, _ = mod.make_functional_update(q_network, target_network, mod.Args(learning_rate=2.5e-4, gamma=0.99))
    return (torch.compile(update, fullgraph=functional) if compiled else update), q_network


@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
def test_compiled_update_matches_eager_and_does_not_recompile(functional):
    """One step on the same batch: the compiled update (the functional one is what `--compile` runs on a CPU, the
    module one what it runs on CUDA) against the eager module update; losses within 1e-5 (relative) and parameters
    within 1e-6 (absolute; one Adam step moves them by ~lr = 2.5e-4). Then more steps on fresh batches compile
    nothing new."""
    mod = load_script("dqn_torchcompile")
    batch = make_batch()
    eager_update, eager_q = build_update(mod, compiled=False)
    compiled_update, compiled_q = build_update(mod, compiled=True, functional=functional)
    start = [p.detach().clone() for p in eager_q.parameters()]

    eager_loss, eager_q_mean = eager_update(batch)
    compiled_loss, compiled_q_mean = compiled_update(batch)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(compiled_q_mean, eager_q_mean, rtol=1e-5, atol=1e-7)
    for p_eager, p_compiled, p_start in zip(eager_q.parameters(), compiled_q.parameters(), start):
        assert not torch.equal(p_eager, p_start), "the step moved the parameters"
        torch.testing.assert_close(p_compiled, p_eager, rtol=0, atol=1e-6)

    compiled_update(make_batch())  # second call: may still specialise (e.g. the optimizer's step count)
    torch.compiler.set_stance("fail_on_recompile")
    try:
        for seed in range(3):
            batch = make_batch()
            batch["obs"] += seed
            compiled_update(batch)
    finally:
        torch.compiler.set_stance("default")


def test_target_update_is_a_copy_at_tau_one():
    mod = load_script("dqn_torchcompile")
    online, target = mod.QNetwork(4, 2), mod.QNetwork(4, 2)
    mod.make_update_target(online, target, 1.0)()
    for p, tp in zip(online.parameters(), target.parameters()):
        assert torch.equal(p, tp)


# --- learning -------------------------------------------------------------------------------------------------


@pytest.mark.learning
def test_learns_cartpole():
    """The optimized twin on its fastest CPU setting (`--compile`: the compiled functional update, numpy acting),
    seed 1, 60k steps with CleanRL's other defaults (epsilon reaches 0.05 at 30k): the mean return of the last 20
    episodes must exceed 150 (this run: 182.6 on an AVX2 EPYC, 183.5 for the twin without `--compile`; random play:
    ~22; a DQN with a broken target or loss stays far below). A broken epsilon schedule is caught by the policy tests,
    not here: CartPole forgives little exploration. ~16 s with a warm compile cache."""
    s = summary(run_script("dqn_torchcompile", "--compile", "--seed", 1, "--total-timesteps", 60_000))
    assert s["return_mean"] > 150, s


# --- bad inputs ---------------------------------------------------------------------------------------------

BAD_INPUTS = [
    (("--env-id", "NoSuchEnv-v0"), ("--env-id",)),
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
def test_bad_inputs_optimized_twin(flags, words):
    assert_user_error(run_script("dqn_torchcompile", *flags), *words)


@pytest.mark.parametrize("flags,words", BAD_INPUTS[:3] + BAD_INPUTS[-2:], ids=lambda x: " ".join(map(str, x)))
def test_bad_inputs_eager_twin(flags, words):
    assert_user_error(run_script("dqn", *flags), *words)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("flags", [("--cudagraphs",), ("--compile", "--cudagraphs")])
def test_cudagraphs(flags):
    s = summary(run_script("dqn_torchcompile", *SMOKE, *flags))
    assert s["device"].startswith("cuda") and s["cudagraphs"] is True
    assert s["episodes"] > 10 and s["sps"] > 0
