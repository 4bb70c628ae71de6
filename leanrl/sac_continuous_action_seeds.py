"""Soft Actor-Critic: sac_continuous_action_cpu.py as `--num-seeds N` runs in one vmapped program.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1812.05905. Hyperparameters, env and budget as in the CPU script, per
member.

    python leanrl/sac_continuous_action_seeds.py  # 8 members (seeds 1..8), compiled
    python leanrl/sac_continuous_action_seeds.py --num-seeds 3 --env-id Pendulum-v1 \
        --total-timesteps 10000
    python leanrl/sac_continuous_action_seeds.py --compile --cudagraphs  # on CUDA
    python leanrl/sac_continuous_action_seeds.py --env-id Pendulum-v1 --total-timesteps 10000 \
        --num-seeds 2 --q-lr 3e-4 1e-3 --autotune True False  # a sweep: 4 settings x 2 seeds

Member k is the CPU script with `--seed seed + k * num_envs`: the same initial weights and env
seeds, its own targets, alpha, Adam state, replay buffer and random draws. A flag that takes several
values (`--gamma`, `--tau`, `--policy-lr`, `--q-lr`, `--alpha`, `--autotune`) makes a sweep: each
setting of their grid is trained by `--num-seeds` members, with the same seeds, and the run ends
with a table of the settings, best first (docs/usage.md, "Sweeps"). `make_learner` writes one
member's functions as the CPU script does, then one block vmaps them over a leading seeds axis of
the stacked parameters (`diff` the two files). Each step is one call for all members: one vector env
of N x `--num-envs` envs (member k's the k-th slice), one buffer write and sample, the policy and
each update vmapped. A member whose loss or weights turn non-finite is left out, and the others go
on. The SUMMARY, model files and `--resume`, per member: docs/usage.md, "The seeds scripts".
"""

import math
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
    buffer_size: int = 1_000_000
    """the replay memory buffer size of each member, in transitions"""
    gamma: tuple[float, ...] = (0.99,)
    """the discount factor gamma"""
    tau: tuple[float, ...] = (0.005,)
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_starts: int = 5_000
    """environment steps of random actions before learning starts"""
    policy_lr: tuple[float, ...] = (3e-4,)
    """the learning rate of the policy network optimizer"""
    q_lr: tuple[float, ...] = (1e-3,)
    """the learning rate of the Q network optimizer"""
    policy_frequency: int = 2
    """every `policy_frequency` steps, `policy_frequency` policy updates (delayed, as CleanRL)"""
    target_network_frequency: int = 1
    """the frequency of updates for the target networks, in gradient steps"""
    alpha: tuple[float, ...] = (0.2,)
    """the entropy coefficient without autotune (autotune starts it at 1, as CleanRL)"""
    autotune: tuple[bool, ...] = (True,)
    """automatic tuning of the entropy coefficient (`--no-autotune`: off, as in the single-seed
    scripts; `--autotune True False`: a sweep)"""

    compile: bool = True
    """compile acting and each update as one graph; --no-compile runs the same functions eagerly"""
    cudagraphs: bool = False
    """wrap acting and the updates in CUDA graphs (tensordict's CudaGraphModule); needs a CUDA
    device"""


class SoftQNetwork(nn.Module):
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


LOG_STD_MAX = 2
LOG_STD_MIN = -5


class Actor(nn.Module):
    def __init__(self, n_obs, n_act, action_low, action_high, device=None):
        super().__init__()
        self.fc1 = nn.Linear(n_obs, 256, device=device)
        self.fc2 = nn.Linear(256, 256, device=device)
        self.fc_mean = nn.Linear(256, n_act, device=device)
        self.fc_logstd = nn.Linear(256, n_act, device=device)
        # action rescaling, from tanh's (-1, 1) to the env's bounds
        high = torch.as_tensor(action_high, dtype=torch.float32, device=device)
        low = torch.as_tensor(action_low, dtype=torch.float32, device=device)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs):
        x = F.relu(self.fc1(obs))
        x = F.relu(self.fc2(x))
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        # from SpinUp / Denis Yarats
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        return mean, log_std

    def get_action(self, obs):
        mean, log_std = self(obs)
        return sample_action(mean, log_std, self.action_scale, self.action_bias)


