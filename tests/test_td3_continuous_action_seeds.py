"""TD3's seeds script, N runs as one vmapped program: members start from the CPU script's weights
for their seeds; each member's critic step, delayed actor step and target update are the CPU
script's on its own state, batch and target policy noise, independent of the other members; the
vmapped policy is each member's actor with its exploration noise; the members learn Pendulum; the
per-member summary, model files single-seed scripts evaluate, bad inputs."""

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
from test_td3_continuous_action import (
    HIGH,
    LOW,
    N_ACT,
    N_OBS,
    build_learner,
    make_batch,
    stacked_state,
)

SEEDS_SCRIPT, CPU_SCRIPT = "td3_continuous_action_seeds", "td3_continuous_action_cpu"
SEEDS = [1, 2, 3]
CPU = torch.device("cpu")
load = functools.cache(load_script)  # one import per script


def fixed_noise(actions):
    """`torch.randn_like` made a function of its argument's values, the same for one member alone or
    vmapped."""
    return torch.sin(1e3 * actions.detach())


def build_cpu(seed, **flags):
    """The CPU script's functional updates with `flags` on the networks drawn with `seed` (in the
    order its make_learner draws them), with targets that differ from the online networks: the
    target actor's last layer 30x (most of its actions at the bounds, where the clip acts on the
    smoothing noise), the target Q networks' first 0.9x. Returns them and that state, each network
    a dict of its tensors."""
    learner = build_learner(load(CPU_SCRIPT), seed, **flags)
    update_critic, update_actor, update_targets = (
        learner.update_critic,
        learner.update_actor,
        learner.update_targets,
    )
    state = stacked_state(learner)
    with torch.no_grad():
        state["target_actor"].fc_mu.weight.mul_(30.0)
        state["qnet_target"]["fc1", "weight"].mul_(0.9)
    qnets = {
        key: dict(state[key].data.flatten_keys(".").items()) for key in ("qnet", "qnet_target")
    }
    actors = {
        key: {name: p.data for name, p in state[key].named_parameters()}
        for key in ("actor", "target_actor")
    }
    return (update_critic, update_actor, update_targets), actors | qnets


def build_seeds(seeds=SEEDS, **flags):
    """The seeds script's updates and policy with `flags` on the members `seeds`, their networks
    `build_cpu`'s, stacked into the tensors its learner's functions read and change in place;
    returns them and the stacked state."""
    mod = load(SEEDS_SCRIPT)
    states = [build_cpu(seed)[1] for seed in seeds]
    args = mod.Args(num_seeds=1, **flags)
    learner = mod.make_learner(args, N_OBS, N_ACT, LOW, HIGH, seeds, CPU)
    state = {
        "actor": learner.actor_params,
        "target_actor": learner.actor_target_params,
        "qnet": learner.q_optimizer.params,
        "qnet_target": dict(learner.qnet_target.flatten_keys(".").items()),
    }
    for key, params in state.items():
        for name, p in params.items():
            p.copy_(torch.stack([s[key][name] for s in states]))
    functions = (learner.update_critic, learner.update_actor, learner.update_targets)
    return functions, state, learner.policy


def flat(state, member=None):
    """Every parameter of a state (the seeds state's member `member`), one vector per network."""
    take = (lambda x: x) if member is None else (lambda x: x[member])
    return {
        key: torch.cat([take(p).flatten() for p in params.values()])
        for key, params in state.items()
    }


def take_step(functions, batch, step):
    """Iteration `step`'s updates on `batch`: the critic's, then on even steps the delayed actor's
    and the targets' (`--policy-frequency 2`); returns the critic's and the actor's losses (the
    actor's nan when it waits)."""
    update_critic, update_actor, update_targets = functions
    critic = update_critic(batch)  # CleanRL's qf1_values, ..., qf_loss
    actor_loss = torch.full_like(critic["qf_loss"], float("nan"))
    if step % 2 == 0:
        actor_loss = update_actor(batch)
        update_targets()
    return torch.stack([*critic.values(), actor_loss], -1)


def stacked_batches(step, members=3):
    """A batch per member (test_td3_continuous_action's, a different one each) and the same stacked
    on a seeds axis."""
    batches = [make_batch(100 * step + k).to_dict() for k in range(members)]
    return batches, {key: torch.stack([batch[key] for batch in batches]) for key in batches[0]}


