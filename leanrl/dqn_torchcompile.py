"""Deep Q-Network for discrete actions, optimized for a GPU: the twin of dqn.py.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://www.nature.com/articles/nature14236

    python leanrl/dqn_torchcompile.py --compile  # acting and the update compiled
    python leanrl/dqn_torchcompile.py --compile --cudagraphs  # and replayed as CUDA graphs

What changes from dqn.py: acting runs on the device without a host sync, transitions go to a
TensorDict buffer every `train_frequency` iterations, Adam is fused and the target moves by one
`lerp_`. On a CPU, dqn_cpu.py is faster.
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
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from vector_envs import evaluate, finished_episodes, make_envs, true_next_obs


@dataclass
class Args(TensorEnvFlags, CudaFlags):
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500_000
    """total environment steps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments"""
    buffer_size: int = 10_000
    """the replay memory buffer size, in transitions"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: a hard copy)"""
    target_network_frequency: int = 500
    """the frequency of updates for the target network, in iterations (vector steps)"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` over which epsilon falls from `start_e` to `end_e`"""
    learning_starts: int = 10_000
    """environment steps before learning starts"""
    train_frequency: int = 10
    """one gradient step every `train_frequency` iterations"""

    compile: bool = False
    """compile acting and the update with torch.compile"""
    cudagraphs: bool = False
    """acting and the update as CUDA graphs (tensordict's CudaGraphModule); needs CUDA"""


