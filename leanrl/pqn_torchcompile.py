"""Parallel Q-Network (PQN), optimized for a GPU: the twin of pqn.py.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/2407.04811. The algorithm and CleanRL's defaults: see pqn.py.

    python leanrl/pqn_torchcompile.py --compile  # acting, the returns and the update compiled
    python leanrl/pqn_torchcompile.py --compile --cudagraphs  # and replayed as CUDA graphs
    python leanrl/pqn_torchcompile.py --compile --cudagraphs --tensor-envs --num-envs 16384

Same algorithm, defaults and loop as pqn.py. What changes for speed:
- a TensorDict rollout on the device, its rewards and ends copied there once a rollout;
- acting on the device without a host sync, epsilon from a step counter there;
- the Q(lambda) returns by doubling instead of a loop; a tensor learning rate;
- `--compile` compiles acting, the returns and the whole update, RAdam's step with it;
- `--cudagraphs` records acting, the returns and the update as CUDA graphs (needs a CUDA device);
- with `--tensor-envs` the envs are tensors on the device, and one function acts, steps them and
  stores the step: compiled whole and recorded as one CUDA graph, the rollout never leaves the GPU.
A resumed run (`--resume`) goes on exactly, but with `--capture-video`, whose recorder cannot be
saved: then its episodes start afresh.
"""

import os
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
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule
from vector_envs import evaluate, finished_episodes, log_ended, make_envs, true_next_obs


@dataclass
class Args(TensorEnvFlags, CudaFlags):
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

    compile: bool = False
    """compile acting, the returns and the update with torch.compile"""
    cudagraphs: bool = False
    """record acting, the returns and the update as CUDA graphs (needs a CUDA device)"""


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """An MLP whose hidden layers are normalized (LayerNorm): what lets PQN drop the target
    network."""

    def __init__(self, n_obs, n_act, device=None):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Linear(n_obs, 120, device=device)),
            nn.LayerNorm(120, device=device),
            nn.ReLU(),
            layer_init(nn.Linear(120, 84, device=device)),
            nn.LayerNorm(84, device=device),
            nn.ReLU(),
            layer_init(nn.Linear(84, n_act, device=device)),
        )

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step `t` (a number or a tensor): from `start_e` down to `end_e`, then flat."""
    epsilon = start_e + (end_e - start_e) * t / duration
    return epsilon.clamp_min(end_e) if isinstance(epsilon, torch.Tensor) else max(epsilon, end_e)


def epsilon_greedy(q_values, epsilon):
    """Per env, the greedy action or, with probability `epsilon` (a coin per env, as CleanRL flips
    them), a uniform one; and the greedy action's value, max_a Q."""
    values, greedy = q_values.max(dim=1)
    random_actions = torch.randint_like(greedy, q_values.shape[1])
    explore = torch.rand_like(values) < epsilon
    return torch.where(explore, random_actions, greedy), values


def q_lambda_returns(
    rewards, values, next_value, final_values, terminations, truncations, gamma, q_lambda
):
    """The Q(lambda) returns, shaped [num_steps, num_envs]. `values[t]` is max_a Q of the obs at
    step t, `next_value` [num_envs] that of the obs after the last step, `final_values[t]` that of
    the true final obs of an episode truncated at step t (read only there)."""
    dones = torch.maximum(terminations, truncations)
    # after an episode's last step: its final obs' value if it was cut off, 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    # R_t = r_t + gamma * ((1 - lambda) * V_{t+1} + lambda * R_{t+1}), where R_{t+1} is V_{t+1}
    # after an episode's last step and after the rollout's: R_t = b_t + c_t * R_{t+1}, solved by
    # doubling (after shift s, returns[t] sums R_t's terms t .. t + 2s - 1, coefs[t] their c's)
    ends = torch.cat([dones[:-1], torch.ones_like(dones[-1:])])
    coefs = gamma * q_lambda * (1 - ends)
    returns = rewards + gamma * next_values - coefs * next_values
    shift = 1
    while shift < len(values):
        returns = torch.cat([returns[:-shift] + coefs[:-shift] * returns[shift:], returns[-shift:]])
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return returns


