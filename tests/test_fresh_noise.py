"""Fresh noise in every graphed function that samples; graphed updates equal to the eager ones.

A CUDA graph replays its kernels: a random draw whose seed and offset were recorded as constants
would explore with frozen noise (pytorch/rl#3002; docs/cuda.md says why torch 2.13 and tensordict
0.15.3 draw fresh numbers). Each function is built with a learning rate of 0 and called again and
again on the same input, so that only its noise can change its output. On CUDA (skipped elsewhere):
consecutive replays differ and 256 replays match the eager function's mean and std, and each twin's
graphed updates take the eager steps on the same batches and noise. On the CPU: the same statistics
for compiled acting, and the check refuses frozen noise and noise of the wrong scale."""

import numpy as np
import pytest
import test_td3_continuous_action as td3
import torch
from conftest import load_script, requires_cuda
from tensordict.nn import CudaGraphModule
from test_dqn import make_batch as dqn_batch
from test_ppo_continuous_action import make_minibatch as ppo_minibatch
from test_pqn import make_minibatch as pqn_minibatch
from test_sac_continuous_action import make_batch as sac_batch
from torch.utils._pytree import tree_leaves

BOUNDS = (-2 * np.ones(1), 2 * np.ones(1))  # test_sac_continuous_action's: 3 obs, 1 action
SEEDS = [1, 2, 3]
ENVS = 32  # per member: enough that two fresh draws of discrete actions never agree by chance
REPLAYS = 256
CPU = torch.device("cpu")


def randn(*shape, device):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device)


def members(make_batch, device):
    """One batch per member, [member, batch], as a seeds script's buffer samples them."""
    return dict(torch.stack([make_batch(k) for k in SEEDS]).to(device).items())


def sac_or_td3(module, args, device):  # the same fields in both
    learner = module.make_learner(args, 3, 1, *BOUNDS, device)
    data = sac_batch(0).to(device)
    return {
        "policy": (learner.policy, (randn(ENVS, 3, device=device),)),
        "update_critic": (learner.update_critic, (data,)),
        "update_actor": (learner.update_actor, (data,)),
    }


def policy_of(n_obs):
    """The policy of a learner for `n_obs` observations and 2 actions (DQN's 4, PPO's 3)."""

    def build(module, args, device):
        policy = module.make_learner(args, n_obs, 2, device).policy
        return {"policy": (policy, (randn(ENVS, n_obs, device=device),))}

    return build


def ppo_atari(module, args, device):
    policy = module.make_learner(args, 4, device).policy
    frames = torch.randint(0, 256, (ENVS, 4, 84, 84), generator=torch.Generator().manual_seed(0))
    return {"policy": (policy, (frames.to(torch.uint8).to(device),))}


def ppo_lstm(module, args, device):
    policy = module.make_learner(args, 2, 2, device).policy
    state = (torch.zeros(ENVS, 128, device=device), torch.zeros(ENVS, 128, device=device))
    obs, done = randn(1, ENVS, 2, device=device), torch.ones(1, ENVS, device=device)
    return {"policy": (policy, (obs, state, done))}


def ppo_mingru(module, args, device):
    learner = module.make_learner(args, 2, 2, device)
    agent, policy = learner.agent, learner.policy
    state = torch.zeros(agent.num_layers, ENVS, agent.state_size, device=device)
    obs, done = randn(1, ENVS, 2, device=device), torch.ones(1, ENVS, device=device)
    return {"policy": (policy, (obs, state, done))}


def sac_or_td3_seeds(module, args, device):
    learner = module.make_learner(args, 3, 1, *BOUNDS, SEEDS, device)
    data = members(sac_batch, device)
    return {
        "policy": (learner.policy, (randn(len(SEEDS), ENVS, 3, device=device),)),
        "update_critic": (learner.update_critic, (data,)),
        "update_actor": (learner.update_actor, (data,)),
    }


def dqn_seeds(module, args, device):
    policy = module.make_learner(args, 4, 2, SEEDS, device).policy
    return {"policy": (policy, (randn(len(SEEDS), ENVS, 4, device=device),))}


def ppo_seeds(module, args, device):
    policy = module.make_learner(args, 3, 2, SEEDS, device).policy
    return {"policy": (policy, (randn(len(SEEDS) * ENVS, 3, device=device),))}


