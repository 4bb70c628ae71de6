"""Twin Delayed DDPG (TD3) for continuous actions, optimized: the twin of
td3_continuous_action.py.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1802.09477. Hyperparameters are CleanRL's. The default env is
LeanRL's benchmark env, HalfCheetah-v4 (CleanRL's TD3 defaults to Hopper-v4).

    # fastest on a CUDA GPU
    python leanrl/td3_continuous_action_torchcompile.py --compile --cudagraphs
    python leanrl/td3_continuous_action_torchcompile.py --env-id Pendulum-v1 \
        --total-timesteps 10000 --learning-starts 1000  # learns

The eager twin's algorithm, defaults and loop, with its data flow rewritten for speed: a
TensorDict replay buffer on the device, the twin critics as one vmapped ensemble, `lerp_` target
updates and a fused Adam. `--compile` wraps acting and both updates in `torch.compile`,
`--cudagraphs` in tensordict's `CudaGraphModule`. On a CPU, td3_continuous_action_cpu.py is
faster. With `--tensor-envs` the envs are tensors on the device, and one function acts, steps them
and stores the step in the buffer, whose cursor is a tensor there: compiled whole and recorded as
one CUDA graph. `--num-envs 1024 --num-updates 2 --batch-size 32768`: docs/tensor-envs.md.
"""

from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from flags import CudaFlags, TensorEnvFlags, fail
from runs import Run
from tensordict import TensorDict, from_module, from_modules
from tensordict.nn import CudaGraphModule
from vector_envs import EpisodeLog, evaluate, finished_episodes, make_envs, true_next_obs


@dataclass
class Args(TensorEnvFlags, CudaFlags):
    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total environment steps of the experiment"""
    num_envs: int = 1
    """the number of parallel environments"""
    learning_rate: float = 3e-4
    """the learning rate of both optimizers"""
    buffer_size: int = 1_000_000
    """the replay memory buffer size, in transitions"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    num_updates: int = 1
    """gradient steps (critic updates) per vector step, as FastTD3's `num_updates`"""
    policy_noise: float = 0.2
    """the std of the target policy's smoothing noise, in half action ranges"""
    exploration_noise: float = 0.1
    """the std of the acting policy's noise, in half action ranges"""
    learning_starts: int = 25_000
    """environment steps of random actions before learning starts"""
    policy_frequency: int = 2
    """one actor step and one target update every this many critic steps"""
    noise_clip: float = 0.5
    """the target policy's noise is clipped to [-noise_clip, noise_clip]"""

    compile: bool = False
    """compile the policy and the updates (on a CPU, td3_continuous_action_cpu.py is faster)"""
    cudagraphs: bool = False
    """record the policy and the updates as CUDA graphs (needs a CUDA device)"""


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
    """A circular buffer of transitions in one TensorDict on `device`, sampled uniformly. Its
    cursor and size are tensors there: a write or a sample makes no host sync, and a graph can
    hold it."""

    def __init__(self, buffer_size, n_obs, n_act, device):
        shapes = dict(obs=[n_obs], next_obs=[n_obs], actions=[n_act], rewards=[], terminations=[])
        self.columns = {k: torch.zeros(buffer_size, *s, device=device) for k, s in shapes.items()}
        self.storage = TensorDict(self.columns, batch_size=[buffer_size], device=device)
        self.buffer_size, self.device = buffer_size, device
        self.cursor, self.size = torch.zeros(2, dtype=torch.long, device=device).unbind()

    def add(self, transition):
        """Write one vector step's transitions, a dict of arrays or tensors."""
        n = len(transition["obs"])
        idx = (self.cursor + torch.arange(n, device=self.device)) % self.buffer_size
        for key, value in transition.items():
            value = torch.as_tensor(value, device=self.device, dtype=torch.float)
            self.columns[key].index_copy_(0, idx, value)
        self.cursor.copy_((self.cursor + n) % self.buffer_size)
        self.size.copy_((self.size + n).clamp(max=self.buffer_size))

    def sample(self, batch_size):
        # uniform in [0, size) without reading the size on the host
        idx = torch.randint(0, 2**62, (batch_size,), device=self.device) % self.size
        return self.storage[idx]

    def state_dict(self):  # the filled part (a copy: torch.save writes a view's whole storage)
        storage = {key: value[: self.size].clone() for key, value in self.columns.items()}
        return dict(storage=storage, cursor=self.cursor.clone(), size=self.size.clone())

    def load_state_dict(self, state):
        self.cursor.copy_(state["cursor"])
        self.size.copy_(state["size"])
        for key, value in state["storage"].items():
            self.columns[key][: self.size] = value


