"""SAC's seeds script, N runs as one vmapped program: members start from the CPU script's weights
for their seeds; each member's critic, actor, entropy and target steps are the CPU script's on its
own state and batch, independent of the other members; the vmapped policy is each member's actor;
the members learn Pendulum; the per-member summary, model files a single-seed script evaluates,
bad inputs."""

import functools

import numpy as np
import pytest
import torch
from conftest import (
    actor_critic_seeds_smoke_run,
    assert_every_member_replays,
    assert_seeds_smoke_summary,
    load_script,
    long_learning,
    run_script,
    summary,
)
from tensordict import from_modules
from test_sac_continuous_action import HIGH, LOW, N_ACT, N_OBS, make_batch

SEEDS_SCRIPT, CPU_SCRIPT = "sac_continuous_action_seeds", "sac_continuous_action_cpu"
SEEDS = [1, 2, 3]
CPU = torch.device("cpu")
load = functools.cache(load_script)  # one import per script


def fixed_noise(mean):
    """`torch.randn_like` made a function of its argument's values, the same for one member alone or
    vmapped."""
    return torch.sin(1e3 * mean.detach())


def member_state(seed):
    """The CPU script's networks drawn with `seed` (actor, then both Q networks, as its make_learner
    draws them), with target networks that differ from the online ones (the first layer 0.9x) and a
    log alpha of its own."""
    mod = load(CPU_SCRIPT)
    torch.manual_seed(seed)
    actor = mod.Actor(N_OBS, N_ACT, LOW, HIGH)
    qnet = from_modules(mod.SoftQNetwork(N_OBS, N_ACT), mod.SoftQNetwork(N_OBS, N_ACT)).detach()
    qnet_target = qnet.clone()
    qnet_target["fc1", "weight"].mul_(0.9)
    log_alpha = torch.tensor(0.1 * seed - 0.2)
    return actor, qnet, qnet_target, log_alpha


def build_cpu(seed, **flags):
    """The CPU script's update functions with `flags` on member `seed`'s state; returns them with
    that state."""
    mod = load(CPU_SCRIPT)
    actor, qnet, qnet_target, log_alpha = member_state(seed)
    learner = mod.make_learner(mod.Args(**flags), N_OBS, N_ACT, LOW, HIGH)
    # the member's state, copied into the tensors the learner's updates read and change in place
    for name, p in learner.actor_params.items():
        p.copy_(actor.get_parameter(name))
    learner.qnet_params.data.update_(qnet)
    learner.qnet_target.update_(qnet_target)
    learner.log_alpha.copy_(log_alpha)
    learner.alpha.copy_(log_alpha.exp())
    state = dict(
        actor=learner.actor_params,
        q=learner.qnet_params.data,
        q_target=learner.qnet_target,
        log_alpha=learner.log_alpha,
        alpha=learner.alpha,
    )
    functions = (learner.update_critic, learner.update_actor, learner.update_targets)
    return functions, state


def build_seeds(autotune, seeds=SEEDS, **flags):
    """The seeds script's update functions with `flags` on the members `seeds`, stacked from
    `member_state`; returns them with the stacked state."""
    mod = load(SEEDS_SCRIPT)
    members = [member_state(seed) for seed in seeds]
    args = mod.Args(num_seeds=1, autotune=autotune, **flags)
    learner = mod.make_learner(args, N_OBS, N_ACT, LOW, HIGH, seeds, CPU)
    # the members' states, stacked into the tensors the learner's updates read and change in place
    for name, p in learner.actor_params.items():
        p.copy_(torch.stack([m[0].get_parameter(name).detach() for m in members]))
    learner.qnet_params.update_(torch.stack([m[1] for m in members]))
    learner.qnet_target.update_(torch.stack([m[2] for m in members]))
    learner.log_alpha.copy_(torch.stack([m[3] for m in members]))
    learner.alpha.copy_(learner.log_alpha.exp())
    state = dict(
        actor=learner.actor_params,
        q=learner.qnet_params,
        q_target=learner.qnet_target,
        log_alpha=learner.log_alpha,
        alpha=learner.alpha,
    )
    functions = (learner.update_critic, learner.update_actor, learner.update_targets)
    return functions, state


def flat(state, member=None):
    """Every parameter of a state (the seeds state's member `member`), one vector per kind."""
    take = (lambda x: x) if member is None else (lambda x: x[member])
    return {
        "actor": torch.cat([take(p).detach().flatten() for p in state["actor"].values()]),
        "q": torch.cat([take(p).flatten() for p in state["q"].flatten_keys(".").values()]),
        "q_target": torch.cat(
            [take(p).flatten() for p in state["q_target"].flatten_keys(".").values()]
        ),
        "log_alpha": take(state["log_alpha"]).reshape(-1).clone(),
    }