# script -> (builder, the functions it records that draw random numbers)
SAMPLING = {
    "sac_continuous_action_torchcompile": (sac_or_td3, ("policy", "update_critic", "update_actor")),
    "td3_continuous_action_torchcompile": (sac_or_td3, ("policy", "update_critic")),
    "dqn_torchcompile": (policy_of(4), ("policy",)),
    "ppo_continuous_action_torchcompile": (policy_of(3), ("policy",)),
    "ppo_continuous_action_distributed": (policy_of(3), ("policy",)),
    "ppo_atari_envpool_torchcompile": (ppo_atari, ("policy",)),
    "ppo_atari_envpool_async": (ppo_atari, ("policy",)),
    "ppo_lstm_torchcompile": (ppo_lstm, ("policy",)),
    "ppo_mingru_torchcompile": (ppo_mingru, ("policy",)),
    "sac_continuous_action_seeds": (sac_or_td3_seeds, ("policy", "update_critic", "update_actor")),
    "td3_continuous_action_seeds": (sac_or_td3_seeds, ("policy", "update_critic")),
    "dqn_seeds": (dqn_seeds, ("policy",)),
    "ppo_continuous_action_seeds": (ppo_seeds, ("policy",)),
    # DQN's and PPO Atari's shapes: 4 observations or 4 frames, 2 or 4 actions
    "pqn_torchcompile": (policy_of(4), ("policy",)),
    "pqn_atari_envpool_torchcompile": (ppo_atari, ("policy",)),
}
LEARNING_RATES = ("learning_rate", "q_lr", "policy_lr")


def build(script, device, compile=False, cudagraphs=False):
    """`script`'s sampling functions on `device`, every learning rate 0, wrapped as `main` does."""
    module = load_script(script)
    builder, names = SAMPLING[script]
    frozen = {name: 0.0 for name in LEARNING_RATES if hasattr(module.Args, name)}
    torch.manual_seed(1)
    args = module.Args(compile=compile, cudagraphs=cudagraphs, **frozen)
    functions = builder(module, args, device)
    for name in names:
        fn, inputs = functions[name]
        fn = torch.compile(fn) if compile else fn
        fn = CudaGraphModule(fn, warmup=3 if compile else 2) if cudagraphs else fn
        functions[name] = (fn, inputs)
    return {name: functions[name] for name in names}


def draws(fn, inputs, calls, policy, **kwargs):
    """[calls, outputs] of `calls` calls of `fn` after 4 of warm-up, float64 on the host."""
    rows = []
    with torch.no_grad() if policy else torch.enable_grad():
        for call in range(4 + calls):
            out = fn(*inputs, **kwargs)
            if call >= 4:
                rows.append(torch.cat([x.double() for x in flat_tensors(out)]))
    return torch.stack(rows).cpu()


# compiled against eager, the noiseless outputs: 1e-3 + 1e-3 x its size more. Inductor's kernels
# for a convolutional network move them by up to 5.4e-4 on an H200 (the Atari CNN's value, near 0),
# past 8 x the TF32 spread; a compiled graph is held to its ungraphed self at the tight tolerance.
COMPILED = 1e-3


def assert_fresh_noise_like(samples, reference, name, spread=None, compiled=False):
    """[calls, outputs] of a function against its eager self: noisy outputs differ between any two
    consecutive calls, means within 6 standard errors, the mean log std ratio under 0.05 + 4 x
    sqrt(2 / draws); noiseless outputs within 1e-5 + 1e-4 x size + 8 x `spread` (float32 against
    TF32, 0 on a CPU), and with `compiled` COMPILED x (1 + size) more."""
    mean, std = samples.mean(0), samples.std(0)
    ref_mean, ref_std = reference.mean(0), reference.std(0)
    noisy = ref_std > 0
    assert noisy.any(), f"{name}: no output of the eager function varies"
    noise = samples[:, noisy]
    repeats = [k for k in range(1, len(samples)) if torch.equal(noise[k], noise[k - 1])]
    assert not repeats, f"{name}: call {repeats[0]} drew the numbers of the call before (frozen)"
    error = ((std[noisy] ** 2 + ref_std[noisy] ** 2) / len(samples)).sqrt()
    z = ((mean[noisy] - ref_mean[noisy]) / error).abs()
    assert z.max() < 6, f"{name}: a mean {z.max():.1f} standard errors from the eager function's"
    log_ratio = (std[noisy] / ref_std[noisy]).log().mean()
    bound = 0.05 + 4 * (2 / (len(samples) * int(noisy.sum()))) ** 0.5
    assert log_ratio.abs() < bound, f"{name}: stds {log_ratio.exp():.2f}x the eager function's"
    spread = torch.zeros_like(ref_mean) if spread is None else spread
    tolerance = 1e-5 + 1e-4 * ref_mean.abs() + 8 * spread
    tolerance = tolerance + COMPILED * (1 + ref_mean.abs()) if compiled else tolerance
    off = ((mean - ref_mean).abs() - tolerance)[~noisy]
    assert not (off > 0).any(), f"{name}: a noiseless output {off.max():.2e} past its tolerance"


