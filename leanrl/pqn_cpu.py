"""Parallel Q-Network (PQN), pqn.py made fast on a CPU (same algorithm, same defaults).

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/2407.04811

    python leanrl/pqn_cpu.py               # the benchmark run, the update compiled
    python leanrl/pqn_cpu.py --no-compile  # the same functions, eagerly

Every call here is small and costs more in Python and dispatch than in arithmetic. So acting runs
the Q network in numpy, on views of the weights, and the rollout and its Q(lambda) returns stay in
numpy; the update is a function of the parameters (`torch.func` gradients, the clipping written
out, optimizers.py's RAdam) compiled as one graph. Threads: runs.py measures (`--threads` fixes
them); `--bf16`: the update in bfloat16 where the CPU has it. On a GPU, run pqn_torchcompile.py.
"""

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from flags import TensorEnvFlags, fail
from optimizers import RAdam
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
    num_envs: int = 4
    """the number of parallel environments"""
    num_steps: int = 128
    """the number of vector steps of each rollout"""
    num_minibatches: int = 4
    """the number of minibatches each epoch splits the rollout into"""
    update_epochs: int = 4
    """the number of epochs (passes over the rollout) of each update"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` over which epsilon falls from `start_e` to `end_e`"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) returns"""
    reward_scale: float = 1.0
    """the factor on every reward in the returns (purejaxql's reward scaling; 1: CleanRL's)"""

    compile: bool = True
    """compile each update as one graph; --no-compile runs the same functions eagerly"""


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def float32_output(net, x):
    """`net(x)`, its output layer in float32 under --bf16's autocast too: the values the loss
    reads keep their precision (bfloat16 would round a Q-value of 100 to a multiple of 0.5)."""
    x = net[:-1](x)
    if not torch.is_autocast_enabled("cpu"):  # no autocast in the graph: AOTAutograd caches it
        return net[-1](x)
    with torch.autocast("cpu", enabled=False):
        return net[-1](x.to(net[-1].weight.dtype))  # the weights' float32