def take_step(functions, batch):
    """One iteration's updates (critic, actor and entropy, targets) on `batch`; returns the
    losses."""
    update_critic, update_actor, update_targets = functions
    critic = update_critic(batch)  # CleanRL's qf1_values, ..., qf_loss
    actor_loss, alpha_loss = update_actor(batch)
    update_targets()
    return torch.stack([*critic.values(), actor_loss, alpha_loss], -1)


def stacked_batches(step, members=3):
    """A batch per member (test_sac_continuous_action's, a different one each) and the same stacked
    on a seeds axis."""
    batches = [make_batch(100 * step + k) for k in range(members)]
    return batches, {
        key: torch.stack([batch[key] for batch in batches]) for key in batches[0].keys()
    }


# a sweep: autotune on and off, two values of the critic's learning rate, gamma and tau (16
# settings, a member each), with an actor's learning rate and an alpha of their own
SWEEP = dict(autotune=(True, False), q_lr=(1e-3, 3e-3), gamma=(0.99, 0.8), tau=(0.005, 0.5))
SWEEP |= dict(policy_lr=1e-3, alpha=0.5)
UPDATES = [(dict(autotune=True), SEEDS), (dict(autotune=False), SEEDS), (SWEEP, list(range(16)))]


@pytest.mark.parametrize("flags, seeds", UPDATES, ids=["autotune", "fixed-alpha", "sweep"])
def test_each_members_update_is_the_cpu_scripts_update_on_its_inputs(flags, seeds, monkeypatch):
    """Three iterations: member k's losses and parameters are the CPU script's with its flags on its
    own state and batch (noise a function of the input), also in a sweep where fixed-alpha members
    keep alpha. float64 to 1e-10 (in float32 Adam's first step turns last-bit gaps into 1e-4)."""
    monkeypatch.setattr(torch, "randn_like", fixed_noise)
    torch.set_default_dtype(torch.float64)  # modules and batches; reset below
    mod = load(SEEDS_SCRIPT)
    points = mod.settings(mod.Args(**flags))  # each setting's members together
    settings = [points[k * len(points) // len(seeds)] for k in range(len(seeds))]
    try:
        seeds_functions, seeds_state = build_seeds(seeds=seeds, **flags)
        singles = [
            build_cpu(seed, **{k: getattr(s, k) for k in (*SWEEP, "autotune")})
            for seed, s in zip(seeds, settings)
        ]
        start = flat(seeds_state)
        for step in range(3):
            batches, stacked = stacked_batches(step, len(seeds))
            losses = take_step(seeds_functions, stacked)
            assert losses.shape == (len(seeds), 7) and losses.dtype == torch.float64
            for member, ((functions, state), batch) in enumerate(zip(singles, batches)):
                torch.testing.assert_close(
                    losses[member], take_step(functions, batch), rtol=1e-10, atol=1e-10
                )
                for key, value in flat(state).items():
                    torch.testing.assert_close(
                        flat(seeds_state, member)[key], value, rtol=1e-10, atol=1e-10, msg=key
                    )
    finally:
        torch.set_default_dtype(torch.float32)
    changed = {key: not torch.equal(value, start[key]) for key, value in flat(seeds_state).items()}
    tuned = [s.autotune for s in settings]
    assert changed == {"actor": True, "q": True, "q_target": True, "log_alpha": any(tuned)}
    kept = seeds_state["log_alpha"] == start["log_alpha"]
    assert kept.tolist() == [not t for t in tuned]


def test_a_members_update_depends_on_its_own_batch_alone():
    """Two iterations from the same state and random draws, on the same batches except member 0's:
    members 1 and 2 come out with exactly the same losses and parameters (bit for bit), member 0
    with others."""
    outcomes = []
    for changed in (False, True):
        functions, state = build_seeds(autotune=True)
        _, stacked = stacked_batches(0)
        if changed:
            stacked = {key: value.clone() for key, value in stacked.items()}
            stacked["obs"][0] += 1.0
            stacked["rewards"][0] = 1 - stacked["rewards"][0]
        torch.manual_seed(0)
        losses = torch.stack([take_step(functions, stacked) for _ in range(2)])
        outcomes.append((losses, [flat(state, member) for member in range(len(SEEDS))]))
    (losses, members), (losses_changed, members_changed) = outcomes
    assert torch.equal(losses[:, 1:], losses_changed[:, 1:])
    assert all(
        torch.equal(members[k][key], members_changed[k][key]) for k in (1, 2) for key in members[k]
    )
    assert not torch.equal(losses[:, 0], losses_changed[:, 0])
    assert not torch.equal(members[0]["actor"], members_changed[0]["actor"])


def test_each_member_starts_from_the_cpu_scripts_weights_with_its_seed():
    """Member k's actor and Q networks are the ones sac_continuous_action_cpu.py builds after
    seeding torch with `seed + k` (as its Run does), its targets equal its Q networks, its alpha
    is 1; the global generator is left as it was."""
    mod, cpu = load(SEEDS_SCRIPT), load(CPU_SCRIPT)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    learner = mod.make_learner(mod.Args(), N_OBS, N_ACT, LOW, HIGH, SEEDS, CPU)
    actor_params, alpha = learner.actor_params, learner.alpha
    assert torch.equal(torch.get_rng_state(), before) and torch.equal(alpha, torch.ones(len(SEEDS)))
    q_params, q_target = learner.q_optimizer.params, learner.qnet_target.flatten_keys(".")
    assert all(torch.equal(q_target[name], q_params[name]) for name in q_params)
    for member, seed in enumerate(SEEDS):
        torch.manual_seed(seed)
        learner = cpu.make_learner(cpu.Args(), N_OBS, N_ACT, LOW, HIGH)
        assert all(
            torch.equal(actor_params[name][member], p)
            for name, p in learner.actor.named_parameters()
        )
        assert all(
            torch.equal(q_params[name][member], p) for name, p in learner.q_optimizer.params.items()
        )


def test_the_vmapped_policy_is_each_members_actor(monkeypatch):
    """The policy, one call for all members, gives each member's `Actor.get_action` on that member's
    observations (action, log-probability, squashed mean; the noise a smooth function of the mean in
    both), also after the stacked weights change in place, as Adam changes them."""
    monkeypatch.setattr(torch, "randn_like", lambda mean: torch.sin(3 * mean))
    mod = load(SEEDS_SCRIPT)
    learner = mod.make_learner(mod.Args(), N_OBS, N_ACT, LOW, HIGH, SEEDS, CPU)
    actor_params, policy = learner.actor_params, learner.policy
    obs = torch.randn(len(SEEDS), 16, N_OBS)
    for _ in range(2):
        got = policy(obs)
        for member in range(len(SEEDS)):
            member_actor = mod.Actor(N_OBS, N_ACT, LOW, HIGH)
            member_actor.load_state_dict(
                {name: p[member] for name, p in actor_params.items()}, strict=False
            )
            with torch.no_grad():
                expected = member_actor.get_action(obs[member])
            for name, value, want in zip(("action", "log_prob", "mean"), got, expected):
                torch.testing.assert_close(value[member], want, rtol=1e-5, atol=1e-6, msg=name)
        assert not torch.allclose(got[2][0], got[2][1])
        actor_params["fc_mean.bias"].add_(torch.tensor([[0.3], [-0.2], [0.1]]))


def test_members_draw_their_own_noise_and_act_with_their_own_actors():
    """Under the real generator. Members with weights of their own: each one's squashed mean (no
    noise) is its own actor's (no member reads another's slice). Members with the same weights,
    batch and observations draw apart (vmap's randomness="different"): their actions, critic losses
    (the next actions' noise), actor losses and entropy losses differ."""
    mod = load(SEEDS_SCRIPT)
    learner = mod.make_learner(mod.Args(), N_OBS, N_ACT, LOW, HIGH, SEEDS, CPU)
    actor_params, policy = learner.actor_params, learner.policy
    obs = torch.randn(1, 16, N_OBS).expand(len(SEEDS), 16, N_OBS).contiguous()
    means = policy(obs)[2]
    for member in range(len(SEEDS)):
        member_actor = mod.Actor(N_OBS, N_ACT, LOW, HIGH)
        own = {name: p[member] for name, p in actor_params.items()}
        member_actor.load_state_dict(own, strict=False)
        with torch.no_grad():
            torch.testing.assert_close(means[member], member_actor.get_action(obs[member])[2])
    for param in actor_params.values():
        param.copy_(param[0].expand_as(param).clone())  # every member is member 0
    batch = {key: x[:1].expand_as(x).clone() for key, x in stacked_batches(0)[1].items()}
    critic_losses = build_seeds(autotune=True, seeds=[1, 1, 1])[0][0](batch)["qf_loss"]
    actor_losses = build_seeds(autotune=True, seeds=[1, 1, 1])[0][1](batch)
    for values in (policy(obs)[0], critic_losses, *actor_losses):
        assert not torch.equal(values[0], values[1]) and not torch.equal(values[1], values[2])


def test_a_nan_member_leaves_the_others_as_they_were_bit_for_bit():
    """Member 0's actor and Q networks turn nan: two iterations of updates and the policy raise
    nothing and give members 1 and 2 the losses, parameters and actions they have without it, bit
    for bit (the same draws)."""
    outcomes = []
    for poisoned in (False, True):
        functions, state = build_seeds(autotune=True)
        if poisoned:
            state["actor"]["fc1.weight"][0, 3, 1] = float("nan")
            state["q"]["fc2", "weight"][0, 1, 7, 7] = float("nan")
        _, stacked = stacked_batches(0)
        torch.manual_seed(0)
        losses = torch.stack([take_step(functions, stacked) for _ in range(2)])
        outcomes.append((losses, [flat(state, member) for member in range(len(SEEDS))]))
    (losses, members), (losses_nan, members_nan) = outcomes
    # member 0's mean critic loss and its actor's (one clean critic's may be finite at first)
    assert losses_nan[:, 0, 4:].isnan().all() and members_nan[0]["actor"].isnan().any()
    assert torch.equal(losses[:, 1:], losses_nan[:, 1:])
    assert all(torch.equal(members[k][x], members_nan[k][x]) for k in (1, 2) for x in members[0])


@long_learning
def test_the_members_learn_pendulum():
    """Two members as a user runs them, at test_sac_continuous_action.py's budget and bar (batches
    of 128): the members' mean last-20 return above -400. Members of seeds 1-12 gave -260.3 to
    -141.2 (Xeon), this command -178.7 and -160.2 (EPYC); random play ~-1200, a broken update
    below -600."""
    flags = "--env-id Pendulum-v1 --total-timesteps 8000 --learning-starts 1000 --seed 1".split()
    flags += ("--threads", 1, "--batch-size", 128)
    s = summary(run_script(SEEDS_SCRIPT, "--num-seeds", 2, *flags))
    assert s["compile"] is True and s["seeds"] == [1, 2]
    assert s["total_timesteps"] == 8000 and s["episodes"] == 2 * 40
    assert np.mean(s["return_means"]) > -400, s["return_means"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    return actor_critic_seeds_smoke_run(SEEDS_SCRIPT, tmp_path_factory.mktemp("smoke"))


def test_smoke_summary_reports_every_member_and_saves_a_file_each(smoke_run):
    assert_seeds_smoke_summary(
        smoke_run, SEEDS_SCRIPT, load("sac_continuous_action").Actor(N_OBS, N_ACT, LOW, HIGH)
    )


def test_a_single_seed_script_evaluates_a_member_file_as_the_member_did(smoke_run):
    """sac_continuous_action.py loads member 2's file and, given its seed, replays that member's
    evaluation."""
    flags = ("--env-id", "Pendulum-v1", "--seed", 2, "--eval-model", smoke_run["model_files"][1])
    flags += ("--eval-episodes", 1)
    replayed = summary(run_script("sac_continuous_action", *flags))
    assert replayed["eval_returns"] == smoke_run["eval_returns"][1]


def test_eval_model_evaluates_a_file_as_every_member(smoke_run):
    flags = ("--env-id", "Pendulum-v1", "--eval-episodes", 1)
    assert_every_member_replays(SEEDS_SCRIPT, smoke_run, *flags)


# the other flag checks are sac_continuous_action_cpu.py's (test_sac_continuous_action.py)
BAD_INPUTS = [
    (("--num-seeds", 0), ("--num-seeds",)),
    # 4,470 GiB of replay buffers
    (("--num-seeds", 100_000, "--env-id", "Pendulum-v1"), ("--num-seeds", "GiB")),
    (("--cudagraphs",), ("--cudagraphs",)),
    (("--seed", 2**31 - 4), ("--seed",)),  # member 8's seed is 2**31 + 3
    (("--threads", 0), ("--threads",)),
    (("--env-id", "CartPole-v1"), ("--env-id", "Box")),
]


@pytest.mark.parametrize("flags, words", BAD_INPUTS, ids=lambda x: " ".join(map(str, x)))
def test_bad_inputs_exit_2_with_one_line(flags, words, refused):
    refused(SEEDS_SCRIPT, flags, words)