def make_rollout_step(envs, act, rb, episode_log):
    """With the tensor envs, one vector step on the device as one function: act (`act(obs)`: the
    actions), step every env, store the transitions in `rb` and the episodes that ended at row
    `row` (a tensor) of `episode_log`. It compiles whole, and a CUDA graph records it."""

    def rollout_step(obs, row):
        actions = act(obs)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        # a truncated episode bootstraps from its true last observation
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions, rewards=rewards)
        rb.add(transition | dict(terminations=terminations))
        episode_log.record(row, infos)
        return next_obs

    return rollout_step


def make_ensemble_qf(n_obs, n_act):
    """The Q-values [k, batch, 1] of k stacked Q-networks' `params`: one matmul per layer."""
    # a weightless shell: the parameters are swapped in at each call
    qnet = QNetwork(n_obs, n_act, device="meta")

    def qf(params, obs, actions):
        with params.to_module(qnet):
            return qnet(obs, actions)

    return torch.vmap(qf, (0, None, None))


def qf_stats(qf_values, qf_losses):
    """CleanRL's critic charts from each Q-network's mean value and loss (the networks on the last
    axis): those, and the mean of the two losses."""
    stats = dict(qf1_values=qf_values[..., 0], qf2_values=qf_values[..., 1])
    stats |= dict(qf1_loss=qf_losses[..., 0], qf2_loss=qf_losses[..., 1])
    return stats | dict(qf_loss=qf_losses.mean(-1))


