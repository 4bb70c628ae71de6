"""The acting policy of each optimized twin, built the way the twin's `main()` builds it, for
`benchmarks.studies.inference` and `benchmarks.studies.rpc_inference`.

Networks take the default env's sizes, written here so that no env is created (HalfCheetah-v4 17
observations and 6 actions, CartPole-v1 4 and 2, Breakout-v5 4x84x84 uint8 frames and 4). Each spec
says which outputs are deterministic: inductor draws its own random numbers, so sampled outputs
differ from eager even under the same seed.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tensordict import from_module

HALF_CHEETAH_OBS, HALF_CHEETAH_ACT = 17, 6
CARTPOLE_OBS, CARTPOLE_ACT = 4, 2
ATARI_FRAMES, ATARI_ACT = (4, 84, 84), 4


@dataclass(frozen=True)
class Built:
    """A policy ready to time: `source` is the training module whose weights it reads, `act` the
    function the twin calls to act (on a weight-sharing copy of `source`, or on `source` itself),
    `host` the CPU script's numpy policy on views of `source`'s weights (the `policy` that
    `<algo>_cpu.py` acts with; None on CUDA and where there is no CPU script), called with numpy
    arrays."""

    source: torch.nn.Module
    act: Callable
    host: Callable | None = None


@dataclass(frozen=True)
class PolicySpec:
    """How to build, feed and check the acting policy of one optimized twin."""

    name: str
    script: str
    build: Callable
    observe: Callable
    deterministic: Callable
    perturb: Callable
    threads: int | None
    note: str
    cpu_script: str | None = None


def scale_weights(module, factor=1.5):
    """Multiply every parameter of `module` by `factor`, in place."""
    with torch.no_grad():
        for param in module.parameters():
            param.mul_(factor)


def float_obs(n_obs):
    """An `observe` function: standard normal float32 observations of size `n_obs`."""

    def observe(batch, device, generator):
        return torch.randn(batch, n_obs, generator=generator).to(device)

    return observe


def atari_obs(batch, device, generator):
    """uint8 frame stacks [batch, 4, 84, 84], as envpool returns them."""
    return torch.randint(0, 256, (batch, *ATARI_FRAMES), dtype=torch.uint8, generator=generator).to(
        device
    )


def build_ppo_continuous(script, device, cpu=None):
    """PPO continuous: the agent and its weight-sharing acting copy; acting is
    `get_action_and_value`. The log-std is set to -20 (a weight, not an op): the sampled action
    is then the mean to within ~1e-8, so the whole actor can be compared."""
    agent = script.Agent(HALF_CHEETAH_OBS, HALF_CHEETAH_ACT, device=device)
    with torch.no_grad():
        agent.actor_logstd.fill_(-20.0)
    agent_inference = script.Agent(HALF_CHEETAH_OBS, HALF_CHEETAH_ACT, device=device)
    from_module(agent).data.to_module(agent_inference)
    if not cpu:
        return Built(agent, agent_inference.get_action_and_value)
    # the CPU script's learner, its agent a copy of this one: the source is both agents
    host = cpu.make_learner(cpu.Args(seed=0), HALF_CHEETAH_OBS, HALF_CHEETAH_ACT, device)
    host.agent.load_state_dict(agent.state_dict())
    source = torch.nn.ModuleList([agent, host.agent])
    return Built(source, agent_inference.get_action_and_value, host.policy)


def build_ppo_atari(script, device, cpu=None):
    """PPO Atari: the twin's learner (its agent channels-last on a CPU) and its weight-sharing
    acting copy; acting is `get_action_and_value`."""
    learner = script.make_learner(script.Args(), ATARI_ACT, device)
    return Built(learner.agent, learner.policy)


def build_sac(script, device, cpu=None):
    """SAC: the actor and its weight-sharing acting copy; acting is `get_action`."""
    low, high = -torch.ones(HALF_CHEETAH_ACT), torch.ones(HALF_CHEETAH_ACT)
    actor = script.Actor(HALF_CHEETAH_OBS, HALF_CHEETAH_ACT, low, high, device=device)
    actor_detach = script.Actor(HALF_CHEETAH_OBS, HALF_CHEETAH_ACT, low, high, device=device)
    from_module(actor).data.to_module(actor_detach)
    host = cpu.make_host_policy(actor, np.random.default_rng(0)) if cpu else None
    return Built(actor, actor_detach.get_action, host)


def build_td3(script, device, cpu=None):
    """TD3: the twin's learner, acting through its weight-sharing copy of the actor, with an
    exploration noise of 0: the same ops (the noise is still drawn, scaled and added), a
    deterministic action. With the CPU script, that script's learner too, its actor a copy of the
    twin's: the source is both actors, so that a change to it reaches both policies."""
    low, high = -torch.ones(HALF_CHEETAH_ACT), torch.ones(HALF_CHEETAH_ACT)
    sizes = (HALF_CHEETAH_OBS, HALF_CHEETAH_ACT, low, high)
    learner = script.make_learner(script.Args(exploration_noise=0.0), *sizes, device)
    if not cpu:
        return Built(learner.actor, learner.policy)
    host = cpu.make_learner(cpu.Args(exploration_noise=0.0, seed=0), *sizes, device)
    host.actor.load_state_dict(learner.actor.state_dict())
    source = torch.nn.ModuleList([learner.actor, host.actor])
    return Built(source, learner.policy, host.policy)