def make_rollout_step(envs, policy, get_value, rollout):
    """With the tensor envs, one step of the rollout on the device as one function: act, step every
    env, store the step at index `step` (a tensor) of `rollout` (a dict of tensors [num_steps,
    num_envs]). It compiles whole, and a CUDA graph records it: the rollout never leaves the
    device."""

    def rollout_step(obs, step):
        action, value = policy(obs)
        next_obs, reward, terminations, truncations, infos = envs.step(action)
        # every env's, but the returns read it only where an episode was cut off: no branch
        final_value = get_value(infos["final_obs"])
        episode = infos["final_info"]["episode"]
        row = dict(obs=obs, actions=action, values=value, rewards=reward, final_values=final_value)
        row |= dict(terminations=terminations, truncations=truncations, ended=infos["_final_obs"])
        row |= dict(episode_returns=episode["r"], episode_lengths=episode["l"])
        for key, x in row.items():
            rollout[key].index_copy_(0, step, x.unsqueeze(0).to(rollout[key].dtype))
        return next_obs

    return rollout_step


def make_learner(args, n_obs, n_act, device):
    """The Q network, its optimizer and the steps that use them."""
    q_network = QNetwork(n_obs, n_act, device=device)
    # a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # capturable: a CUDA graph can record its step (RAdam has no fused kernel)
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=lr, capturable=args.cudagraphs)
    # the env step on the device, which acting advances in place: no sync, no recompile
    global_step = torch.zeros((), dtype=torch.long, device=device)
    exploration_steps = args.exploration_fraction * args.total_timesteps

    def policy(obs):
        """Epsilon-greedy actions and the greedy actions' values, on the device."""
        global_step.add_(obs.shape[0])
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        return epsilon_greedy(q_network(obs), epsilon)

    def get_value(obs):
        """max_a Q(obs, a): what a return bootstraps from."""
        return q_network(obs).max(dim=1).values

    def loss_fn(mb):
        old_val = q_network(mb["obs"]).gather(1, mb["actions"].unsqueeze(-1)).squeeze(-1)
        return F.mse_loss(mb["returns"], old_val), old_val.mean().detach()

    def update(mb):
        """One gradient step on a minibatch; returns its loss and mean Q of the actions taken."""
        optimizer.zero_grad()
        loss, q_mean = loss_fn(mb)
        loss.backward()
        nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
        optimizer.step()
        return loss.detach(), q_mean

    return SimpleNamespace(
        q_network=q_network,
        optimizer=optimizer,
        policy=policy,
        get_value=get_value,
        update=update,
        global_step=global_step,
    )


