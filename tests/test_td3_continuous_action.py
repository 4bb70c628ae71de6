"""TD3: the three scripts run; the twin's update and the CPU script's functional update are the
eager script's update; compiled updates are their eager selves and do not recompile; the CPU
script's numpy policy is the torch actor's; bad input exits 2; the CPU script learns Pendulum-v1."""

import numpy as np
import pytest
import torch
from conftest import assert_measured_threads, load_script, run_script, summary
from tensordict import TensorDict, from_module, from_modules

EAGER = "td3_continuous_action"
TWIN, CPU = f"{EAGER}_torchcompile", f"{EAGER}_cpu"
# 3 Pendulum episodes of 200 steps; 100 critic steps and 50 actor steps after the random phase
SMOKE = tuple(
    "--env-id Pendulum-v1 --total-timesteps 600 --learning-starts 500 --batch-size 32".split()
)
N_OBS, N_ACT = 3, 2
LOW, HIGH = -2 * np.ones(N_ACT), 2 * np.ones(N_ACT)  # the action bounds of the networks built here


@pytest.fixture(autouse=True)
def _one_thread_scripts(monkeypatch):
    """Scripts run here use one intra-op thread: their ops are small, and on a shared 2-core CPU a
    2-thread OpenMP pool that loses a core spins and stalls (the learning run took over 15 minutes
    instead of 3)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile",))],
    ids=["eager", "twin", "twin-compile"],
)
def test_smoke(script, flags):
    """The CPU script's smoke runs are test_several_envs_log_every_episode's (`--no-compile`) and
    the learning check's (compiled, its summary checked as here)."""
    result = summary(run_script(script, *SMOKE, "--measure-burnin", "5", *flags))
    assert result["script"] == script
    assert result["compile"] is ("--compile" in flags) and result["cudagraphs"] is False
    assert (result["env_id"], result["total_timesteps"]) == ("Pendulum-v1", 600)
    assert result["num_envs"] == 1
    assert result["episodes"] == 3
    assert -2000 < result["return_mean"] < 0
    assert result["sps"] > 0 and result["sps_wall"] > 0
    assert result["torch_version"] == torch.__version__


@pytest.mark.parametrize("script, flags", [(EAGER, ()), (TWIN, ()), (CPU, ("--no-compile",))])
def test_several_envs_log_every_episode(script, flags):
    # two Pendulum envs truncate on the same step: 400 vector steps, 2 episodes per env
    budget = ("--total-timesteps", "800", "--learning-starts", "700", "--num-envs", "2")
    result = summary(run_script(script, *SMOKE[:2], *budget, *flags))
    assert (result["num_envs"], result["total_timesteps"], result["episodes"]) == (2, 800, 4)


# --- the update functions


def build_learner(module, seed=0, **args):
    """`module`'s `make_learner` on the CPU, with bounds [-2, 2], after seeding torch with `seed`:
    every script draws the actor, the target actor and the two Q-networks first, in that order,
    so the three scripts' learners start from the same parameters."""
    torch.manual_seed(seed)
    return module.make_learner(module.Args(**args), N_OBS, N_ACT, LOW, HIGH, torch.device("cpu"))


def stacked_state(learner):
    return {
        "actor": learner.actor,
        "target_actor": learner.actor_target,
        "qnet": learner.qnet_params,
        "qnet_target": learner.qnet_target,
    }


def build_twin_updates(module, compile_updates, seed=0):
    """The twin's module updates with fused Adam, from its `make_learner`, `--compile`d or not."""
    learner = build_learner(module, seed)
    update_critic, update_actor = learner.update_critic, learner.update_actor
    if compile_updates:
        update_critic, update_actor = torch.compile(update_critic), torch.compile(update_actor)
    return update_critic, update_actor, learner.update_targets, stacked_state(learner)


def build_cpu_updates(module, seed=0):
    """The CPU script's functional updates with optimizers.py's Adam, from its `make_learner`."""
    learner = build_learner(module, seed)
    update_critic, update_actor = learner.update_critic, learner.update_actor
    return update_critic, update_actor, learner.update_targets, stacked_state(learner)


