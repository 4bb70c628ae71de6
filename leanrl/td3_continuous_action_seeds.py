"""Twin Delayed DDPG (TD3): td3_continuous_action_cpu.py as `--num-seeds N` runs in one vmapped
program.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1802.09477. Hyperparameters, env and budget as in the CPU script, per
member.

    python leanrl/td3_continuous_action_seeds.py  # 8 members (seeds 1..8), compiled
    python leanrl/td3_continuous_action_seeds.py --num-seeds 3 --env-id Pendulum-v1 \
        --total-timesteps 10000 --learning-starts 1000
    python leanrl/td3_continuous_action_seeds.py --compile --cudagraphs  # on CUDA
    python leanrl/td3_continuous_action_seeds.py --env-id Pendulum-v1 --total-timesteps 10000 \
        --learning-starts 1000 --num-seeds 2 --learning-rate 3e-4 1e-3  # a sweep: 2 x 2 seeds

Member k is the CPU script with `--seed seed + k * num_envs`: the same initial weights and env
seeds, its own target networks, Adam state, replay buffer and random draws (exploration and target
policy noise). A flag that takes several values (`--learning-rate`, `--gamma`, `--tau`,
`--policy-noise`, `--exploration-noise`, `--noise-clip`) makes a sweep: each setting of their grid
is trained by `--num-seeds` members, with the same seeds, and the run ends with a table of the
settings, best first (docs/usage.md, "Sweeps"). `make_learner` writes one member's functions as the
CPU script does, then one block vmaps them over a leading seeds axis of the stacked parameters
(`diff` the two files). Each step is one call for all members: one vector env of N x `--num-envs`
envs (member k's the k-th slice), one buffer write and sample, the policy and each update vmapped. A
member whose loss or weights turn non-finite is left out, and the others go on. The SUMMARY, model
files and `--resume`, per member: docs/usage.md, "The seeds scripts".
"""

from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from flags import CudaFlags, fail
from optimizers import Adam
from seeds import (
    SeedsRun,
    check_memory,
    finished_member_episodes,
    flat,
    member_values,
    member_view,
    per_member,
    settings,
    sweep_argv,
)
from tensordict import from_modules
from tensordict.nn import CudaGraphModule
from threads import ThreadFlags
from torch.func import functional_call, grad_and_value, stack_module_state, vmap
from vector_envs import evaluate, make_envs, true_next_obs


@dataclass
class Args(CudaFlags, ThreadFlags):
    num_seeds: int = 8
    """the number of independent runs (members) trained together; in a sweep, of each setting"""
    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """environment steps of each member"""
    num_envs: int = 1
    """the number of parallel environments of each member"""
    learning_rate: tuple[float, ...] = (3e-4,)
    """the learning rate of both optimizers"""
    buffer_size: int = 1_000_000
    """the replay memory buffer size of each member, in transitions"""
    gamma: tuple[float, ...] = (0.99,)
    """the discount factor gamma"""
    tau: tuple[float, ...] = (0.005,)
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    policy_noise: tuple[float, ...] = (0.2,)
    """the std of the target policy's smoothing noise, in half action ranges"""
    exploration_noise: tuple[float, ...] = (0.1,)
    """the std of the acting policy's noise, in half action ranges"""
    learning_starts: int = 25_000
    """environment steps of random actions before learning starts"""
    policy_frequency: int = 2
    """one actor step and one target update every this many critic steps"""
    noise_clip: tuple[float, ...] = (0.5,)
    """the target policy's noise is clipped to [-noise_clip, noise_clip]"""

    compile: bool = True
    """compile acting and each update as one graph; --no-compile runs the same functions eagerly"""
    cudagraphs: bool = False
    """wrap acting and the updates in CUDA graphs (tensordict's CudaGraphModule); needs a CUDA
    device"""


class QNetwork(nn.Module):
    def __init__(self, n_obs, n_act, device=None):
        super().__init__()
        self.fc1 = nn.Linear(n_obs + n_act, 256, device=device)
        self.fc2 = nn.Linear(256, 256, device=device)
        self.fc3 = nn.Linear(256, 1, device=device)

    def forward(self, obs, actions):
        x = torch.cat([obs, actions], -1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Actor(nn.Module):
    def __init__(self, n_obs, n_act, action_low, action_high, device=None):
        super().__init__()
        self.fc1 = nn.Linear(n_obs, 256, device=device)
        self.fc2 = nn.Linear(256, 256, device=device)
        self.fc_mu = nn.Linear(256, n_act, device=device)
        # action rescaling, from tanh's (-1, 1) to the env's bounds
        high = torch.as_tensor(action_high, dtype=torch.float32, device=device)
        low = torch.as_tensor(action_low, dtype=torch.float32, device=device)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs):
        x = F.relu(self.fc1(obs))
        x = F.relu(self.fc2(x))
        return torch.tanh(self.fc_mu(x)) * self.action_scale + self.action_bias

    def clip(self, actions):  # to the env's bounds, [bias - scale, bias + scale]
        return actions.clamp(
            self.action_bias - self.action_scale, self.action_bias + self.action_scale
        )