def build_dqn(script, device, cpu=None):
    """DQN: the learner's epsilon-greedy policy on the Q-network, with epsilon 0 (start_e = end_e =
    0): the same ops (the coins are still drawn), a greedy, deterministic action. The duration is
    the default's, 0.5 x 500k steps."""
    greedy = dict(start_e=0.0, end_e=0.0)
    learner = script.make_learner(script.Args(**greedy), CARTPOLE_OBS, CARTPOLE_ACT, device)
    host = None
    if cpu:
        host_learner = cpu.make_learner(cpu.Args(**greedy), CARTPOLE_OBS, CARTPOLE_ACT)
        # the twin's Q network on the host policy's memory: a change to one is a change to both
        learner.q_network.load_state_dict(host_learner.q_network.state_dict(), assign=True)
        host = host_learner.policy
    return Built(learner.q_network, learner.policy, host)


def negate_output_layer(q_network):
    """Negate the Q-network's last layer in place: every greedy action becomes the other one."""
    with torch.no_grad():
        for param in q_network.network[-1].parameters():
            param.neg_()


SPECS = {
    "ppo_continuous": PolicySpec(
        "ppo_continuous",
        "ppo_continuous_action_torchcompile",
        build_ppo_continuous,
        float_obs(HALF_CHEETAH_OBS),
        lambda out: {"action": out[0], "entropy": out[2], "value": out[3]},
        scale_weights,
        1,
        "action (= the mean, log-std -20), entropy and value; log-prob holds the noise",
        "ppo_continuous_action_cpu",
    ),
    "ppo_atari": PolicySpec(
        "ppo_atari",
        "ppo_atari_envpool_torchcompile",
        build_ppo_atari,
        atari_obs,
        lambda out: {"entropy": out[2], "value": out[3]},
        scale_weights,
        None,
        "entropy (all logits) and value; the sampled action and its log-prob hold the noise",
    ),
    "sac": PolicySpec(
        "sac",
        "sac_continuous_action_torchcompile",
        build_sac,
        float_obs(HALF_CHEETAH_OBS),
        lambda out: {"mean": out[2]},
        scale_weights,
        None,
        "the mean action; the sampled action and log-prob hold the noise (fc_logstd is not "
        "compared)",
        "sac_continuous_action_cpu",
    ),
    "td3": PolicySpec(
        "td3",
        "td3_continuous_action_torchcompile",
        build_td3,
        float_obs(HALF_CHEETAH_OBS),
        lambda out: {"action": out},
        scale_weights,
        None,
        "the action (exploration noise 0)",
        "td3_continuous_action_cpu",
    ),
    "dqn": PolicySpec(
        "dqn",
        "dqn_torchcompile",
        build_dqn,
        float_obs(CARTPOLE_OBS),
        lambda out: {"action": out},
        negate_output_layer,
        1,
        "the greedy action (epsilon 0)",
        "dqn_cpu",
    ),
}