class QNetwork(nn.Module):
    def __init__(self, n_obs, n_act, device=None):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(n_obs, 120, device=device),
            nn.ReLU(),
            nn.Linear(120, 84, device=device),
            nn.ReLU(),
            nn.Linear(84, n_act, device=device),
        )

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step `t` (a number or a tensor): from `start_e` down to `end_e`, then flat."""
    epsilon = start_e + (end_e - start_e) * t / duration
    return epsilon.clamp_min(end_e) if isinstance(epsilon, torch.Tensor) else max(epsilon, end_e)


class ReplayBuffer:
    """A circular buffer on `device`, written from numpy arrays, sampled uniformly. A TensorDict:
    a batch is one indexing."""

    def __init__(self, buffer_size, n_obs, device):
        self.storage = TensorDict(
            obs=torch.zeros(buffer_size, n_obs, device=device),
            next_obs=torch.zeros(buffer_size, n_obs, device=device),
            actions=torch.zeros(buffer_size, dtype=torch.long, device=device),
            rewards=torch.zeros(buffer_size, device=device),
            terminations=torch.zeros(buffer_size, device=device),
            batch_size=[buffer_size],
            device=device,
        )
        self.buffer_size, self.cursor, self.size, self.device = buffer_size, 0, 0, device

    def extend(self, transitions):
        n = sum(len(t["obs"]) for t in transitions)
        idx = torch.arange(self.cursor, self.cursor + n, device=self.device) % self.buffer_size
        for key, column in self.storage.items():
            values = np.concatenate([t[key] for t in transitions])
            column[idx] = torch.as_tensor(values).to(column)  # at its dtype
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):
        idx = torch.randint(0, self.size, (batch_size,), device=self.device)
        return self.storage[idx]

    def state_dict(self):  # the filled part (a copy: torch.save writes a view's whole storage)
        storage = {key: value[: self.size].clone() for key, value in self.storage.items()}
        return dict(storage=storage, cursor=self.cursor, size=self.size)

    def load_state_dict(self, state):
        self.cursor, self.size = state["cursor"], state["size"]
        for key, value in state["storage"].items():
            self.storage[key][: self.size] = value


def make_learner(args, n_obs, n_act, device):
    """The Q network, its target, the optimizer and the steps that use them."""
    q_network = QNetwork(n_obs, n_act, device=device)
    target_network = QNetwork(n_obs, n_act, device=device)
    target_network.load_state_dict(q_network.state_dict())
    # fused: one kernel for all parameters; capturable: a CUDA graph can replay its step
    optimizer = torch.optim.Adam(
        q_network.parameters(), lr=args.learning_rate, fused=True, capturable=args.cudagraphs
    )
    # the env step on the device, which the policy advances in place: no sync, no recompile
    global_step = torch.zeros((), dtype=torch.long, device=device)
    exploration_steps = args.exploration_fraction * args.total_timesteps

    def policy(obs):
        """Epsilon-greedy with one coin for all envs, as CleanRL flips it, on the device."""
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        with torch.no_grad():
            q_values = q_network(obs)
        explore = torch.rand((), device=obs.device) < epsilon
        random_actions = torch.randint(0, n_act, (obs.shape[0],), device=obs.device)
        global_step.add_(obs.shape[0])
        return torch.where(explore, random_actions, q_values.argmax(dim=1))

    def update(data):
        """One TD step; returns the loss and the mean Q of the actions taken."""
        with torch.no_grad():
            target_max, _ = target_network(data["next_obs"]).max(dim=1)
            td_target = data["rewards"] + args.gamma * target_max * (1 - data["terminations"])
        q_values = q_network(data["obs"])
        old_val = q_values.gather(1, data["actions"].unsqueeze(-1)).squeeze(-1)
        loss = F.mse_loss(td_target, old_val)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach(), old_val.mean().detach()

    params, target_params = from_module(q_network).data, from_module(target_network).data

    def update_target():
        """Moves the target a fraction `tau` of the way to the Q network (1: a copy)."""
        target_params.lerp_(params, args.tau)  # one in-place op over all parameters

    return SimpleNamespace(
        policy=policy,
        global_step=global_step,
        q_network=q_network,
        target_network=target_network,
        optimizer=optimizer,
        update=update,
        update_target=update_target,
    )


def main(args):
    check_args(args)
    run = Run(args, "dqn_torchcompile")  # runs.py: folder, seeds, signals, ...
    videos = None if args.eval_model else run.videos
    envs = make_envs(args.env_id, args.num_envs, args.seed, videos, tensor=args.tensor_envs)
    spaces = envs.single_observation_space, envs.single_action_space
    if not (isinstance(spaces[0], gym.spaces.Box) and isinstance(spaces[1], gym.spaces.Discrete)):
        fail(f"--env-id {args.env_id!r} has spaces {spaces}; DQN needs Box obs, Discrete actions")
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    n_obs = int(np.prod(spaces[0].shape))
    n_act = int(spaces[1].n)
    learner = make_learner(args, n_obs, n_act, device)
    q_network = learner.q_network

    def evaluate_greedy(episodes, videos):
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes)
        greedy = lambda obs: q_network(obs).argmax(dim=1)  # noqa: E731
        return evaluate(greedy, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        q_network.load_state_dict(run.saved_model)
        return run.finish(device, q_network.state_dict(), evaluate_greedy)

    policy, update = learner.policy, learner.update
    if args.compile:
        policy = torch.compile(policy, fullgraph=True)
        update = torch.compile(update)
    if args.cudagraphs:
        # warm-up calls (Adam makes its state, compile compiles), one records, the rest replay
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    rb = ReplayBuffer(args.buffer_size, n_obs, device)
    transitions = []
    obs, _ = envs.reset(seed=args.seed)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        if transitions:  # written now, where the next write would put them: the same buffer
            rb.extend(transitions)
            transitions.clear()
        state = dict(
            global_step=learner.global_step,
            q_network=learner.q_network,
            target_network=learner.target_network,
            optimizer=learner.optimizer,
        )
        return dict(learner=state, rb=rb, envs=(envs, obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    learning_starts = args.learning_starts // args.num_envs
    exploration_steps = args.exploration_fraction * args.total_timesteps
    qf_loss = q_mean = torch.zeros((), device=device)
    for iteration in run.progress(range(start, args.total_timesteps // args.num_envs)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin * args.train_frequency + 1:
            run.start_clock(global_step)  # compile and warm-up are behind

        # act
        actions = policy(torch.as_tensor(obs, device=device, dtype=torch.float)).cpu().numpy()

        # step the envs
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        run.log_episodes(global_step, finished_episodes(infos))

        # store: a truncated episode bootstraps from its true last observation
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions)
        transition |= dict(rewards=rewards, terminations=terminations)
        transitions.append(transition)  # numpy arrays until the next write
        obs = next_obs

        # update
        if iteration % args.train_frequency == 0:
            rb.extend(transitions)
            transitions.clear()
        if iteration > learning_starts:
            if iteration % args.train_frequency == 0:
                qf_loss, q_mean = update(rb.sample(args.batch_size))
            if iteration % args.target_network_frequency == 0:
                learner.update_target()

        # log
        if iteration % 100 == 0:
            epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
            metrics = dict(td_loss=qf_loss, q_values=q_mean, epsilon=epsilon)
            run.log_progress(global_step, metrics)

        # the env steps so far; a checkpoint when due, on a signal, at the end
        run.checkpoint(iteration, training_state, global_step + args.num_envs)
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, q_network.state_dict(), evaluate_greedy)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    sizes = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "train_frequency")
    for flag in (*sizes, "target_network_frequency", "learning_rate"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than --num-envs {args.num_envs}")
    if args.buffer_size < max(args.batch_size, args.num_envs * args.train_frequency):
        buffer = f"--buffer-size {args.buffer_size}"
        fail(f"{buffer} is smaller than --batch-size or --num-envs x --train-frequency")
    if args.learning_starts < 0 or not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail("--learning-starts must be >= 0, --tau in (0, 1] and --gamma in [0, 1]")
    epsilons = (args.start_e, args.end_e)
    if not 0 < args.exploration_fraction <= 1 or not all(0 <= e <= 1 for e in epsilons):
        fail("--exploration-fraction must be in (0, 1], --start-e and --end-e in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args))