# a sweep of two values of the learning rate, gamma, tau and the noise clip (16 settings, a member
# each), with a target policy noise of its own
SWEEP = dict(learning_rate=(3e-4, 3e-3), gamma=(0.99, 0.8), tau=(0.005, 0.5))
SWEEP |= dict(noise_clip=(0.5, 0.1), policy_noise=0.6)


@pytest.mark.parametrize("flags, seeds", [({}, SEEDS), (SWEEP, list(range(16)))], ids=["", "sweep"])
def test_each_members_update_is_the_cpu_scripts_update_on_its_inputs(flags, seeds, monkeypatch):
    """Four iterations (two with the delayed actor and target steps): member k's losses and
    parameters are the CPU script's with its flags on its own state and batch, also in a sweep.
    float64 to 1e-10: in float32 Adam's first step turns last-bit differences into 1e-4."""
    monkeypatch.setattr(torch, "randn_like", fixed_noise)
    torch.set_default_dtype(torch.float64)  # modules and batches; reset below
    points = load(SEEDS_SCRIPT).settings(load(SEEDS_SCRIPT).Args(**flags))
    settings = [points[k * len(points) // len(seeds)] for k in range(len(seeds))]
    try:
        seeds_functions, seeds_state, _ = build_seeds(seeds, **flags)
        singles = [
            build_cpu(seed, **{k: getattr(s, k) for k in SWEEP}) for seed, s in zip(seeds, settings)
        ]
        start = flat(seeds_state)
        for step in range(4):
            batches, stacked = stacked_batches(step, len(seeds))
            losses = take_step(seeds_functions, stacked, step)
            assert losses.shape == (len(seeds), 6) and losses.dtype == torch.float64
            for member, ((functions, state), batch) in enumerate(zip(singles, batches)):
                want = take_step(functions, batch, step)
                torch.testing.assert_close(
                    losses[member], want, rtol=1e-10, atol=1e-10, equal_nan=True
                )
                for key, value in flat(state).items():
                    torch.testing.assert_close(
                        flat(seeds_state, member)[key], value, rtol=1e-10, atol=1e-10, msg=key
                    )
    finally:
        torch.set_default_dtype(torch.float32)
    assert all(not torch.equal(value, start[key]) for key, value in flat(seeds_state).items())


def test_a_members_update_depends_on_its_own_batch_alone():
    """Two iterations, each with the actor's step and the targets', from the same state and random
    draws, on the same batches except member 0's: members 1 and 2 come out with exactly the same
    losses and parameters (bit for bit), member 0 with others."""
    outcomes = []
    for changed in (False, True):
        functions, state, _ = build_seeds()
        _, stacked = stacked_batches(0)
        if changed:
            stacked = {key: value.clone() for key, value in stacked.items()}
            stacked["obs"][0] += 1.0
            stacked["rewards"][0] = 1 - stacked["rewards"][0]
        torch.manual_seed(0)
        losses = torch.stack([take_step(functions, stacked, step=0) for _ in range(2)])
        outcomes.append((losses, [flat(state, member) for member in range(len(SEEDS))]))
    (losses, members), (losses_changed, members_changed) = outcomes
    assert torch.equal(losses[:, 1:], losses_changed[:, 1:])
    assert all(
        torch.equal(members[k][key], members_changed[k][key]) for k in (1, 2) for key in members[k]
    )
    assert not torch.equal(losses[:, 0], losses_changed[:, 0])
    assert not torch.equal(members[0]["actor"], members_changed[0]["actor"])


def test_each_member_starts_from_the_cpu_scripts_weights_with_its_seed():
    """Member k's actor and Q networks are the ones td3_continuous_action_cpu.py builds after
    seeding torch with `seed + k` (as its Run does); the global generator is left as it was."""
    mod, cpu = load(SEEDS_SCRIPT), load(CPU_SCRIPT)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    learner = mod.make_learner(mod.Args(), N_OBS, N_ACT, LOW, HIGH, SEEDS, CPU)
    actor_params, q_params = learner.actor_params, learner.q_optimizer.params
    assert torch.equal(torch.get_rng_state(), before)
    for member, seed in enumerate(SEEDS):
        torch.manual_seed(seed)
        single = cpu.make_learner(cpu.Args(), N_OBS, N_ACT, LOW, HIGH, CPU)
        assert all(
            torch.equal(actor_params[name][member], p)
            for name, p in single.actor.named_parameters()
        )
        assert all(
            torch.equal(q_params[name][member], p) for name, p in single.q_optimizer.params.items()
        )


def test_the_vmapped_policy_is_each_members_actor(monkeypatch):
    """The policy, one call for all members, gives the eager script's policy with each member's
    actor and exploration noise on that member's observations (the noise a smooth function of the
    action in both; a sweep of a small noise and a wide one that the bounds clip), also after the
    stacked weights change in place, as Adam changes them."""
    monkeypatch.setattr(torch, "randn_like", lambda actions: torch.sin(3 * actions))
    mod, eager = load(SEEDS_SCRIPT), load("td3_continuous_action")
    obs = torch.randn(2 * len(SEEDS), 16, N_OBS)
    # a sweep: members 0-2 with the small noise, 3-5 with the wide one
    args = mod.Args(num_seeds=len(SEEDS), exploration_noise=(0.1, 10.0))
    learner = mod.make_learner(args, N_OBS, N_ACT, LOW, HIGH, SEEDS * 2, CPU)
    actor_params, policy = learner.actor_params, learner.policy
    for _ in range(2):
        actions = policy(obs)
        for member in range(2 * len(SEEDS)):
            eager_args = eager.Args(exploration_noise=0.1 if member < len(SEEDS) else 10.0)
            reference = eager.make_learner(eager_args, N_OBS, N_ACT, LOW, HIGH, CPU)
            reference.actor.load_state_dict(
                {name: p[member] for name, p in actor_params.items()}, strict=False
            )
            with torch.no_grad():
                expected = reference.policy(obs[member])
            torch.testing.assert_close(actions[member], expected, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(actions[0], actions[1])
        actor_params["fc_mu.bias"].add_(torch.tensor([0.3, -0.2, 0.1] * 2)[:, None])
    assert actions[3:].min() == -2 and actions[3:].max() == 2  # the wide noise, clipped


def test_members_draw_their_own_noise_and_act_with_their_own_actors():
    """Under the real generator. Members with weights of their own and no exploration noise act as
    their own actors (no member reads another's slice). Members with the same weights, batch and
    observations draw apart (vmap's randomness="different"): their noisy actions and their critic
    losses (the target policy's smoothing noise) differ."""
    mod = load(SEEDS_SCRIPT)
    args = mod.Args(exploration_noise=0.0)
    learner = mod.make_learner(args, N_OBS, N_ACT, LOW, HIGH, SEEDS, CPU)
    actor_params, policy = learner.actor_params, learner.policy
    obs = torch.randn(1, 16, N_OBS).expand(len(SEEDS), 16, N_OBS).contiguous()
    actions = policy(obs)
    for member in range(len(SEEDS)):
        member_actor = mod.Actor(N_OBS, N_ACT, LOW, HIGH)
        own = {name: p[member] for name, p in actor_params.items()}
        member_actor.load_state_dict(own, strict=False)
        with torch.no_grad():
            torch.testing.assert_close(actions[member], member_actor(obs[member]))
    learner = mod.make_learner(mod.Args(), N_OBS, N_ACT, LOW, HIGH, SEEDS, CPU)
    actor_params, policy = learner.actor_params, learner.policy
    for param in actor_params.values():
        param.copy_(param[0].expand_as(param).clone())  # every member is member 0
    (update_critic, _, _), _, _ = build_seeds(seeds=[1, 1, 1])
    batch = {key: x[:1].expand_as(x).clone() for key, x in stacked_batches(0)[1].items()}
    for values in (policy(obs), update_critic(batch)["qf_loss"]):
        assert not torch.equal(values[0], values[1]) and not torch.equal(values[1], values[2])


def test_a_nan_member_leaves_the_others_as_they_were_bit_for_bit():
    """Member 0's actor and Q networks turn nan: two iterations of updates (the actor's and the
    targets' included) and the policy raise nothing and give members 1 and 2 the losses, parameters
    and actions they have without it, bit for bit (the same draws)."""
    obs = torch.randn(len(SEEDS), 16, N_OBS)
    outcomes = []
    for poisoned in (False, True):
        functions, state, policy = build_seeds()
        if poisoned:
            state["actor"]["fc1.weight"][0, 3, 1] = float("nan")
            state["qnet"]["fc2.weight"][0, 1, 7, 7] = float("nan")
        _, stacked = stacked_batches(0)
        torch.manual_seed(0)
        losses = torch.stack([take_step(functions, stacked, step=0) for _ in range(2)])
        actions = policy(obs)
        outcomes.append((losses, actions, [flat(state, member) for member in range(len(SEEDS))]))
    (losses, actions, members), (losses_nan, actions_nan, members_nan) = outcomes
    # member 0's mean critic loss and its actor's (one clean critic's may be finite at first)
    assert losses_nan[:, 0, 4:].isnan().all() and actions_nan[0].isnan().all()
    assert torch.equal(losses[:, 1:], losses_nan[:, 1:])
    assert torch.equal(actions[1:], actions_nan[1:])
    assert all(torch.equal(members[k][x], members_nan[k][x]) for k in (1, 2) for x in members[0])


@long_learning
def test_the_members_learn_pendulum():
    """Two members as a user runs them, at test_td3_continuous_action.py's budget (batches of 128):
    the members' mean last-20 return above -600. Members of seeds 1-12 gave -568.3 to -159.4
    (Xeon; a bar of -300 each failed), this command -165.6 and -226.2 (EPYC); random play ~-1200,
    `--gamma 0` -1369.4."""
    flags = "--env-id Pendulum-v1 --total-timesteps 10000 --learning-starts 1000 --seed 1".split()
    s = summary(
        run_script(SEEDS_SCRIPT, "--num-seeds", 2, *flags, *"--batch-size 128 --threads 1".split())
    )
    assert s["compile"] is True and s["seeds"] == [1, 2]
    assert s["total_timesteps"] == 10000 and s["episodes"] == 2 * 50
    assert np.mean(s["return_means"]) > -600, s["return_means"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    return actor_critic_seeds_smoke_run(SEEDS_SCRIPT, tmp_path_factory.mktemp("smoke"))


def test_smoke_summary_reports_every_member_and_saves_a_file_each(smoke_run):
    actor = load("td3_continuous_action").Actor(3, 1, -2 * np.ones(1), 2 * np.ones(1))
    assert_seeds_smoke_summary(smoke_run, SEEDS_SCRIPT, actor)


@pytest.mark.parametrize("script", ["td3_continuous_action", "td3_continuous_action_cpu"])
def test_a_single_seed_script_evaluates_a_member_file_as_the_member_did(smoke_run, script):
    """The eager and the CPU script load member 2's file and, given its seed, replay that member's
    evaluation."""
    flags = ("--env-id", "Pendulum-v1", "--seed", 2, "--eval-model", smoke_run["model_files"][1])
    flags += ("--eval-episodes", 1)
    assert summary(run_script(script, *flags))["eval_returns"] == smoke_run["eval_returns"][1]


def test_eval_model_evaluates_a_file_as_every_member(smoke_run):
    flags = ("--env-id", "Pendulum-v1", "--eval-episodes", 1)
    assert_every_member_replays(SEEDS_SCRIPT, smoke_run, *flags)


# the other flag checks are td3_continuous_action_cpu.py's (test_td3_continuous_action.py)
BAD_INPUTS = [
    (("--num-seeds", 0), ("--num-seeds",)),
    # 3,353 GiB of replay buffers
    (("--num-seeds", 100_000, "--env-id", "Pendulum-v1"), ("--num-seeds", "GiB")),
    (("--cudagraphs",), ("--cudagraphs",)),
    (("--seed", 2**31 - 4), ("--seed",)),  # member 8's seed is 2**31 + 3
    (("--threads", 0), ("--threads",)),
    (("--exploration-noise", -0.1), ("--exploration-noise",)),
    (("--env-id", "CartPole-v1"), ("--env-id", "Box")),
]


@pytest.mark.parametrize("flags, words", BAD_INPUTS, ids=lambda x: " ".join(map(str, x)))
def test_bad_inputs_exit_2_with_one_line(flags, words, refused):
    refused(SEEDS_SCRIPT, flags, words)