def make_learner(args, n_obs, n_act, action_low, action_high, device):
    """TD3's networks, optimizers and steps, by name."""
    actor = Actor(n_obs, n_act, action_low, action_high, device=device)
    actor_target = Actor(n_obs, n_act, action_low, action_high, device=device)
    actor_target.load_state_dict(actor.state_dict())
    qf1 = QNetwork(n_obs, n_act, device=device)
    qf2 = QNetwork(n_obs, n_act, device=device)
    # both Q-networks' parameters stacked in one TensorDict, the targets a copy
    qnet_params = from_modules(qf1, qf2, as_module=True)
    qnet_target = qnet_params.data.clone()
    # one shell per parameter set: torch's compiler fails on two swaps into one shell in a graph
    ensemble_qf, ensemble_qf_target = make_ensemble_qf(n_obs, n_act), make_ensemble_qf(n_obs, n_act)
    # fused: one kernel for all parameters; capturable: a CUDA graph can record its step
    adam_options = dict(fused=True, capturable=args.cudagraphs)
    q_params = qnet_params.values(True, True)
    q_optimizer = torch.optim.Adam(q_params, lr=args.learning_rate, **adam_options)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, **adam_options)
    actor_params = from_module(actor).data
    actor_target_params = from_module(actor_target).data
    # acting reads the actor's weights through a copy without autograd state
    actor_detach = Actor(n_obs, n_act, action_low, action_high, device=device)
    actor_params.to_module(actor_detach)

    def policy(obs):
        """The actor's action plus Gaussian noise, clipped to the bounds."""
        actions = actor_detach(obs)
        noise = torch.randn_like(actions) * actor_detach.action_scale * args.exploration_noise
        return actor_detach.clip(actions + noise)

    def random_policy(obs):
        """Actions drawn uniformly within the bounds, on the device: before learning starts."""
        uniform = torch.rand(obs.shape[0], n_act, device=device)
        return actor.action_bias + actor.action_scale * (2 * uniform - 1)

    def update_critic(data):
        with torch.no_grad():
            # target policy smoothing: clipped noise on the target action
            noise = torch.randn_like(data["actions"]) * args.policy_noise
            noise = noise.clamp(-args.noise_clip, args.noise_clip)
            next_actions = actor_target(data["next_obs"])
            next_actions = actor_target.clip(next_actions + noise * actor_target.action_scale)
            qf_next_target = ensemble_qf_target(qnet_target, data["next_obs"], next_actions)
            min_qf_next_target = qf_next_target.min(0).values
            not_done = 1 - data["terminations"]
            next_q_value = data["rewards"] + not_done * args.gamma * min_qf_next_target.view(-1)

        qf_a_values = ensemble_qf(qnet_params, data["obs"], data["actions"]).view(2, -1)
        # qf1's and qf2's mean squared errors, and their sum
        qf_losses = (qf_a_values - next_q_value).pow(2).mean(1)
        qf_loss = qf_losses.sum()

        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        return qf_stats(qf_a_values.detach().mean(1), qf_losses.detach())

    def update_actor(data):
        # the actor climbs the first Q-network only; .data: no Q grads
        actor_loss = -ensemble_qf(qnet_params.data[:1], data["obs"], actor(data["obs"])).mean()

        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        return actor_loss.detach()

    def update_targets():
        # soft update, one in-place lerp per TensorDict: target + tau * (params - target)
        actor_target_params.lerp_(actor_params, args.tau)
        qnet_target.lerp_(qnet_params.data, args.tau)

    return SimpleNamespace(
        policy=policy,
        random_policy=random_policy,
        actor=actor,
        actor_target=actor_target,
        qnet_params=qnet_params,
        qnet_target=qnet_target,
        q_optimizer=q_optimizer,
        actor_optimizer=actor_optimizer,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
    )


# the losses are logged every LOG_EVERY vector steps, with one host sync (with --tensor-envs, the
# episodes too: they wait on the device until then)
LOG_EVERY = 100


