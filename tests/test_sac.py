"""SAC: both twins run, the compiled update is the eager update, nothing recompiles, bad input exits 2, and both
twins learn Pendulum-v1."""


import numpy as np
import pytest
import torch
from conftest import load_script, run_script, summary
from tensordict import TensorDict, from_modules

EAGER, TWIN = "sac_continuous_action", "sac_continuous_action_torchcompile"
# 3 Pendulum episodes of 200 steps; 100 gradient steps after the random phase
SMOKE = ("--env-id", "Pendulum-v1", "--total-timesteps", "600", "--learning-starts", "500", "--batch-size", "32")


@pytest.mark.parametrize(
    "script, flags",
    [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile",)), (EAGER, ("--no-autotune",)), (TWIN, ("--no-autotune",))],
    ids=["eager", "twin", "twin-compile", "eager-no-autotune", "twin-no-autotune"],
)
def test_smoke(script, flags):
    result = summary(run_script(script, *SMOKE, "--measure-burnin", "5", *flags))
    assert result["script"] == script
    assert result["compile"] is ("--compile" in flags)
    assert (result["env_id"], result["total_timesteps"], result["num_envs"]) == ("Pendulum-v1", 600, 1)
    assert result["episodes"] == 3
    assert -2000 < result["return_mean"] < 0
    assert result["sps"] > 0 and result["sps_wall"] > 0


@pytest.mark.parametrize("script", [EAGER, TWIN])
def test_several_envs_log_every_episode(script):
    # two Pendulum envs truncate on the same step: 800 steps are 400 vector steps, 2 episodes per env
    result = summary(run_script(script, *SMOKE[:2], "--total-timesteps", "800", "--learning-starts", "700", "--num-envs", "2"))
    assert (result["num_envs"], result["total_timesteps"], result["episodes"]) == (2, 800, 4)


def build_twin_updates(module, compile_updates, seed=0, n_obs=3, n_act=1, functional=False):
    """The twin's networks, optimizers and update functions, from a fixed seed: the module updates with fused Adam
    (what runs on CUDA, and on a CPU without `--compile`) or, with `functional`, the functional updates that
    `--compile` compiles whole on a CPU."""
    torch.manual_seed(seed)
    args = module.Args()
    actor = module.Actor(n_obs, n_act, -2 * np.ones(n_act), 2 * np.ones(n_act))
    qnet_params = from_modules(module.SoftQNetwork(n_obs, n_act), module.SoftQNetwork(n_obs, n_act), as_module=True)
    qnet_target = qnet_params.data.clone()
    log_alpha = torch.zeros((), requires_grad=True)  # autotuning starts at alpha = 1, as in the twin
    alpha = log_alpha.detach().exp()
    optimizers = (  # as the twin builds them on a CPU
        torch.optim.Adam(qnet_params.values(True, True), lr=args.q_lr, fused=True),
        torch.optim.Adam(actor.parameters(), lr=args.policy_lr, fused=True),
        torch.optim.Adam([log_alpha], lr=args.q_lr, fused=True),
    )
    ensemble_qf, ensemble_qf_target = module.make_ensemble_qf(n_obs, n_act), module.make_ensemble_qf(n_obs, n_act)
    update_critic, update_actor, update_targets = module.make_updates(
        actor, ensemble_qf, ensemble_qf_target, qnet_params, qnet_target, log_alpha, alpha, optimizers, args, -float(n_act)
    )
    if functional:
        update_critic, update_actor, _ = module.make_functional_updates(
            actor, qnet_params, qnet_target, log_alpha, alpha, args, -float(n_act)
        )
    if compile_updates:
        update_critic = torch.compile(update_critic, fullgraph=functional)
        update_actor = torch.compile(update_actor, fullgraph=functional)
    state = {"actor": actor, "qnet": qnet_params, "qnet_target": qnet_target, "log_alpha": log_alpha, "alpha": alpha}
    return update_critic, update_actor, update_targets, state


def make_batch(seed, batch_size=64, n_obs=3, n_act=1):
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        obs=torch.randn(batch_size, n_obs, generator=g),
        next_obs=torch.randn(batch_size, n_obs, generator=g),
        actions=torch.rand(batch_size, n_act, generator=g) * 4 - 2,
        rewards=torch.randn(batch_size, generator=g),
        terminations=(torch.rand(batch_size, generator=g) < 0.2).float(),
        batch_size=[batch_size],
    )


def parameters(state):
    return {
        "actor": torch.cat([p.detach().flatten() for p in state["actor"].parameters()]),
        "qnet": torch.cat([p.flatten() for p in state["qnet"].data.values(True, True)]),
        "qnet_target": torch.cat([p.flatten() for p in state["qnet_target"].values(True, True)]),
        "log_alpha": state["log_alpha"].detach().clone().reshape(1),
    }