def sample_action(mean, log_std, action_scale, action_bias):
    """A squashed Gaussian action, its log-probability and the squashed mean."""
    std = log_std.exp()
    # the Gaussian written out: torch.distributions.Normal checks its arguments, a host sync
    noise = torch.randn_like(mean)
    x_t = mean + std * noise  # reparameterization trick
    y_t = torch.tanh(x_t)
    action = y_t * action_scale + action_bias
    log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    # enforcing action bounds: the change of variables through tanh and the rescaling
    log_prob -= torch.log(action_scale * (1 - y_t.pow(2)) + 1e-6)
    log_prob = log_prob.sum(-1, keepdim=True)
    mean = torch.tanh(mean) * action_scale + action_bias
    return action, log_prob, mean


class ReplayBuffer:
    """A circular buffer per member, stacked in CPU tensors [num_seeds, buffer_size, ...] written
    through numpy views (cheaper than torch writes), one cursor for all; `sample` draws uniformly,
    each member from its own, to `device`."""

    def __init__(self, num_seeds, buffer_size, n_obs, n_act, device):
        shapes = dict(obs=[n_obs], next_obs=[n_obs], actions=[n_act], rewards=[], terminations=[])
        # the members' buffers end to end, and where each one starts: one index_select per field
        # samples them all
        self.flat = {
            key: torch.zeros(num_seeds * buffer_size, *shape) for key, shape in shapes.items()
        }
        self.starts = torch.arange(num_seeds).unsqueeze(1) * buffer_size
        self.views = {
            key: column.unflatten(0, (num_seeds, -1)).numpy() for key, column in self.flat.items()
        }
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


def make_ensemble_qf(n_obs, n_act):
    """`ensemble_qf(params, obs, actions)`: the Q-values [2, batch, 1] of the networks stacked in
    `params`, by vmap."""
    qnet = SoftQNetwork(n_obs, n_act, device="meta")  # a shell: `params` are swapped in

    def qf(params, obs, actions):
        return functional_call(qnet, params, (obs, actions))

    return torch.vmap(qf, (0, None, None))


def qf_stats(qf_values, qf_losses):
    """CleanRL's critic charts from each Q-network's mean value and loss (the networks on the last
    axis): those, and the mean of the two losses."""
    stats = dict(qf1_values=qf_values[..., 0], qf2_values=qf_values[..., 1])
    stats |= dict(qf1_loss=qf_losses[..., 0], qf2_loss=qf_losses[..., 1])
    return stats | dict(qf_loss=qf_losses.mean(-1))