def main(args):
    check_args(args)
    run = Run(args, "td3_continuous_action_torchcompile")  # runs.py: folder, seeds, signals, ...
    videos = None if args.eval_model else run.videos
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # the tensor envs on the device: acting, stepping and storing stay there
    envs = make_envs(
        args.env_id, args.num_envs, args.seed, videos, tensor=args.tensor_envs, device=device
    )
    space = envs.single_action_space
    if not isinstance(space, gym.spaces.Box) or not space.is_bounded():
        fail(f"--env-id {args.env_id!r} has a {space} action space; TD3 needs a bounded Box")
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(space.shape))
    learner = make_learner(args, n_obs, n_act, space.low, space.high, device)
    actor = learner.actor

    def evaluate_actor(episodes, videos):  # the actor's action, no noise
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes)
        return evaluate(actor, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        actor.load_state_dict(run.saved_model)
        return run.finish(device, actor.state_dict(), evaluate_actor)

    rb = ReplayBuffer(args.buffer_size, n_obs, n_act, device)
    if args.tensor_envs:
        # a row of episodes a vector step, on the device until the next log
        episode_log = EpisodeLog(LOG_EVERY, args.num_envs, device)
        log_rows = torch.arange(LOG_EVERY, device=device).split(1)  # each row's index, a tensor
        # one function acts, steps the envs and stores; it is compiled whole, so it holds the
        # policy as it is here, before the host loop's is wrapped below
        rollout_step = make_rollout_step(envs, learner.policy, rb, episode_log)
        # the random actions before learning starts run eagerly: at many envs that phase lasts a
        # few vector steps (one compile, not two)
        explore_step = make_rollout_step(envs, learner.random_policy, rb, episode_log)

    if args.compile:
        learner.policy = torch.compile(learner.policy)
        learner.update_critic = torch.compile(learner.update_critic)
        learner.update_actor = torch.compile(learner.update_actor)
        if args.tensor_envs:
            rollout_step = torch.compile(rollout_step, fullgraph=True)
    if args.cudagraphs:
        # calls run as they are until the optimizers have state (and compiled for it), the next
        # records, later ones replay
        warmup = 3 if args.compile else 2
        learner.policy = CudaGraphModule(learner.policy, warmup=warmup)
        learner.update_critic = CudaGraphModule(learner.update_critic, warmup=warmup)
        learner.update_actor = CudaGraphModule(learner.update_actor, warmup=warmup)
        if args.tensor_envs:
            rollout_step = CudaGraphModule(rollout_step, warmup=warmup)

    obs, _ = envs.reset(seed=args.seed)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(
            actor=learner.actor,
            actor_target=learner.actor_target,
            qnet_params=learner.qnet_params,
            qnet_target=learner.qnet_target,
            q_optimizer=learner.q_optimizer,
            actor_optimizer=learner.actor_optimizer,
        )
        logged = dict(episode_log=episode_log) if args.tensor_envs else {}
        return dict(learner=state, rb=rb, envs=(envs, obs)) | logged

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    learning_starts = args.learning_starts // args.num_envs
    num_iterations = args.total_timesteps // args.num_envs
    actor_loss = torch.zeros((), device=device)
    for iteration in run.progress(range(start, num_iterations)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here, after compile and warm-up

        # act, step the envs, store
        if args.tensor_envs:  # on the device, in one call
            vector_step = explore_step if iteration < learning_starts else rollout_step
            row = iteration % LOG_EVERY  # the episode log's row for this vector step
            with torch.no_grad():
                obs = vector_step(obs, log_rows[row])
            if row == LOG_EVERY - 1 or iteration == num_iterations - 1 or run.stopped:
                # the rows since the last log, in one host sync: row 0 at this log's first step
                episode_log.log(run, global_step - row * args.num_envs, args.num_envs, row + 1)
        else:
            if iteration < learning_starts:
                actions = envs.action_space.sample()
            else:
                with torch.no_grad():
                    actions = learner.policy(torch.as_tensor(obs, device=device, dtype=torch.float))
                actions = actions.cpu().numpy()

            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            run.log_episodes(global_step, finished_episodes(infos))

            # a truncated episode bootstraps from its true last observation
            real_next_obs = true_next_obs(next_obs, infos)
            transition = dict(obs=obs, next_obs=real_next_obs, actions=actions, rewards=rewards)
            rb.add(transition | dict(terminations=terminations))
            obs = next_obs

        # update: --num-updates gradient steps a vector step, counted over the run; the actor
        # and the targets are delayed, and use the critic's batch
        if iteration >= learning_starts:
            first = iteration * args.num_updates
            for gradient_step in range(first, first + args.num_updates):
                data = rb.sample(args.batch_size)
                critic_stats = learner.update_critic(data)
                if gradient_step % args.policy_frequency == 0:
                    actor_loss = learner.update_actor(data)
                    learner.update_targets()

            # log
            if iteration % LOG_EVERY == 0:
                run.log_progress(global_step, critic_stats | dict(actor_loss=actor_loss))

        # the env steps so far; a checkpoint when due, on a signal, at the end
        run.checkpoint(iteration, training_state, global_step + args.num_envs)
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, actor.state_dict(), evaluate_actor)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    sizes = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency")
    for flag in (*sizes, "num_updates", "learning_rate"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    for flag in ("batch_size", "num_envs"):  # a vector step's rows must not overwrite each other
        if getattr(args, flag) > args.buffer_size:
            fail(f"--{flag.replace('_', '-')} is larger than --buffer-size {args.buffer_size}")
    for flag in ("learning_starts", "policy_noise", "exploration_noise", "noise_clip"):
        if getattr(args, flag) < 0:
            fail(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail(f"--tau must be in (0, 1] and --gamma in [0, 1]; got {args.tau} and {args.gamma}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device, and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args))