def build_eager_updates(module, seed=0):
    """The eager script's update functions, from the same seed: the same starting parameters as the
    others'."""
    learner = build_learner(module, seed)
    state = {
        "actor": learner.actor,
        "target_actor": learner.actor_target,
        "qnet": (learner.qf1, learner.qf2),
        "qnet_target": (learner.qf1_target, learner.qf2_target),
    }
    return learner.update_critic, learner.update_actor, learner.update_targets, state


def make_batch(seed, batch_size=64):
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        obs=torch.randn(batch_size, N_OBS, generator=g),
        next_obs=torch.randn(batch_size, N_OBS, generator=g),
        actions=torch.rand(batch_size, N_ACT, generator=g) * 4 - 2,
        rewards=torch.randn(batch_size, generator=g),
        terminations=(torch.rand(batch_size, generator=g) < 0.2).float(),
        batch_size=[batch_size],
    )


def flat(params):
    """One flat copy of a module's parameters, a TensorDict of them, or a pair of Q-networks
    (stacked as the twin stacks them, so both scripts' parameters line up)."""
    if isinstance(params, tuple):
        params = from_modules(*params)
    elif isinstance(params, torch.nn.Module):
        params = from_module(params)
    return torch.cat([p.detach().flatten() for p in params.data.values(True, True)])


def parameters(state):
    return {key: flat(value) for key, value in state.items()}


def one_step(updates, step=0, as_dict=False):
    """A critic step, an actor step and a target update on the batches of `step`, with the target
    policy's noise from a fixed seed."""
    update_critic, update_actor, update_targets, _ = updates
    critic_batch, actor_batch = make_batch(2 * step + 1), make_batch(2 * step + 2)
    if as_dict:
        critic_batch, actor_batch = critic_batch.to_dict(), actor_batch.to_dict()
    torch.manual_seed(123 + step)
    critic = update_critic(critic_batch)  # CleanRL's qf1_values, ..., qf_loss
    actor_loss = update_actor(actor_batch)
    update_targets()
    return torch.stack([*critic.values(), actor_loss])


def assert_same_steps(updates, reference, steps=1, as_dict=False):
    """Both sets of updates take `steps` steps from the same parameters: the same losses at each,
    the same parameters after each. float32, the same ops batched or fused in another order:
    losses agree to 1e-5 relative. Adam's first step moves a parameter by about lr * g / (|g| +
    eps): where g is ~1e-8 a last-bit difference in g shows up as ~1e-5 in the parameter, so
    parameters agree to 1.5e-5 absolute (5% of the learning rate)."""
    before = parameters(reference[3])
    for key, value in parameters(updates[3]).items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)  # the same start
    for step in range(steps):
        losses, reference_losses = (
            one_step(updates, step),
            one_step(reference, step, as_dict=as_dict),
        )
        torch.testing.assert_close(
            losses, reference_losses, rtol=1e-5, atol=1e-6, msg=f"losses, step {step + 1}"
        )
        after, after_reference = parameters(updates[3]), parameters(reference[3])
        for key in before:
            torch.testing.assert_close(
                after[key], after_reference[key], rtol=1e-5, atol=1.5e-5, msg=f"{key}, {step}"
            )
    for key, value in parameters(reference[3]).items():
        assert not torch.equal(value, before[key]), f"{key} did not change"


def test_twin_update_equals_eager_script_update():
    """The ensemble, the stacked fused Adam and the lerp_ targets compute what CleanRL's two
    networks compute."""
    assert_same_steps(
        build_twin_updates(load_script(TWIN), False),
        build_eager_updates(load_script(EAGER)),
        as_dict=True,
    )