def assert_same_steps(updates, reference, steps=1):
    """Both sets of updates take `steps` steps (critic, actor and entropy, targets) from the same parameters, with
    the actor's noise from one seed: the same losses and the same parameters after them. float32, the same ops in
    another fused order: losses agree to 1e-5 relative. Adam's first step moves a parameter by about
    lr * g / (|g| + eps): where g is ~1e-8 a last-bit difference in g shows up as ~1e-5 in the parameter, so
    parameters agree to 5e-5 (5% of q_lr)."""
    before = parameters(reference[3])
    losses = {}
    for name, (update_critic, update_actor, update_targets, state) in {"updates": updates, "reference": reference}.items():
        torch.manual_seed(123)
        step_losses = []
        for step in range(steps):
            qf_loss = update_critic(make_batch(2 * step + 1))
            actor_loss, alpha_loss = update_actor(make_batch(2 * step + 2))
            update_targets()
            step_losses += [qf_loss, actor_loss, alpha_loss]
        losses[name] = torch.stack(step_losses)
    torch.testing.assert_close(losses["updates"], losses["reference"], rtol=1e-5, atol=1e-6)
    after, after_reference = parameters(updates[3]), parameters(reference[3])
    for key in before:
        assert not torch.equal(after_reference[key], before[key]), f"{key} did not change"
        torch.testing.assert_close(after[key], after_reference[key], rtol=1e-5, atol=5e-5)
    torch.testing.assert_close(updates[3]["alpha"], updates[3]["log_alpha"].detach().exp())


def test_host_policy_is_get_action_in_numpy(monkeypatch):
    """The CPU fast path's numpy policy draws its noise from numpy's generator seeded with `seed`; given the same
    draws, `Actor.get_action` gives the same action, log-probability and squashed mean, on the actor's current
    weights (changed in place, as the fast path's Adam changes them)."""
    module = load_script(TWIN)
    torch.manual_seed(0)
    actor = module.Actor(3, 2, np.full(2, -2.0), np.full(2, 2.0))
    obs = np.random.default_rng(0).standard_normal((64, 3), dtype=np.float32)
    policy, draws = module.make_host_policy(actor, seed=1), np.random.default_rng(1)
    for _ in range(2):
        got = policy(obs)
        noise = torch.from_numpy(draws.standard_normal((64, 2), dtype=np.float32))
        with monkeypatch.context() as m, torch.no_grad():
            m.setattr(module.torch, "randn_like", lambda mean: noise)
            expected = actor.get_action(torch.from_numpy(obs))
        for name, value, want in zip(("action", "log_prob", "mean"), got, expected):
            torch.testing.assert_close(torch.from_numpy(value), want, rtol=1e-5, atol=1e-5, msg=name)
        with torch.no_grad():
            actor.fc_mean.bias.add_(0.3)


def test_functional_update_equals_module_update():
    """The CPU fast path (torch.func gradients, Adam written out) takes the module updates' steps with fused Adam."""
    module = load_script(TWIN)
    modules = build_twin_updates(module, compile_updates=False)
    functional = build_twin_updates(module, compile_updates=False, functional=True)
    assert_same_steps(functional, modules, steps=3)


def test_compiled_update_equals_eager_update(monkeypatch):
    """`--compile` on a CPU: each functional update compiled as one graph takes the eager functional step."""
    # compiled code draws the actor's noise with torch's own generator, as eager code does
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    module = load_script(TWIN)
    eager = build_twin_updates(module, compile_updates=False, functional=True)
    compiled = build_twin_updates(module, compile_updates=True, functional=True)
    assert_same_steps(compiled, eager)


def test_no_recompilation_after_warmup():
    module = load_script(TWIN)
    update_critic, update_actor, update_targets, state = build_twin_updates(module, compile_updates=True, functional=True)
    for seed in range(2):
        update_critic(make_batch(seed))
        update_actor(make_batch(seed))
        update_targets()
    alpha_before = state["alpha"].clone()
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed in range(2, 5):
            update_critic(make_batch(seed))
            update_actor(make_batch(seed))
            update_targets()
    assert not torch.equal(state["alpha"], alpha_before)  # alpha is updated in place, read by the next call


@pytest.mark.learning
@pytest.mark.parametrize("script, flags", [(EAGER, ()), (TWIN, ("--compile",))], ids=["eager", "twin-compile"])
def test_learns_pendulum(script, flags):
    """8,000 steps, 1,000 of them random: 2.5-3 minutes each on a 2-core EPYC, where seed 1 reaches about -130
    per episode after ~3,500 steps and the last 20 episodes average -146 (both twins). A random policy scores
    about -1200 on Pendulum-v1; a broken update stays below -600."""
    result = summary(
        run_script(script, "--env-id", "Pendulum-v1", "--total-timesteps", "8000", "--learning-starts", "1000", "--seed", "1", *flags)
    )
    assert result["episodes"] == 40
    assert result["return_mean"] > -300, result