class QNetwork(nn.Module):
    """An MLP whose hidden layers are normalized (LayerNorm): what lets PQN drop the target
    network."""

    def __init__(self, n_obs, n_act):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Linear(n_obs, 120)),
            nn.LayerNorm(120),
            nn.ReLU(),
            layer_init(nn.Linear(120, 84)),
            nn.LayerNorm(84),
            nn.ReLU(),
            layer_init(nn.Linear(84, n_act)),
        )

    def forward(self, x):
        return float32_output(self.network, x)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step `t`: from `start_e` at 0 down to `end_e` at `duration`, then flat."""
    return max(start_e + (end_e - start_e) * t / duration, end_e)


def q_lambda_returns(
    rewards, values, next_value, final_values, terminations, truncations, gamma, q_lambda
):
    """pqn.py's Q(lambda) returns on numpy arrays, shaped [num_steps, num_envs]. `values[t]` is
    max_a Q of the obs at step t, `next_value` [num_envs] that of the obs after the last step,
    `final_values[t]` that of the true final obs of an episode truncated at step t."""
    dones = np.maximum(terminations, truncations)
    # after an episode's last step: its final obs' value if it was cut off, 0 if it terminated
    next_values = np.concatenate([values[1:], next_value[None]])
    next_values = np.where(dones > 0, final_values, next_values) * (1 - terminations)
    # R_t = r_t + gamma * ((1 - lambda) * V_{t+1} + lambda * R_{t+1}), where R_{t+1} is V_{t+1}
    # after an episode's last step and after the rollout's
    returns = np.zeros_like(values)
    next_return = next_values[-1]
    for t in reversed(range(len(values))):
        next_return = np.where(dones[t] > 0, next_values[t], next_return)
        mixed = (1 - q_lambda) * next_values[t] + q_lambda * next_return
        returns[t] = next_return = rewards[t] + gamma * mixed
    return returns


def clip_grad_norm(grads, max_norm):
    """`nn.utils.clip_grad_norm_` on a dict of gradients: scaled down together to `max_norm`."""
    total_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    coef = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    return {name: g * coef for name, g in grads.items()}


def make_learner(args, n_obs, n_act):
    """The Q network, its optimizer and the steps that use them."""
    q_network = QNetwork(n_obs, n_act)
    # the network's tensors, which RAdam changes in place
    params = {name: param.data for name, param in q_network.named_parameters()}
    lr = torch.tensor(args.learning_rate)  # annealed in place: nothing recompiles
    optimizer = RAdam(params, lr=lr)
    # numpy views of the weights: the policy acts with the current ones
    linears, norms = q_network.network[::3], q_network.network[1::3]
    layers = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in linears]
    scales = [(m.weight.detach().numpy(), m.bias.detach().numpy(), m.eps) for m in norms]
    # a row's mean as a product with [1/n, ..., 1/n]: at 4 rows a numpy reduction costs more
    averages = [np.full((len(m.weight), 1), 1 / len(m.weight), np.float32) for m in norms]

    def q_values(obs):
        """`QNetwork.forward` in numpy (at 4 envs a torch call costs more to dispatch than its
        arithmetic); a test holds it to the module."""
        x = obs
        for (w, b), (gain, shift, eps), average in zip(layers, scales, averages):
            x = x @ w.T + b
            x -= x @ average  # LayerNorm, in place
            x *= gain / np.sqrt((x * x) @ average + eps)
            x += shift
            np.maximum(x, 0, out=x)
        w, b = layers[-1]
        return x @ w.T + b

    def policy(obs, epsilon):
        """Per env, the greedy action or, with probability `epsilon` (a coin per env, as CleanRL
        flips them), a uniform one; and the greedy action's value, max_a Q."""
        q = q_values(obs)
        coins, uniform = np.random.random((2, len(obs)))  # one draw for both
        random_actions = (uniform * n_act).astype(np.int64)
        return np.where(coins < epsilon, random_actions, q.argmax(axis=1)), q.max(axis=1)

    def get_value(obs):
        """max_a Q(obs, a): what a return bootstraps from."""
        return q_values(obs).max(axis=1)

    def loss_fn(params, mb):
        q = functional_call(q_network, params, (mb["obs"],))
        old_val = q.gather(1, mb["actions"].unsqueeze(-1)).squeeze(-1)
        return F.mse_loss(mb["returns"], old_val), old_val.mean()

    # --bf16: the hidden layers in bfloat16 (the outputs in `float32_output`), the parameters,
    # gradients and RAdam's moments in float32
    autocast = torch.autocast("cpu", torch.bfloat16) if args.bf16 else contextlib.nullcontext()

    def update(mb):
        """One gradient step on a minibatch as a function of the parameters:
        `torch.compile(fullgraph=True)` makes it one graph, forward pass to RAdam's step."""
        with autocast:
            grads, (loss, q_mean) = grad_and_value(loss_fn, has_aux=True)(params, mb)
        optimizer.step(clip_grad_norm(grads, args.max_grad_norm))
        return loss, q_mean

    return SimpleNamespace(
        q_network=q_network,
        optimizer=optimizer,
        policy=policy,
        get_value=get_value,
        update=update,
    )