def test_cpu_functional_update_equals_eager_script_update():
    """torch.func gradients, optimizers.py's Adam and the lerp_ targets take the eager script's
    autograd steps with torch.optim.Adam, step for step (3 steps: Adam's bias corrections and its
    moments past their first values)."""
    functional = build_cpu_updates(load_script(CPU))
    assert_same_steps(functional, build_eager_updates(load_script(EAGER)), steps=3, as_dict=True)


def drawing_inductors_noise(updates, monkeypatch):
    """`updates` whose critic step draws the target policy's noise as the compiled one does:
    inductor's own randn kernel (Philox, keyed by a seed drawn from torch's generator), where
    eager code draws from the generator itself."""
    update_critic, *rest = updates
    randn_like = torch.randn_like
    inductor_randn_like = torch.compile(lambda x: randn_like(x), fullgraph=True)

    def critic_step(data):
        with monkeypatch.context() as patch:
            patch.setattr(torch, "randn_like", inductor_randn_like)
            return update_critic(data)

    return (critic_step, *rest)


def assert_compiled_equals_eager_and_never_recompiles(build, module, monkeypatch):
    """`build`'s compiled updates, as the scripts compile them (inductor's random numbers, not
    `fallback_random`), take their eager selves' first 30 steps, the targets moving in between, when
    the eager critic draws the same noise; then, warmed up, 3 more steps on new batches with
    `fail_on_recompile`: the same compiled functions, so no second compile."""
    compiled = build(module, compile_updates=True)
    assert_same_steps(
        compiled,
        drawing_inductors_noise(build(module, compile_updates=False), monkeypatch),
        steps=30,
    )
    target_before = parameters(compiled[3])["target_actor"]
    with torch.compiler.set_stance("fail_on_recompile"):
        losses = torch.stack([one_step(compiled, step) for step in range(30, 33)])
    assert torch.isfinite(losses).all()
    # updated in place
    assert not torch.equal(parameters(compiled[3])["target_actor"], target_before)


@pytest.mark.slow  # compiles TD3's updates (32 s here)
def test_twin_compiled_update_equals_eager_update_without_recompiling(monkeypatch):
    """`--compile`: the module updates, compiled as `main` compiles them on every device."""
    assert_compiled_equals_eager_and_never_recompiles(
        build_twin_updates, load_script(TWIN), monkeypatch
    )


@pytest.mark.slow  # compiles both kinds of step, with a C++ wrapper (27 s here)
def test_cpu_update_compiled_is_its_eager_self_and_never_recompiles(monkeypatch):
    """What the CPU script's `--compile` compiles: `update`, a step's updates, one graph for each
    kind of step (with a C++ wrapper and its guards, as `main` has them). A policy step returns the
    critic's and the actor's losses and moves the targets, the step between returns the critic's
    alone (the loop logs the last actor loss); compiled, each kind of step takes its eager step (the
    noise from torch's generator in both); after each kind has run once, nothing recompiles."""
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    module = load_script(CPU)
    compiled, eager = build_learner(module), build_learner(module)
    options = {"cpp_wrapper": True, "guard_filter_fn": load_script("threads").step_guards}
    update = torch.compile(compiled.update, fullgraph=True, options=options)
    before = parameters(stacked_state(eager))
    for step, policy_step in enumerate([True, False, True, False]):
        with torch.compiler.set_stance("fail_on_recompile" if step >= 2 else "default"):
            torch.manual_seed(step)
            got = update(make_batch(step), policy_step)
        torch.manual_seed(step)
        want = eager.update(make_batch(step), policy_step)
        keys = {"qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss"}
        keys |= {"actor_loss"} if policy_step else set()
        assert got.keys() == want.keys() == keys
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        after = parameters(stacked_state(eager))
        for key, value in parameters(stacked_state(compiled)).items():
            torch.testing.assert_close(value, after[key], rtol=1e-5, atol=1.5e-5, msg=key)
    assert all(not torch.equal(after[key], value) for key, value in before.items())