def make_learner(args, n_obs, n_act, action_low, action_high, seeds, device):
    """SAC's networks, optimizers and update steps for the members `seeds`, stacked on a leading
    seeds axis on `device`: member k starts from the weights sac_continuous_action_cpu.py draws with
    `--seed seeds[k]`."""
    actors, qnets = [], []
    for seed in seeds:
        with torch.random.fork_rng():  # the global generator is left as it was
            torch.manual_seed(seed)
            actor = Actor(n_obs, n_act, action_low, action_high, device=device)
            qf1 = SoftQNetwork(n_obs, n_act, device=device)
            qf2 = SoftQNetwork(n_obs, n_act, device=device)
        actors.append(actor)
        # both networks' parameters, stacked leaf by leaf
        qnets.append(from_modules(qf1, qf2))
    # the members' parameters, stacked: [num_seeds, ...] and [num_seeds, 2, ...]
    actor_params = {name: p.detach() for name, p in stack_module_state(actors)[0].items()}
    qnet_params = torch.stack(qnets).detach()
    qnet_target = qnet_params.data.clone()
    ensemble_qf = make_ensemble_qf(n_obs, n_act)
    q_params = dict(qnet_params.flatten_keys(".").items())
    q_target = dict(qnet_target.flatten_keys(".").items())
    # each member's hyperparameters, [num_members] (a sweep's settings, each `--num-seeds` times)
    hp = member_values(args, len(seeds), device)
    q_optimizer = Adam(q_params, hp["q_lr"])
    actor_optimizer = Adam(actor_params, hp["policy_lr"])

    # automatic entropy tuning starts at alpha = 1
    target_entropy = -float(n_act)
    log_alpha = torch.where(hp["autotune"], 0.0, hp["alpha"].log())
    alpha = log_alpha.exp()  # updated in place
    alpha_params = {"log_alpha": log_alpha}
    alpha_optimizer = Adam(alpha_params, hp["q_lr"])

    # `actor`, the last member's, is a shell: its buffers (the action bounds) serve every member
    def get_action(actor_params, obs):  # the actor as a function of its parameters
        mean, log_std = functional_call(actor, actor_params, (obs,))
        return sample_action(mean, log_std, actor.action_scale, actor.action_bias)

    # the gradients, functions of all they read (the seeds script vmaps them)
    def critic_grads(q_params, actor_params, q_target, alpha, data, gamma):
        with torch.no_grad():
            next_actions, next_log_pi, _ = get_action(actor_params, data["next_obs"])
            qf_next_target = ensemble_qf(q_target, data["next_obs"], next_actions)
            min_qf_next_target = qf_next_target.min(0).values - alpha * next_log_pi
            not_done = 1 - data["terminations"]
            next_q_value = data["rewards"] + not_done * gamma * min_qf_next_target.view(-1)

        def qf_loss_fn(q_params):
            qf_a_values = ensemble_qf(q_params, data["obs"], data["actions"]).view(2, -1)
            # each network's mean squared error, and their sum, as in the eager twin
            qf_losses = (qf_a_values - next_q_value).pow(2).mean(1)
            return qf_losses.sum(), (qf_a_values.mean(1), qf_losses)

        return grad_and_value(qf_loss_fn, has_aux=True)(q_params)

    def actor_grads(actor_params, q_params, alpha, data):
        def actor_loss_fn(actor_params):
            pi, log_pi, _ = get_action(actor_params, data["obs"])
            min_qf_pi = ensemble_qf(q_params, data["obs"], pi).min(0).values
            return ((alpha * log_pi) - min_qf_pi).mean()

        return grad_and_value(actor_loss_fn)(actor_params)

    def alpha_grads(alpha_params, actor_params, data):
        with torch.no_grad():
            _, log_pi, _ = get_action(actor_params, data["obs"])

        def alpha_loss_fn(alpha_params):
            return (-alpha_params["log_alpha"].exp() * (log_pi + target_entropy)).mean()

        return grad_and_value(alpha_loss_fn)(alpha_params)

    # ---- N seeds: the member functions above, vmapped over the leading seeds axis ----
    # Each name below now stands for its member function lifted over the members, each member
    # drawing its own noise. Adam's step is elementwise: on the stacks, each member's own step.
    critic_grads = vmap(critic_grads, randomness="different")
    actor_grads = vmap(actor_grads, randomness="different")
    alpha_grads = vmap(alpha_grads, randomness="different")

    def policy(obs):  # every member's envs at once: [num_seeds, num_envs, n_obs]
        return vmap(get_action, randomness="different")(actor_params, obs)

    # ---- end of the N seeds block ----

    def update_critic(data):
        critic = critic_grads(q_params, actor_params, q_target, alpha, data, hp["gamma"])
        grads, (_, (qf_values, qf_losses)) = critic
        q_optimizer.step(grads)
        return qf_stats(qf_values, qf_losses)

    def update_actor(data):
        grads, actor_loss = actor_grads(actor_params, q_params, alpha, data)
        actor_optimizer.step(grads)
        alpha_loss = torch.zeros_like(alpha)
        if any(setting.autotune for setting in settings(args)):
            grads, alpha_loss = alpha_grads(alpha_params, actor_params, data)
            # a member with a fixed alpha: no gradient, so Adam's step leaves its log alpha
            grads = {"log_alpha": grads["log_alpha"] * hp["autotune"]}
            alpha_loss = alpha_loss * hp["autotune"]
            alpha_optimizer.step(grads)
            alpha.copy_(log_alpha.exp())
        return actor_loss, alpha_loss

    def update_targets():
        # target + tau * (params - target), i.e. tau * params + (1 - tau) * target, on all leaves
        for name, target in q_target.items():
            target.lerp_(q_params[name], member_view(hp["tau"], target))

    return SimpleNamespace(
        policy=policy,
        actor=actor,
        actor_params=actor_params,
        qnet_params=qnet_params,
        qnet_target=qnet_target,
        q_optimizer=q_optimizer,
        actor_optimizer=actor_optimizer,
        alpha_optimizer=alpha_optimizer,
        log_alpha=log_alpha,
        alpha=alpha,
        hp=hp,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
    )