class ReplayBuffer:
    """A circular buffer per member, stacked in CPU tensors [num_seeds, buffer_size, ...] written
    through numpy views (cheaper than torch writes), one cursor for all; `sample` draws uniformly,
    each member from its own, to `device`."""

    def __init__(self, num_seeds, buffer_size, n_obs, n_act, device):
        shapes = dict(obs=[n_obs], next_obs=[n_obs], actions=[n_act], rewards=[], terminations=[])
        # the members' buffers end to end, and where each one starts: one index_select per field
        # samples them all
        self.flat = {k: torch.zeros(num_seeds * buffer_size, *s) for k, s in shapes.items()}
        self.starts = torch.arange(num_seeds).unsqueeze(1) * buffer_size
        self.views = {k: v.unflatten(0, (num_seeds, -1)).numpy() for k, v in self.flat.items()}
        self.buffer_size, self.cursor, self.size, self.device = buffer_size, 0, 0, device

    def add(self, transition):
        """Write one vector step's transitions: the env's arrays and the actions, member k's envs
        the k-th slice."""
        n = len(transition["obs"]) // len(self.starts)
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        for key, view in self.views.items():
            view[:, idx] = per_member(transition[key], len(view))
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):  # [num_seeds, batch_size, ...]
        idx = torch.randint(0, self.size, (len(self.starts), batch_size)) + self.starts
        batch = {key: value.index_select(0, idx.flatten()) for key, value in self.flat.items()}
        return {key: value.unflatten(0, idx.shape).to(self.device) for key, value in batch.items()}

    def state_dict(self):  # each member's filled part (copies: a view saves all), for checkpoints
        storage = {k: torch.from_numpy(v[:, : self.size].copy()) for k, v in self.views.items()}
        return dict(storage=storage, cursor=self.cursor, size=self.size)

    def load_state_dict(self, state):
        self.cursor, self.size = state["cursor"], state["size"]
        for key, value in state["storage"].items():
            self.views[key][:, : self.size] = value.numpy()


def qf_stats(qf_values, qf_losses):
    """CleanRL's critic charts from each Q-network's mean value and loss (the networks on the last
    axis): those, and the mean of the two losses."""
    stats = dict(qf1_values=qf_values[..., 0], qf2_values=qf_values[..., 1])
    stats |= dict(qf1_loss=qf_losses[..., 0], qf2_loss=qf_losses[..., 1])
    return stats | dict(qf_loss=qf_losses.mean(-1))