def main(args):
    check_args(args)
    run = Run(args, "pqn_cpu")  # runs.py: folder, seeds, threads, ...
    videos = None if args.eval_model else run.videos
    envs = make_envs(
        args.env_id, args.num_envs, args.seed, videos, tensor=args.tensor_envs, compile=args.compile
    )
    spaces = envs.single_observation_space, envs.single_action_space
    if not (isinstance(spaces[0], gym.spaces.Box) and isinstance(spaces[1], gym.spaces.Discrete)):
        fail(f"--env-id {args.env_id!r} has spaces {spaces}; PQN needs Box obs, Discrete actions")
    device = torch.device("cpu")
    n_obs = int(np.prod(spaces[0].shape))
    n_act = int(spaces[1].n)
    learner = make_learner(args, n_obs, n_act)
    q_network, optimizer = learner.q_network, learner.optimizer

    def evaluate_greedy(episodes, videos):
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes)
        greedy = lambda obs: q_network(obs).argmax(dim=1)  # noqa: E731
        return evaluate(greedy, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        q_network.load_state_dict(run.saved_model)
        envs.close()
        return run.finish(device, q_network.state_dict(), evaluate_greedy)

    policy, get_value, update = learner.policy, learner.get_value, learner.update
    if args.compile:  # one graph, whose C++ wrapper calls its kernels with fewer Python calls
        update = torch.compile(update, fullgraph=True, options={"cpp_wrapper": True})

    # the rollout, [num_steps, num_envs, ...], in numpy
    scalars = ("values", "rewards", "terminations", "truncations", "final_values")
    rollout = {key: np.zeros((args.num_steps, args.num_envs), np.float32) for key in scalars}
    rollout["obs"] = np.zeros((args.num_steps, args.num_envs, n_obs), np.float32)
    rollout["actions"] = np.zeros((args.num_steps, args.num_envs), np.int64)

    next_obs, _ = envs.reset(seed=args.seed)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    exploration_steps = args.exploration_fraction * args.total_timesteps

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(q_network=learner.q_network, optimizer=learner.optimizer)
        return dict(learner=state, envs=(envs, next_obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    global_step = run.steps  # 0 unless resumed
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            # in place: no recompile
            optimizer.param_groups[0]["lr"].fill_(frac * args.learning_rate)

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs
            rollout["obs"][step] = next_obs
            epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
            action, value = policy(np.asarray(next_obs, dtype=np.float32), epsilon)
            rollout["actions"][step] = action
            rollout["values"][step] = value

            next_obs, reward, terminations, truncations, infos = envs.step(action)
            run.log_episodes(global_step, finished_episodes(infos))
            rollout["rewards"][step] = reward
            rollout["terminations"][step] = terminations
            rollout["truncations"][step] = truncations
            if truncations.any():
                # the value where each truncated episode was cut (the returns read it only there)
                final_obs = np.asarray(true_next_obs(next_obs, infos), dtype=np.float32)
                rollout["final_values"][step] = get_value(final_obs)

        # returns
        next_value = get_value(np.asarray(next_obs, dtype=np.float32))
        keys = ("values", "final_values", "terminations", "truncations")
        returns = q_lambda_returns(
            args.reward_scale * rollout["rewards"],
            **{key: rollout[key] for key in keys},
            next_value=next_value,
            gamma=args.gamma,
            q_lambda=args.q_lambda,
        )

        # update
        b = {key: torch.from_numpy(rollout[key]).flatten(0, 1) for key in ("obs", "actions")}
        b["returns"] = torch.from_numpy(returns).flatten()
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size).split(minibatch_size)
            for mb_inds in b_inds:
                td_loss, q_mean = update({key: value[mb_inds] for key, value in b.items()})

        # log
        metrics = dict(td_loss=td_loss, q_values=q_mean, epsilon=epsilon)
        metrics["learning_rate"] = optimizer.param_groups[0]["lr"]
        run.log_progress(global_step, metrics)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, q_network.state_dict(), evaluate_greedy)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    flags = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    for flag in (*flags, "learning_rate", "max_grad_norm", "reward_scale"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    batch_size = args.num_steps * args.num_envs
    if args.total_timesteps < batch_size:
        rollout = "one rollout (--num-steps x --num-envs)"
        fail(f"--total-timesteps {args.total_timesteps} is less than {rollout}")
    if batch_size % args.num_minibatches:
        rollout = f"--num-steps x --num-envs ({batch_size})"
        fail(f"--num-minibatches must split {rollout} into equal parts")
    if not 0 <= args.gamma <= 1 or not 0 <= args.q_lambda <= 1:
        fail("--gamma and --q-lambda must be in [0, 1]")
    epsilons = (args.start_e, args.end_e)
    if not 0 < args.exploration_fraction <= 1 or not all(0 <= e <= 1 for e in epsilons):
        fail("--exploration-fraction must be in (0, 1], --start-e and --end-e in [0, 1]")


if __name__ == "__main__":
    main(tyro.cli(Args))