def main(args):
    check_args(args)
    run = Run(args, "pqn_torchcompile")  # runs.py: folder, seeds, signals, ...
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    videos = None if args.eval_model else run.videos
    # the tensor envs on the device: the whole rollout stays there
    envs = make_envs(
        args.env_id, args.num_envs, args.seed, videos, tensor=args.tensor_envs, device=device
    )
    spaces = envs.single_observation_space, envs.single_action_space
    if not (isinstance(spaces[0], gym.spaces.Box) and isinstance(spaces[1], gym.spaces.Discrete)):
        fail(f"--env-id {args.env_id!r} has spaces {spaces}; PQN needs Box obs, Discrete actions")
    n_obs = int(np.prod(spaces[0].shape))
    n_act = int(spaces[1].n)
    check_memory(args, n_obs, device)
    learner = make_learner(args, n_obs, n_act, device)
    q_network, optimizer = learner.q_network, learner.optimizer

    def evaluate_greedy(episodes, videos):
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes)
        greedy = lambda obs: q_network(obs).argmax(dim=1)  # noqa: E731
        return evaluate(greedy, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        q_network.load_state_dict(run.saved_model)
        envs.close()
        return run.finish(device, q_network.state_dict(), evaluate_greedy)

    # the rollout, [num_steps, num_envs, ...], one TensorDict
    scalars = ("values", "rewards", "terminations", "truncations", "final_values")
    rollout = {key: torch.zeros(args.num_steps, args.num_envs, device=device) for key in scalars}
    rollout["obs"] = torch.zeros(args.num_steps, args.num_envs, n_obs, device=device)
    rollout["actions"] = torch.zeros(args.num_steps, args.num_envs, dtype=torch.long, device=device)
    if args.tensor_envs:  # which episodes ended where, and their returns
        rollout["ended"] = torch.zeros(
            args.num_steps, args.num_envs, dtype=torch.bool, device=device
        )
        rollout["episode_returns"] = torch.zeros(args.num_steps, args.num_envs, device=device)
        rollout["episode_lengths"] = torch.zeros_like(rollout["actions"])
    # with the tensor envs one function acts, steps and stores; it is compiled whole, so it holds
    # the policy and the values as they are here, before they are wrapped on their own below
    rollout_step = make_rollout_step(envs, learner.policy, learner.get_value, rollout)
    rollout = TensorDict(rollout, batch_size=[args.num_steps, args.num_envs], device=device)

    policy, get_value, update = learner.policy, learner.get_value, learner.update
    compute_returns = q_lambda_returns
    if args.compile:
        policy = torch.compile(policy, fullgraph=True)
        rollout_step = torch.compile(rollout_step, fullgraph=True)
        compute_returns = torch.compile(q_lambda_returns, fullgraph=True)
        update = torch.compile(update)
    if args.cudagraphs:
        # warm-up calls run as they are (RAdam makes its state), one records, the rest replay
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        rollout_step = CudaGraphModule(rollout_step, warmup=3 if args.compile else 2)
        compute_returns = CudaGraphModule(compute_returns, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    def to_tensor(x):  # the envs' numpy arrays, as float32 on the device
        return torch.as_tensor(x, device=device, dtype=torch.float)

    # rewards and ends in numpy until the rollout ends: one copy to the device each, not one a step
    outcomes = {key: np.zeros((args.num_steps, args.num_envs), np.float32) for key in scalars[1:4]}

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = to_tensor(next_obs)
    steps = torch.arange(args.num_steps, device=device).split(1)  # the index of each step
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    exploration_steps = args.exploration_fraction * args.total_timesteps

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(q_network=learner.q_network, optimizer=learner.optimizer)
        return dict(learner=state | dict(global_step=learner.global_step), envs=(envs, next_obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    global_step = run.steps  # 0 unless resumed
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            # in place: no recompile
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)

        # rollout
        if args.tensor_envs:  # on the device, a step a call; the episodes read once an iteration
            with torch.no_grad():
                for step in steps:
                    next_obs = rollout_step(next_obs, step)
            # in one host sync, each step's episodes at the env steps after it, as below
            episodes = rollout["ended"], rollout["episode_returns"], rollout["episode_lengths"]
            log_ended(run, *episodes, global_step + args.num_envs, args.num_envs)
            global_step += batch_size  # the rollout's env steps, as the loop below counts them
        else:
            for step in range(args.num_steps):
                global_step += args.num_envs
                rollout["obs"][step] = next_obs
                with torch.no_grad():
                    action, value = policy(next_obs)
                rollout["actions"][step] = action
                rollout["values"][step] = value

                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                run.log_episodes(global_step, finished_episodes(infos))
                outcomes["rewards"][step] = reward
                outcomes["terminations"][step] = terminations
                outcomes["truncations"][step] = truncations
                if truncations.any():
                    # the value where each truncated episode was cut (read only there)
                    final_obs = to_tensor(true_next_obs(next_obs, infos))
                    with torch.no_grad():
                        rollout["final_values"][step] = get_value(final_obs)
                next_obs = to_tensor(next_obs)

        # returns
        for key, array in () if args.tensor_envs else outcomes.items():
            rollout[key].copy_(torch.from_numpy(array))
        with torch.no_grad():
            next_value = get_value(next_obs)
            keys = ("values", "final_values", "terminations", "truncations")
            returns = compute_returns(
                args.reward_scale * rollout["rewards"],
                **{key: rollout[key] for key in keys},
                next_value=next_value,
                gamma=args.gamma,
                q_lambda=args.q_lambda,
            )

        # update
        b = rollout.select("obs", "actions").flatten(0, 1)
        b["returns"] = returns.flatten()
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                td_loss, q_mean = update(b[mb_inds])

        # log
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, learner.global_step)
        metrics = dict(td_loss=td_loss, q_values=q_mean, epsilon=epsilon)
        metrics["learning_rate"] = optimizer.param_groups[0]["lr"]
        run.log_progress(global_step, metrics)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, q_network.state_dict(), evaluate_greedy)


def check_memory(args, n_obs, device):
    """Exit status 2 if the rollout cannot fit on the device: its obs and 7 numbers a step, 4 bytes
    each, about 3 times over (the rollout, the flattened batch, a minibatch's activations)."""
    need = 3 * args.num_steps * args.num_envs * (n_obs + 7) * 4
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    if need > free:
        size = f"--num-envs {args.num_envs} x --num-steps {args.num_steps}"
        fail(f"{size}: the rollout needs {need / 2**30:.1f} GiB, {device} has {free / 2**30:.1f}")


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
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args))