def make_learner(args, n_obs, n_act, action_low, action_high, seeds, device):
    """TD3's networks, optimizers and steps for the members `seeds`, stacked on a leading seeds axis
    on `device`, by name: member k starts from the weights td3_continuous_action_cpu.py draws with
    `--seed seeds[k]`."""
    actors, actor_targets, qnets = [], [], []
    for seed in seeds:
        with torch.random.fork_rng():  # the global generator is left as it was
            torch.manual_seed(seed)
            actor = Actor(n_obs, n_act, action_low, action_high, device=device)
            actor_target = Actor(n_obs, n_act, action_low, action_high, device=device)
            actor_target.load_state_dict(actor.state_dict())
            qf1 = QNetwork(n_obs, n_act, device=device)
            qf2 = QNetwork(n_obs, n_act, device=device)
        actors.append(actor)
        actor_targets.append(actor_target)
        # both Q-networks' parameters stacked in one TensorDict
        qnets.append(from_modules(qf1, qf2))
    # `actor`, the last member's, is a shell: its buffers (the action bounds) serve every member
    # the members' parameters, stacked: [num_seeds, ...] and [num_seeds, 2, ...]
    qnet_params = torch.stack(qnets).detach()
    qnet_target = qnet_params.data.clone()
    # Adam steps the stacks in place: the policy and the updates see each step
    q_params = dict(qnet_params.flatten_keys(".").items())
    # each member's hyperparameters, [num_members] (a sweep's settings, each `--num-seeds` times)
    hp = member_values(args, len(seeds), device)
    q_optimizer = Adam(q_params, hp["learning_rate"])
    actor_params = {name: p.detach() for name, p in stack_module_state(actors)[0].items()}
    actor_optimizer = Adam(actor_params, hp["learning_rate"])
    q_target = dict(qnet_target.flatten_keys(".").items())
    actor_target_params = stack_module_state(actor_targets)[0]
    actor_target_params = {name: p.detach() for name, p in actor_target_params.items()}
    # a weightless shell called on the parameters it is given, and vmapped over the stack
    qnet = QNetwork(n_obs, n_act, device="meta")

    def qf(params, obs, actions):
        return functional_call(qnet, params, (obs, actions))

    ensemble_qf = torch.vmap(qf, (0, None, None))

    # the gradients, functions of all they read (the seeds script vmaps them)
    def critic_grads(q_params, actor_target_params, q_target, data, hp):
        with torch.no_grad():
            # target policy smoothing: clipped noise on the target action, in half action ranges
            noise = torch.randn_like(data["actions"]) * hp["policy_noise"]
            noise = noise.clamp(-hp["noise_clip"], hp["noise_clip"])
            next_actions = functional_call(actor, actor_target_params, (data["next_obs"],))
            next_actions = actor.clip(next_actions + noise * actor.action_scale)
            qf_next_target = ensemble_qf(q_target, data["next_obs"], next_actions)
            min_qf_next_target = qf_next_target.min(0).values
            not_done = 1 - data["terminations"]
            next_q_value = data["rewards"] + not_done * hp["gamma"] * min_qf_next_target.view(-1)

        def qf_loss_fn(q_params):
            qf_a_values = ensemble_qf(q_params, data["obs"], data["actions"]).view(2, -1)
            # qf1's and qf2's mean squared errors, and their sum
            qf_losses = (qf_a_values - next_q_value).pow(2).mean(1)
            return qf_losses.sum(), (qf_a_values.mean(1), qf_losses)

        return grad_and_value(qf_loss_fn, has_aux=True)(q_params)

    def actor_grads(actor_params, q_params, obs):
        def actor_loss_fn(actor_params):
            # the actor climbs the first Q-network only
            qf1_params = {name: p[0] for name, p in q_params.items()}
            return -qf(qf1_params, obs, functional_call(actor, actor_params, (obs,))).mean()

        return grad_and_value(actor_loss_fn)(actor_params)

    # ---- N seeds: the member functions above, vmapped over the leading seeds axis ----
    # Each name below now stands for its member function lifted over the members, each member
    # drawing its own noise. Adam's step is elementwise: on the stacks, each member's own step.
    critic_grads = vmap(critic_grads, randomness="different")
    actor_grads = vmap(actor_grads)

    def get_action(actor_params, obs, noise_std):  # one member's action plus noise, clipped
        actions = functional_call(actor, actor_params, (obs,))
        actions = actions + torch.randn_like(actions) * actor.action_scale * noise_std
        return actor.clip(actions)

    def policy(obs):  # every member's envs at once: [num_seeds, num_envs, n_obs]
        noise_std = hp["exploration_noise"]
        return vmap(get_action, randomness="different")(actor_params, obs, noise_std)

    # ---- end of the N seeds block ----

    def update_critic(data):
        grads, (_, (qf_values, qf_losses)) = critic_grads(
            q_params, actor_target_params, q_target, data, hp
        )
        q_optimizer.step(grads)
        return qf_stats(qf_values, qf_losses)

    def update_actor(data):
        grads, actor_loss = actor_grads(actor_params, q_params, data["obs"])
        actor_optimizer.step(grads)
        return actor_loss

    def update_targets():
        # soft update, in place: target + tau * (params - target), each member its own tau
        for targets, params in ((actor_target_params, actor_params), (q_target, q_params)):
            for name, target in targets.items():
                target.lerp_(params[name], member_view(hp["tau"], target))

    return SimpleNamespace(
        policy=policy,
        actor=actor,
        actor_params=actor_params,
        actor_target_params=actor_target_params,
        qnet_params=qnet_params,
        qnet_target=qnet_target,
        q_optimizer=q_optimizer,
        actor_optimizer=actor_optimizer,
        hp=hp,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
    )