def precision_spread(fn, inputs, policy):
    """Per output of `fn(*inputs)`, how far it moves between full float32 and TF32."""
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn)
    saved = [flag.allow_tf32 for flag in flags]
    try:
        rows = []
        for tf32 in (False, True):
            for flag in flags:
                flag.allow_tf32 = tf32
            rows.append(draws(fn, inputs, 2, policy).mean(0))
    finally:
        for flag, value in zip(flags, saved):
            flag.allow_tf32 = value
    return (rows[1] - rows[0]).abs()


def assert_samples_like_eager(script, device, compile, cudagraphs, calls=REPLAYS):
    """Each sampling function as `main` wraps it against the eager one; compiled and graphed, also
    against itself ungraphed at the tight tolerance."""
    functions = build(script, device, compile, cudagraphs)
    eager = build(script, device)
    ungraphed = build(script, device, compile) if compile and cudagraphs else {}
    for name, (fn, inputs) in functions.items():
        reference_fn, reference_inputs = eager[name]
        policy = name == "policy"
        samples = draws(fn, inputs, calls, policy)
        reference = draws(reference_fn, reference_inputs, calls, policy)
        spread = precision_spread(reference_fn, reference_inputs, policy)
        assert_fresh_noise_like(samples, reference, f"{script}.{name}", spread, compile)
        if name in ungraphed:
            compiled = draws(*ungraphed[name], calls, policy)
            assert_fresh_noise_like(samples, compiled, f"{script}.{name} against itself ungraphed")


@requires_cuda
@pytest.mark.parametrize("compile", [False, True], ids=["cudagraphs", "compile-cudagraphs"])
@pytest.mark.parametrize("script", SAMPLING)
def test_graphed_functions_draw_fresh_noise_distributed_as_eager(script, compile):
    assert_samples_like_eager(script, torch.device("cuda"), compile, cudagraphs=True)


def on(device, batch):
    """A TensorDict or a dict of tensors, on `device`."""
    return batch.to(device) if hasattr(batch, "to") else {k: v.to(device) for k, v in batch.items()}


def sac_updates(module, args, device):
    learner = module.make_learner(args, 3, 1, *BOUNDS, device)
    optimizers = (learner.q_optimizer, learner.actor_optimizer, learner.alpha_optimizer)
    return optimizers, [
        (learner.update_critic, lambda k: sac_batch(2 * k).to(device)),
        (learner.update_actor, lambda k: sac_batch(2 * k + 1).to(device)),
    ]


def td3_updates(module, args, device):
    learner = module.make_learner(args, td3.N_OBS, td3.N_ACT, td3.LOW, td3.HIGH, device)
    return [learner.q_optimizer, learner.actor_optimizer], [
        (learner.update_critic, lambda k: td3.make_batch(2 * k).to(device)),
        (learner.update_actor, lambda k: td3.make_batch(2 * k + 1).to(device)),
    ]


def dqn_updates(module, args, device):
    learner = module.make_learner(args, 4, 2, device)
    return [learner.optimizer], [(learner.update, lambda k: on(device, dqn_batch(seed=k)))]


def pqn_updates(module, args, device):
    learner = module.make_learner(args, 4, 2, device)
    return [learner.optimizer], [(learner.update, lambda k: pqn_minibatch(k).to(device))]


def ppo_updates(module, args, device):
    learner = module.make_learner(args, 3, 2, device)
    return [learner.optimizer], [(learner.update, lambda k: ppo_minibatch(k).to(device))]


# twin -> (its optimizers and (update, batch of step k) pairs, whether `main` compiles the updates:
# the PPO twins' `make_learner` compiles the loss itself under --compile, Adam's step stays eager)
UPDATES = {
    "sac_continuous_action_torchcompile": (sac_updates, True),
    "td3_continuous_action_torchcompile": (td3_updates, True),
    "dqn_torchcompile": (dqn_updates, True),
    "ppo_continuous_action_torchcompile": (ppo_updates, False),
    "pqn_torchcompile": (pqn_updates, True),
}


def build_updates(script, device, compile, cudagraphs):
    """`script`'s updates as `main` wraps them, and the weights its optimizers step."""
    module = load_script(script)
    builder, compiled_by_main = UPDATES[script]
    torch.manual_seed(1)
    args = module.Args(compile=compile, cudagraphs=cudagraphs)
    optimizers, updates = builder(module, args, device)
    wrapped = []
    for update, batch in updates:
        update = torch.compile(update) if compile and compiled_by_main else update
        update = CudaGraphModule(update, warmup=3 if compile else 2) if cudagraphs else update
        wrapped.append((update, batch))
    params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
    return wrapped, params


def steps(updates, count):
    """`count` steps of every update, step k on the batches of k with the generator reseeded to k;
    the losses."""
    losses = []
    for step in range(count):
        for update, batch in updates:
            torch.manual_seed(step)
            losses += flat_tensors(update(batch(step)))
    return torch.cat(losses)


