"""Deep Q-Network for discrete actions, dqn.py made fast on a CPU (same algorithm, same defaults).

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://www.nature.com/articles/nature14236

    python leanrl/dqn_cpu.py                           # the benchmark run, the update compiled
    python leanrl/dqn_cpu.py --no-compile              # the same functions, eagerly
    python leanrl/dqn_cpu.py --total-timesteps 100000  # learns CartPole

Every call here is small and costs more in Python and dispatch than in arithmetic. So the update
is a function of the parameters (`torch.func` gradients, optimizers.py's Adam) compiled as one
graph; acting runs the Q network in numpy, on views of the weights; transitions are written once
per `train_frequency` iterations. Threads: runs.py measures (`--threads` fixes them); `--bf16`: the
update in bfloat16 where the CPU has it. On a GPU, run dqn_torchcompile.py.
"""

import contextlib
import random
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from flags import TensorEnvFlags, fail
from optimizers import Adam
from runs import Run
from threads import CPUFlags
from torch.func import functional_call, grad_and_value
from vector_envs import evaluate, finished_episodes, make_envs, true_next_obs


@dataclass
class Args(TensorEnvFlags, CPUFlags):
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

    compile: bool = True
    """compile each update as one graph; --no-compile runs the same functions eagerly"""


def float32_output(net, x):
    """`net(x)`, its output layer in float32 under --bf16's autocast too: the values the loss
    reads keep their precision (bfloat16 would round a Q-value of 100 to a multiple of 0.5)."""
    x = net[:-1](x)
    if not torch.is_autocast_enabled("cpu"):  # no autocast in the graph: AOTAutograd caches it
        return net[-1](x)
    with torch.autocast("cpu", enabled=False):
        return net[-1](x.to(net[-1].weight.dtype))  # the weights' float32


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
        return float32_output(self.network, x)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step `t`: from `start_e` at 0 down to `end_e` at `duration`, then flat."""
    return max(start_e + (end_e - start_e) * t / duration, end_e)


class ReplayBuffer:
    """A circular buffer in CPU tensors, written from numpy arrays through numpy views of the
    tensors (a numpy write costs a fraction of a torch one), sampled uniformly."""

    def __init__(self, buffer_size, n_obs):
        self.storage = dict(
            obs=torch.zeros(buffer_size, n_obs),
            next_obs=torch.zeros(buffer_size, n_obs),
            actions=torch.zeros(buffer_size, dtype=torch.long),
            rewards=torch.zeros(buffer_size),
            terminations=torch.zeros(buffer_size),
        )
        self.views = {key: column.numpy() for key, column in self.storage.items()}
        self.buffer_size, self.cursor, self.size = buffer_size, 0, 0

    def extend(self, transitions):
        n = sum(len(t["obs"]) for t in transitions)
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        for key, view in self.views.items():
            view[idx] = np.concatenate([t[key] for t in transitions])  # at its dtype
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):
        idx = torch.randint(0, self.size, (batch_size,))
        return {key: value[idx] for key, value in self.storage.items()}

    def state_dict(self):  # the filled part (a copy: torch.save writes a view's whole storage)
        storage = {key: value[: self.size].clone() for key, value in self.storage.items()}
        return dict(storage=storage, cursor=self.cursor, size=self.size)

    def load_state_dict(self, state):
        self.cursor, self.size = state["cursor"], state["size"]
        for key, value in state["storage"].items():
            self.storage[key][: self.size] = value


def make_learner(args, n_obs, n_act):
    """The Q network, its target, the optimizer and the steps that use them."""
    q_network = QNetwork(n_obs, n_act)
    target_network = QNetwork(n_obs, n_act)
    target_network.load_state_dict(q_network.state_dict())
    # the networks' tensors, which Adam and update_target change in place
    params = {name: param.data for name, param in q_network.named_parameters()}
    target_params = {name: param.data for name, param in target_network.named_parameters()}
    optimizer = Adam(params, lr=args.learning_rate)
    # numpy views of the weights: the policy acts with the current ones
    layers = [
        (layer.weight.detach().numpy(), layer.bias.detach().numpy())
        for layer in q_network.network[::2]
    ]
    exploration_steps = args.exploration_fraction * args.total_timesteps
    # the env steps acted, which the policy advances in place (a checkpoint restores it there)
    global_step = np.zeros((), dtype=np.int64)

    def policy(obs):
        """Epsilon-greedy with one coin for all envs, as CleanRL flips it, and the Q network in
        numpy (at batch 1 a torch call costs more to dispatch than its arithmetic). It restates
        `QNetwork.forward`, and a test holds it to it."""
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, int(global_step))
        global_step[...] += len(obs)
        if random.random() < epsilon:
            return np.random.randint(n_act, size=len(obs))
        (w1, b1), (w2, b2), (w3, b3) = layers
        x = np.maximum(obs @ w1.T + b1, 0)
        x = np.maximum(x @ w2.T + b2, 0)
        return (x @ w3.T + b3).argmax(axis=1)

    def loss_fn(params, data, td_target):
        q_values = functional_call(q_network, params, (data["obs"],))
        old_val = q_values.gather(1, data["actions"].unsqueeze(-1)).squeeze(-1)
        return F.mse_loss(td_target, old_val), old_val.mean()

    def td_grads(params, target_params, data):
        target_max, _ = functional_call(q_network, target_params, (data["next_obs"],)).max(dim=1)
        td_target = data["rewards"] + args.gamma * target_max * (1 - data["terminations"])
        return grad_and_value(loss_fn, has_aux=True)(params, data, td_target)

    # --bf16: the hidden layers in bfloat16 (the outputs in `float32_output`), the parameters,
    # gradients and Adam's moments in float32
    autocast = torch.autocast("cpu", torch.bfloat16) if args.bf16 else contextlib.nullcontext()

    def update(data):
        """One TD step as a function of the parameters: `torch.compile(fullgraph=True)` makes it
        one graph, forward pass to Adam's step (`backward` and `torch.optim` would split it)."""
        with autocast:
            grads, (loss, q_mean) = td_grads(params, target_params, data)
        optimizer.step(grads)
        return loss, q_mean

    def update_target():
        """Moves the target a fraction `tau` of the way to the Q network (1: a copy)."""
        for name, target_param in target_params.items():
            target_param.copy_(args.tau * params[name] + (1 - args.tau) * target_param)

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
    run = Run(args, "dqn_cpu")  # runs.py: folder, seeds, threads, ...
    videos = None if args.eval_model else run.videos
    envs = make_envs(
        args.env_id, args.num_envs, args.seed, videos, tensor=args.tensor_envs, compile=args.compile
    )
    spaces = envs.single_observation_space, envs.single_action_space
    if not (isinstance(spaces[0], gym.spaces.Box) and isinstance(spaces[1], gym.spaces.Discrete)):
        fail(f"--env-id {args.env_id!r} has spaces {spaces}; DQN needs Box obs, Discrete actions")
    device = torch.device("cpu")
    n_obs = int(np.prod(spaces[0].shape))
    n_act = int(spaces[1].n)
    learner = make_learner(args, n_obs, n_act)
    q_network = learner.q_network

    def evaluate_greedy(episodes, videos):
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes)
        greedy = lambda obs: q_network(obs).argmax(dim=1)  # noqa: E731
        return evaluate(greedy, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        q_network.load_state_dict(run.saved_model)
        return run.finish(device, q_network.state_dict(), evaluate_greedy)

    policy, update = learner.policy, learner.update
    if args.compile:  # one graph, whose C++ wrapper calls its kernels with fewer Python calls
        update = torch.compile(update, fullgraph=True, options={"cpp_wrapper": True})

    rb = ReplayBuffer(args.buffer_size, n_obs)
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
    qf_loss = q_mean = torch.zeros(())
    for iteration in run.progress(range(start, args.total_timesteps // args.num_envs)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin * args.train_frequency + 1:
            run.start_clock(global_step)  # compile and warm-up are behind

        # act
        actions = policy(np.asarray(obs, dtype=np.float32))

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


if __name__ == "__main__":
    main(tyro.cli(Args))