def main(args):
    for setting in settings(args):  # each point of a sweep, as a single run's flags
        check_args(setting)
    run = SeedsRun(args, "sac_continuous_action_seeds")  # seeds.py: folder, seeds, sweep, ...
    members = len(run.seeds)  # settings x seeds
    # one env first: its spaces and sizes, before N members' envs
    probe = make_envs(args.env_id, 1, args.seed)
    n_obs = int(np.prod(probe.single_observation_space.shape))
    space = probe.single_action_space
    if not isinstance(space, gym.spaces.Box) or not space.is_bounded():
        fail(f"--env-id {args.env_id!r} has a {space} action space; SAC needs a bounded Box")
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

    def evaluate_actor(member, episodes, videos):  # the member's mean action, squashed
        member_actor = Actor(n_obs, n_act, space.low, space.high, device=device)
        member_actor.load_state_dict(models[member])
        seed = run.seeds[member]
        eval_envs = make_envs(args.env_id, 1, seed, videos, episodes)
        return evaluate(
            lambda obs: member_actor.get_action(obs)[2], eval_envs, episodes, seed, device
        )

    if args.eval_model:  # the saved actor as every member
        envs.close()
        models = [run.saved_model] * members
        return run.finish(device, models, evaluate_actor)
    if args.compile:
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
            qnet_params=learner.qnet_params,
            qnet_target=learner.qnet_target,
            q_optimizer=learner.q_optimizer,
            actor_optimizer=learner.actor_optimizer,
            alpha_optimizer=learner.alpha_optimizer,
            log_alpha=learner.log_alpha,
            alpha=learner.alpha,
            hp=learner.hp,
        )
        return dict(learner=state, rb=rb, envs=(envs, obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    learning_starts = args.learning_starts // args.num_envs  # in vector steps
    # logged before the first delayed policy update
    actor_loss = alpha_loss = torch.zeros((), device=device)
    for iteration in run.progress(range(start, args.total_timesteps // args.num_envs)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here, after compiling and warm-up

        # act
        if iteration < learning_starts:
            actions = envs.action_space.sample()
        else:
            member_obs = per_member(torch.as_tensor(obs, dtype=torch.float), members)
            actions = flat(learner.policy(member_obs.to(device))[0].cpu().numpy())

        # step the envs
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        run.log_episodes(global_step, finished_member_episodes(infos, members))

        # store: a truncated episode bootstraps from its true last observation
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions, rewards=rewards)
        rb.add(transition | dict(terminations=terminations))
        obs = next_obs

        # update
        if iteration >= learning_starts:
            data = rb.sample(args.batch_size)
            critic_stats = learner.update_critic(data)
            if iteration % args.policy_frequency == 0:  # delayed, as in TD3
                for _ in range(args.policy_frequency):  # on the critic's batch, as in CleanRL
                    actor_loss, alpha_loss = learner.update_actor(data)
            if iteration % args.target_network_frequency == 0:
                learner.update_targets()

            # log
            if iteration % 100 == 0:
                losses = critic_stats | dict(actor_loss=actor_loss, alpha_loss=alpha_loss)
                run.log_progress(global_step, losses | dict(alpha=learner.alpha))

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
    for flag in ("num_seeds", *sizes, "target_network_frequency", "policy_lr", "q_lr"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.learning_starts < 0 or not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail("--learning-starts must be >= 0, --tau in (0, 1] and --gamma in [0, 1]")
    if not args.autotune and args.alpha <= 0:
        fail(f"--alpha must be positive, got {args.alpha}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args, args=sweep_argv(Args)))