def flat(params):
    return torch.cat([p.detach().flatten() for p in params])


def flat_tensors(out):
    """The tensors of a function's output, detached and flattened."""
    return [x.detach().flatten() for x in tree_leaves(out) if isinstance(x, torch.Tensor)]


@requires_cuda
@pytest.mark.parametrize("script", UPDATES)
def test_graphed_updates_take_the_eager_steps(script, monkeypatch):
    """8 steps with inductor's `fallback_random` (compiled code draws with torch's generator):
    losses to 1e-4 relative, weights to 1e-4 absolute (a third of one Adam step)."""
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    cuda = torch.device("cuda")
    graphed, graphed_params = build_updates(script, cuda, compile=True, cudagraphs=True)
    eager, eager_params = build_updates(script, cuda, compile=False, cudagraphs=False)
    before = flat(eager_params).clone()
    torch.testing.assert_close(steps(graphed, 8), steps(eager, 8), rtol=1e-4, atol=1e-5)
    after = flat(eager_params)
    torch.testing.assert_close(flat(graphed_params), after, rtol=1e-4, atol=1e-4)
    assert not torch.equal(after, before), "the eager weights did not move"


@pytest.mark.parametrize(
    "script", ["sac_continuous_action_torchcompile", "dqn_torchcompile", "pqn_torchcompile"]
)
def test_compiled_acting_draws_fresh_noise_distributed_as_eager(script):
    """Compiled on this CPU, inductor draws new seeds each call: consecutive calls differ and 128
    calls match eager ones (SAC's Gaussian noise, DQN's coin, PQN's coin per env)."""
    functions = build(script, CPU, compile=True)
    eager = build(script, CPU)
    samples = draws(*functions["policy"], calls=128, policy=True)
    assert_fresh_noise_like(samples, draws(*eager["policy"], calls=128, policy=True), script)


def test_the_check_refuses_frozen_noise_and_the_wrong_scale():
    """Replayed draws and noise 1.5x too wide or shifted by one std fail; a fresh draw passes."""
    noise = torch.randn(4)
    law = lambda scale=1.0, shift=0.0: lambda: (scale * torch.randn(4) + shift,)  # noqa: E731
    reference = draws(law(), (), 256, policy=True)
    assert_fresh_noise_like(draws(law(), (), 256, policy=True), reference, "fresh")
    faults = {"frozen": lambda: (noise,), "wide": law(scale=1.5), "shifted": law(shift=1.0)}
    for name, fn in faults.items():
        with pytest.raises(AssertionError):
            assert_fresh_noise_like(draws(fn, (), 256, policy=True), reference, name)


def test_the_check_refuses_a_wrong_weight_or_swapped_outputs():
    """A weight off by 0.01 or swapped noiseless outputs fail, the right one compiled passes, a
    shift of 3x the spread passes and 20x fails; compiled against eager, the H200's measured
    shifts pass and a weight off by 0.1 fails."""
    torch.manual_seed(0)
    weights = torch.randn(2, 8)
    obs = torch.randn(8)

    def policy(weights=weights, swap=False, shift=0.0):
        values = weights @ obs + shift
        values = values.flip(0) if swap else values
        return (values, torch.randn(3))  # two noiseless outputs, then the noise

    reference = draws(policy, (), 64, policy=True)
    right = draws(torch.compile(policy), (), 64, policy=True)
    assert_fresh_noise_like(right, reference, "compiled")
    wrong = weights.clone()
    wrong[0, 3] += 0.01
    for name, fault in {"weight": dict(weights=wrong), "swap": dict(swap=True)}.items():
        with pytest.raises(AssertionError, match="noiseless output"):
            assert_fresh_noise_like(draws(policy, (), 64, True, **fault), reference, name)
    spread = torch.full_like(reference[0], 1e-3)
    near, far = (draws(policy, (), 64, True, shift=k * 1e-3) for k in (3, 20))
    assert_fresh_noise_like(near, reference, "within the spread", spread)
    with pytest.raises(AssertionError, match="noiseless output"):
        assert_fresh_noise_like(far, reference, "past the spread", spread)
    # compiled against eager: the Atari scripts' measured shifts pass (PQN's 3.23e-4 and PPO's
    # 7.67e-5 past the tight tolerance, here added to its edge), a weight off by 0.1 does not
    edge = 1e-5 + 1e-4 * reference.mean(0)[:2].abs().max()
    for gap in (7.67e-5, 3.23e-4):
        shifted = draws(policy, (), 64, True, shift=float(edge) + gap)
        assert_fresh_noise_like(shifted, reference, "compiled", compiled=True)
    wrong[0, 3] += 0.09
    with pytest.raises(AssertionError, match="noiseless output"):
        assert_fresh_noise_like(
            draws(policy, (), 64, True, weights=wrong), reference, "0.1", None, True
        )