def main(args):
    for setting in settings(args):  # each point of a sweep, as a single run's flags
        check_args(setting)
    run = SeedsRun(args, "td3_continuous_action_seeds")  # seeds.py: folder, seeds, sweep, ...
    members = len(run.seeds)  # settings x seeds
    # one env first: its spaces and sizes, before N members' envs
    probe = make_envs(args.env_id, 1, args.seed)
    n_obs = int(np.prod(probe.single_observation_space.shape))
    space = probe.single_action_space
    if not isinstance(space, gym.spaces.Box) or not space.is_bounded():
        fail(f"--env-id {args.env_id!r} has a {space} action space; TD3 needs a bounded Box")
    n_act = int(np.prod(space.shape))
    probe.close()
    # float32 columns
    check_memory(members, args.buffer_size * (2 * n_obs + n_act + 2) * 4, "replay buffers")
    videos = None if args.eval_model else run.videos
    # member k's envs are the k-th slice
    envs = make_envs(args.env_id, args.num_envs * members, args.seed, videos)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    learner = make_learner(args, n_obs, n_act, space.low, space.high, run.seeds, device)
    actor = learner.actor

    def evaluate_actor(member, episodes, videos):  # the member's action, no noise
        member_actor = Actor(n_obs, n_act, space.low, space.high, device=device)
        member_actor.load_state_dict(models[member])
        eval_envs = make_envs(args.env_id, 1, run.seeds[member], videos, episodes)
        return evaluate(member_actor, eval_envs, episodes, run.seeds[member], device)

    if args.eval_model:  # the saved actor as every member
        envs.close()
        models = [run.saved_model] * members
        return run.finish(device, models, evaluate_actor)

    if args.compile:  # acting, and each update as one graph, forward pass to Adam step
        learner.policy = torch.compile(learner.policy, fullgraph=True)
        learner.update_critic = torch.compile(learner.update_critic, fullgraph=True)
        learner.update_actor = torch.compile(learner.update_actor, fullgraph=True)
    if args.cudagraphs:
        # the first calls run as they are (compiled: one call more), the next records, later replay
        warmup = 3 if args.compile else 2
        learner.policy = CudaGraphModule(learner.policy, warmup=warmup)
        learner.update_critic = CudaGraphModule(learner.update_critic, warmup=warmup)
        learner.update_actor = CudaGraphModule(learner.update_actor, warmup=warmup)

    rb = ReplayBuffer(members, args.buffer_size, n_obs, n_act, device)
    # member k's env i seeded as the CPU script's with `--seed seeds[k]`: seeds[k] + i
    obs, _ = envs.reset(seed=run.env_seeds)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(
            actor=learner.actor,
            actor_params=learner.actor_params,
            actor_target_params=learner.actor_target_params,
            qnet_params=learner.qnet_params,
            qnet_target=learner.qnet_target,
            q_optimizer=learner.q_optimizer,
            actor_optimizer=learner.actor_optimizer,
            hp=learner.hp,
        )
        return dict(learner=state, rb=rb, envs=(envs, obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    learning_starts = args.learning_starts // args.num_envs
    actor_loss = torch.zeros((), device=device)
    for iteration in run.progress(range(start, args.total_timesteps // args.num_envs)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here, after compile and warm-up

        # act
        if iteration < learning_starts:
            actions = envs.action_space.sample()
        else:
            member_obs = per_member(torch.as_tensor(obs, dtype=torch.float), members)
            actions = flat(learner.policy(member_obs.to(device)).cpu().numpy())

        # step the envs
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        run.log_episodes(global_step, finished_member_episodes(infos, members))

        # store: a truncated episode bootstraps from its true last observation
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions, rewards=rewards)
        rb.add(transition | dict(terminations=terminations))
        obs = next_obs

        # update: the actor and the targets are delayed, and use the critic's batch
        if iteration >= learning_starts:
            data = rb.sample(args.batch_size)
            critic_stats = learner.update_critic(data)
            if iteration % args.policy_frequency == 0:
                actor_loss = learner.update_actor(data)
                learner.update_targets()

            # log
            if iteration % 100 == 0:
                run.log_progress(global_step, critic_stats | dict(actor_loss=actor_loss))

        # the env steps so far; a checkpoint when due, on a signal, at the end
        run.checkpoint(iteration, training_state, global_step + args.num_envs)
        if run.stopped:  # a first Ctrl-C or SIGTERM, or no member left
            break

    # each member's actor as a single-seed actor's state dict (copies: a view would save the whole
    # stack)
    buffers = dict(actor.named_buffers())
    models = [
        {name: p[k].clone() for name, p in learner.actor_params.items()} | buffers
        for k in range(members)
    ]
    envs.close()
    run.finish(device, models, evaluate_actor)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    sizes = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency")
    for flag in ("num_seeds", *sizes, "learning_rate"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    for flag in ("learning_starts", "policy_noise", "exploration_noise", "noise_clip"):
        if getattr(args, flag) < 0:
            fail(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail(f"--tau must be in (0, 1] and --gamma in [0, 1]; got {args.tau} and {args.gamma}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args, args=sweep_argv(Args)))