def test_policy_explores_within_bounds():
    """Exploration noise is drawn per env and per action dimension, scaled to the action range,
    clipped."""
    module = load_script(TWIN)
    small_noise, wide_noise = (build_learner(module, exploration_noise=e) for e in (0.1, 10.0))
    obs = torch.zeros(1, N_OBS).expand(20_000, N_OBS)
    with torch.no_grad():
        mean = small_noise.actor(obs[:1])
        small = small_noise.policy(obs)
        wide = wide_noise.policy(obs)
    # std 0.1 half-ranges = 0.2 here; 20,000 draws give a standard error of the std below 0.002
    torch.testing.assert_close(small.std(0), torch.full((N_ACT,), 0.2), rtol=0, atol=0.01)
    torch.testing.assert_close(small.mean(0), mean[0], rtol=0, atol=0.01)
    assert wide.min() == -2 and wide.max() == 2  # clipped to the bounds, and most draws are clipped


def test_cpu_numpy_policy_is_the_torch_actor(monkeypatch):
    """Given numpy's draws (seeded with `seed`), the eager policy on the CPU actor's weights gives
    the numpy policy's actions (small and clipped wide noise), also after the weights change in
    place."""
    module, eager = load_script(CPU), load_script(EAGER)
    obs = np.random.default_rng(0).standard_normal((64, N_OBS), dtype=np.float32)
    for exploration_noise in (0.1, 10.0):
        learner = build_learner(module, exploration_noise=exploration_noise, seed=1)
        reference = build_learner(eager, exploration_noise=exploration_noise)
        policy, actor, draws = learner.policy, learner.actor, np.random.default_rng(1)
        for _ in range(2):
            actions = policy(obs)
            noise = torch.from_numpy(draws.standard_normal((64, N_ACT), dtype=np.float32))
            reference.actor.load_state_dict(actor.state_dict())
            with monkeypatch.context() as m, torch.no_grad():
                m.setattr(eager.torch, "randn_like", lambda actions, noise=noise: noise)
                expected = reference.policy(torch.from_numpy(obs))
            torch.testing.assert_close(torch.from_numpy(actions), expected, rtol=1e-5, atol=1e-5)
            with torch.no_grad():
                for param in actor.parameters():
                    param.mul_(1.5).add_(0.1)
    assert actions.min() == -2 and actions.max() == 2  # the wide noise, clipped


@pytest.mark.parametrize("script", [EAGER, TWIN, CPU])
@pytest.mark.parametrize("flag", ["policy_noise", "exploration_noise", "noise_clip"])
def test_negative_noise_exits_2(script, flag, capsys):
    """TD3's own flags, checked in process (test_contract runs a whole script with a bad flag)."""
    module = load_script(script)
    with pytest.raises(SystemExit) as stop:
        module.check_args(module.Args(**{flag: -0.1}))
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--{flag.replace('_', '-')}" in lines[0], lines


@pytest.mark.learning
def test_cpu_script_learns_pendulum():
    """The CPU script, 10,000 steps, batches of 64 (64 s in the suite, 113 s at 256): the last 20
    episodes above -700. Seeds 1-10 gave -614.2 to -201.7, seed 1 -201.7 (AMD EPYC, Zen 4; at
    the default batch of 256, -494.8 to -152.7 on a Xeon, -365.4 to -220.7 on an EPYC); `--gamma
    0` -1369.4, random ~-1200."""
    flags = "--env-id Pendulum-v1 --total-timesteps 10000 --learning-starts 1000 --seed 1".split()
    flags += ["--batch-size", "64"]
    result = summary(run_script(CPU, *flags))
    assert result["episodes"] == 50
    assert result["return_mean"] > -700, result
    # what a smoke run checks of the CPU script compiled (test_smoke runs the other two scripts):
    # compiled by default, on the CPU, on the threads it measured
    assert (result["script"], result["compile"], result["cudagraphs"]) == (CPU, True, False)
    assert (result["device"], result["torch_version"]) == ("cpu", torch.__version__)
    assert result["sps"] > 0 and result["sps_wall"] > 0
    assert_measured_threads(result)
