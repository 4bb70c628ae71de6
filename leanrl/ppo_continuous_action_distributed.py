"""Proximal Policy Optimization (https://arxiv.org/abs/1707.06347) for continuous actions,
data-parallel over N processes with torch.distributed. Grown from the optimized twin
ppo_continuous_action_torchcompile.py: `diff` against it shows the scaling only. Defaults are
CleanRL's (HalfCheetah-v4, 1M steps, 2048 steps per rollout).

    torchrun --standalone --nproc_per_node 2 leanrl/ppo_continuous_action_distributed.py --compile

Each rank is the twin seeded `seed + RANK * num_envs`. The ranks start from rank 0's weights and
average each minibatch's gradients, so N ranks train as one process with N x num_envs envs. Rank 0
alone keeps the run folder, SUMMARY, wandb, model and checkpoint, which gathers every rank's
generators and envs: a resumed run (--resume, with as many ranks, each of which reads the file)
continues exactly where the envs can be saved. A collective waits at most `--dist-timeout` seconds
(docs/scaling-torchrun.md: more machines).
"""

import functools
import json
import math
import os
import pickle
import random
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from datetime import timedelta
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule


@dataclass
class Args:
    exp_name: str = "ppo_continuous_action_distributed"
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use a CUDA device when there is one, else the CPU"""
    track: bool = False
    """log to Weights and Biases (the only way wandb is touched)"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of the first env and of evaluation episodes to runs/<run_name>/videos/"""
    save_model: bool = False
    """save the policy's weights and the run's arguments to runs/<run_name>/<script>.pt"""
    eval_episodes: int = 0
    """after training, play this many episodes with the policy and report their mean return"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes episodes instead of training"""
    measure_burnin: int = 3
    """iterations (rollout + update) excluded from `sps` (they compile and warm up)"""
    checkpoint_minutes: float = 10.0
    """save the training state to runs/<run_name>/checkpoint.pt this often, and always on a first
    Ctrl-C or SIGTERM and at the end (0: only then)"""
    resume: str | None = None
    """continue the run of this checkpoint or run folder (`auto`: of runs/<run_name>, if any)"""
    run_name: str | None = None
    """the run folder's name under runs/ (default: <env_id>__<exp_name>__<seed>__<unix time>)"""

    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total environment steps of the experiment, all ranks together"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments of each rank"""
    num_steps: int = 2048
    """the number of vector steps of each rollout (of each rank)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of the general advantage estimation"""
    num_minibatches: int = 32
    """the number of minibatches each epoch splits the rollout into"""
    update_epochs: int = 10
    """the number of epochs (passes over the rollout) of each update"""
    norm_adv: bool = True
    """normalize the advantages of each minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """use a clipped loss for the value function, as in the paper"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value function loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """stop an update's epochs once the approximate KL exceeds this (default: off)"""

    compile: bool = False
    """compile GAE, the acting policy and the update's loss with `torch.compile`"""
    cudagraphs: bool = False
    """record the acting policy and the update as CUDA graphs (CUDA device, one process)"""
    dist_backend: str | None = None
    """the torch.distributed backend, nccl or gloo (default: nccl on CUDA, else gloo)"""
    dist_timeout: float = 120.0
    """seconds a collective may wait for the other ranks"""


def make_env(env_id, seed, gamma, video_dir=None, video_episodes=None, obs_rms=None):
    def thunk():
        env = gym.make(env_id, render_mode=None if video_dir is None else "rgb_array")
        # training: gymnasium's schedule (episodes 0, 1, 8, 27, ..., 1000, 2000, ...)
        if video_dir is not None:
            # evaluation
            record = None if video_episodes is None else lambda episode: episode < video_episodes
            prefix = "train" if video_episodes is None else "eval"
            env = gym.wrappers.RecordVideo(
                env, video_dir, record, name_prefix=prefix, disable_logger=True
            )
        if not isinstance(env.action_space, gym.spaces.Box):
            fail(
                f"--env-id {env_id!r} has a {type(env.action_space).__name__} action space; PPO "
                "here needs a Box"
            )
        # FlattenObservation, ClipAction and the clips with partials, not lambdas: checkpoints
        # pickle the wrappers
        space = env.observation_space
        flatten = functools.partial(gym.spaces.flatten, space)
        env = gym.wrappers.TransformObservation(env, flatten, gym.spaces.flatten_space(space))
        # before the normalization: it records the raw returns
        env = gym.wrappers.RecordEpisodeStatistics(env)
        space = env.action_space
        clip_action = functools.partial(np.clip, a_min=space.low, a_max=space.high)
        unbounded = gym.spaces.Box(-np.inf, np.inf, space.shape, space.dtype)
        env = gym.wrappers.TransformAction(env, clip_action, unbounded)
        env = gym.wrappers.NormalizeObservation(env)
        # a trained policy acts on observations normalized as in its training, frozen
        if obs_rms is not None:
            env.obs_rms.mean, env.obs_rms.var = obs_rms["mean"].numpy(), obs_rms["var"].numpy()
            env.obs_rms.count, env.update_running_mean = float(obs_rms["count"]), False
        clip = functools.partial(np.clip, a_min=-10, a_max=10)
        env = gym.wrappers.TransformObservation(env, clip, env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, clip)
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(env_id, num_envs, seed, gamma, video_dir=None, video_episodes=None, obs_rms=None):
    """Vector env, same-step autoreset (an episode's last step returns the reset obs, the true final
    obs in `infos`); the first env records to `video_dir`; `obs_rms` normalizes observations,
    frozen. A bad id or action space exit 2."""
    try:
        videos = [video_dir] + [None] * (num_envs - 1)  # the first env alone records
        thunks = [
            make_env(env_id, seed + i, gamma, videos[i], video_episodes, obs_rms)
            for i in range(num_envs)
        ]
        return gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    # an unknown id, or a `module:EnvId` whose module is missing
    except (gym.error.Error, ModuleNotFoundError) as e:
        fail(f"--env-id {env_id!r} cannot be made: {e}")


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, n_obs, n_act, device=None):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64, device=device)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64, device=device)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1, device=device), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64, device=device)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64, device=device)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_act, device=device), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, n_act, device=device))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        if action is None:
            action = action_mean + action_std * torch.randn_like(action_mean)
        # Normal(action_mean, action_std).log_prob(action) and .entropy(), written out
        log_prob = (
            -((action - action_mean) ** 2) / (2 * action_std**2)
            - action_logstd
            - 0.5 * math.log(2 * math.pi)
        )
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + action_logstd
        return action, log_prob.sum(1), entropy.sum(1), self.critic(x)


def finished_episodes(infos):
    """The returns of every episode that ended on this step (several envs can finish on the same
    step)."""
    final_info = infos.get("final_info", {})
    return (
        final_info["episode"]["r"][final_info["_episode"]].tolist()
        if "episode" in final_info
        else []
    )


def true_next_obs(next_obs, infos):
    """`next_obs` with the true final observation of each episode that ended on this step, where
    same-step autoreset put the reset one: a truncated episode bootstraps from the state where it
    was cut."""
    real_next_obs = next_obs.copy()
    for idx in np.flatnonzero(infos.get("_final_obs", [])):
        real_next_obs[idx] = infos["final_obs"][idx]
    return real_next_obs


def gae(rewards, values, next_value, final_values, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation: (advantages, returns), both [num_steps, num_envs] like
    every input but `next_value` [num_envs], the value of the obs after the last step.
    `final_values[t]` is the value of the true final obs of an episode truncated at step t (read
    only there)."""
    dones = torch.maximum(terminations, truncations)
    # the value of the state after step t: the next step's inside an episode; at its end, the true
    # final observation's if it was cut off, 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1} with c_t = gamma * lambda * (1 - done_t), solved by doubling:
    # after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 and coefs[t] is the
    # product of their c's. A Python loop over the steps would take minutes to compile.
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat(
            [advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]]
        )
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


# What scaling out adds: where a rank runs, and collectives that give up after a timeout


def process_layout(environ):
    """(rank, local_rank, world_size) from torchrun's variables; (0, 0, 1) without torchrun."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    if not any(name in environ for name in names):
        return 0, 0, 1
    try:
        rank, local_rank, world_size = (int(environ[name]) for name in names)
    except (KeyError, ValueError):
        values = [environ.get(name) for name in names]
        fail(
            f"RANK, LOCAL_RANK and WORLD_SIZE must all be set, as integers (got {values}): "
            "launch with torchrun"
        )
    if not (0 <= rank < world_size and 0 <= local_rank <= rank):
        fail(
            f"RANK {rank}, LOCAL_RANK {local_rank} and WORLD_SIZE {world_size} do not fit together"
        )
    return rank, local_rank, world_size


def rank_device(cuda, local_rank):
    """The GPU of this machine's rank `local_rank` if `cuda` and there is one, else the CPU."""
    if not (cuda and torch.cuda.is_available()):
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        fail(
            f"LOCAL_RANK {local_rank} has no GPU: this machine has "
            f"{torch.cuda.device_count()} (lower --nproc_per_node)"
        )
    # nccl's own work (barriers, its streams) goes to this rank's GPU, not GPU 0
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def dist_backend(args, device):
    """--dist-backend, or the device's default: nccl on CUDA, gloo on the CPU."""
    backend = args.dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend not in ("nccl", "gloo") or not dist.is_backend_available(backend):
        fail(
            f"--dist-backend {backend!r} is not available here (nccl needs a CUDA build, "
            "gloo works everywhere)"
        )
    if backend == "nccl" and device.type != "cuda":
        fail(f"--dist-backend nccl needs a CUDA device and this rank runs on {device} (use gloo)")
    return backend


def start_process_group(backend, timeout):
    """Join the other ranks. `timeout` seconds bounds a gloo collective, and how long NCCL's
    watchdog lets an nccl one wait before it aborts the process."""
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    except dist.DistError as e:
        cause = str(e).strip().splitlines()[0]
        sys.exit(f"error: the ranks did not meet within {timeout} s ({cause})")


def collective(function, tensor, **kwargs):
    """`function(tensor, **kwargs)`, a collective in place. Under gloo, a lost or late rank ends
    this one with exit status 1 and one line (nccl's watchdog aborts the process instead)."""
    try:
        function(tensor, **kwargs)
    except RuntimeError as e:
        # without gloo's "[source file:line] " prefix
        cause = str(e).strip().splitlines()[0].split("] ")[-1]
        what = f"rank {dist.get_rank()}: {function.__name__} failed"
        sys.exit(f"error: {what}, another rank died or hung past --dist-timeout ({cause})")


def all_reduce_gradients(grads, world_size):
    """Average the tensors `grads` over the ranks, in place, with one all-reduce of one flat
    buffer. Not DistributedDataParallel: it syncs only what runs through forward(), which PPO's
    loss does not call, and these small networks leave it nothing to overlap."""
    flat = torch.cat([grad.flatten() for grad in grads])
    collective(dist.all_reduce, flat)  # the sum over the ranks
    flat /= world_size
    for grad, averaged in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(averaged.view_as(grad))


def mean_over_ranks(values, world_size):
    """The mean of the tensor `values` over the ranks, the same on every rank."""
    if world_size == 1:
        return values
    total = values.clone()
    collective(dist.all_reduce, total)
    return total / world_size


def max_over_ranks(value, world_size, device):
    """The largest of the ranks' ints `value`, on every rank."""
    if world_size == 1:
        return value
    values = torch.tensor(value, device=device)
    collective(dist.all_reduce, values, op=dist.ReduceOp.MAX)
    return int(values)  # host sync, once per iteration


def parameter_spread(module, world_size):
    """The largest difference between two ranks' values of a parameter of `module`: 0.0 while
    the ranks stay in lockstep, as they must."""
    if world_size == 1:
        return 0.0
    flat = torch.cat([parameter.detach().flatten() for parameter in module.parameters()])
    highest, lowest = flat.clone(), flat.clone()
    collective(dist.all_reduce, highest, op=dist.ReduceOp.MAX)
    collective(dist.all_reduce, lowest, op=dist.ReduceOp.MIN)
    return float((highest - lowest).max())


def make_learner(args, n_obs, n_act, device, world_size=1):
    """PPO's agent, optimizer and step functions on `device`. With `world_size` > 1, in a process
    group started before, every rank starts from rank 0's weights and the update averages the
    gradients over the ranks."""
    agent = Agent(n_obs, n_act, device=device)
    if world_size > 1:
        for parameter in agent.parameters():
            collective(dist.broadcast, parameter.data, src=0)
    # a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # fused: one kernel for all parameters; capturable: the only Adam torch records in a graph
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=args.cudagraphs
    )

    def loss_fn(mb):
        """The clipped-surrogate loss of a minibatch (a TensorDict) and its statistics."""
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb["obs"], mb["actions"])
        logratio = newlogprob - mb["logprobs"]
        ratio = logratio.exp()

        with torch.no_grad():
            # calculate approx_kl http://joschu.net/blog/kl-approx.html
            old_approx_kl = (-logratio).mean()
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

        mb_advantages = mb["advantages"]
        if args.norm_adv:
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

        # Policy loss
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        # Value loss
        newvalue = newvalue.view(-1)
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - mb["returns"]) ** 2
            v_clipped = mb["values"] + torch.clamp(
                newvalue - mb["values"], -args.clip_coef, args.clip_coef
            )
            v_loss_clipped = (v_clipped - mb["returns"]) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        else:
            v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
        stats = [pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]
        return loss, torch.stack(stats).detach()

    if args.compile:
        # the forward and backward; the gradients' averaging, the clip and Adam's step stay eager
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb):
        """One gradient step on a minibatch; its statistics."""
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
        if world_size > 1:
            all_reduce_gradients([p.grad for p in agent.parameters()], world_size)
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    # acting reads the weights through a copy that shares their memory, without autograd state
    agent_inference = Agent(n_obs, n_act, device=device)
    from_module(agent).data.to_module(agent_inference)
    return SimpleNamespace(
        agent=agent,
        optimizer=optimizer,
        policy=agent_inference.get_action_and_value,
        get_value=agent_inference.get_value,
        update=update,
    )


def main(args):
    rank, local_rank, world_size = process_layout(os.environ)
    check_args(args, world_size)
    device = rank_device(args.cuda, local_rank)
    backend = dist_backend(args, device)
    # each rank is the twin with its own seeds: global envs seed + rank * num_envs, ...
    args = replace(args, seed=args.seed + rank * args.num_envs)
    # seeds, run folder, wandb, signals: see the file's end
    run = Run(args, "ppo_continuous_action_distributed", rank, world_size)
    # what the saved agent was trained with
    saved_obs_rms = run.saved_model["obs_rms"] if args.eval_model else None
    videos = None if args.eval_model else run.videos
    envs = make_envs(
        args.env_id, args.num_envs, args.seed, args.gamma, videos, obs_rms=saved_obs_rms
    )
    # every input is checked: from here on, each rank waits for the others at most --dist-timeout
    if world_size > 1:
        start_process_group(backend, args.dist_timeout)
        seeds = f"{args.seed}..{args.seed + args.num_envs - 1}"
        where = f"(local rank {local_rank}, pid {os.getpid()}) on {device} with {backend}"
        print(f"rank {rank} of {world_size} {where}: envs seeded {seeds}", file=sys.stderr)

    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(envs.single_action_space.shape))
    learner = make_learner(args, n_obs, n_act, device, world_size)
    agent, policy, update = learner.agent, learner.policy, learner.update

    def evaluate_agent(episodes, videos):  # the Gaussian's mean
        obs_rms = model["obs_rms"]
        eval_envs = make_envs(args.env_id, 1, args.seed, args.gamma, videos, episodes, obs_rms)
        return evaluate(agent.actor_mean, eval_envs, episodes, args.seed, device)

    if args.eval_model:  # one process, checked
        model = run.saved_model
        agent.load_state_dict(model["agent"])
        envs.close()
        run.finish(device, model, evaluate_agent, world_size=1, parameter_spread=0.0)
        return

    compute_gae = gae
    if args.compile:
        # GAE is one small graph per rollout; batch-1 acting gains from compile
        compute_gae = torch.compile(gae, fullgraph=True)
        policy = torch.compile(policy)
    if args.cudagraphs:
        # the first `warmup - 1` calls run as they are (Adam creates its state; a compiled function
        # compiles once more for it), the next records a CUDA graph, later calls replay it
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    def to_tensor(array):  # what the envs return, as float32 on the device
        return torch.as_tensor(array, device=device, dtype=torch.float)

    # the rollout, [num_steps, num_envs, ...], in one TensorDict
    scalars = ("logprobs", "values", "rewards", "terminations", "truncations", "final_values")
    rollout = {key: torch.zeros(args.num_steps, args.num_envs, device=device) for key in scalars}
    rollout["obs"] = torch.zeros(args.num_steps, args.num_envs, n_obs, device=device)
    rollout["actions"] = torch.zeros(args.num_steps, args.num_envs, n_act, device=device)
    rollout = TensorDict(rollout, batch_size=[args.num_steps, args.num_envs], device=device)

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = to_tensor(next_obs)
    # one rank's rollout; all ranks together step world_size times more
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // (batch_size * world_size)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        return dict(learner=learner, envs=(envs, next_obs))

    iterations = run.resume(training_state(), range(1, num_iterations + 1))
    global_step = run.steps  # 0 unless resumed
    pbar = tqdm.tqdm(iterations, disable=rank != 0)
    for iteration in pbar:
        if iteration == args.measure_burnin + 1:
            run.start_clock(global_step)  # sps counts from here: compile and warm-up are behind
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            # in place: no recompile
            learner.optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs * world_size
            rollout["obs"][step] = next_obs
            with torch.no_grad():
                action, logprob, _, value = policy(next_obs)
            rollout["values"][step] = value.flatten()
            rollout["actions"][step] = action
            rollout["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            run.log_episodes(global_step, finished_episodes(infos))
            rollout["rewards"][step] = to_tensor(reward)
            rollout["terminations"][step] = to_tensor(terminations)
            rollout["truncations"][step] = to_tensor(truncations)
            if truncations.any():
                # the value of the state each truncated episode was cut at (gae reads it only there)
                final_obs = to_tensor(true_next_obs(next_obs, infos))
                with torch.no_grad():
                    rollout["final_values"][step] = learner.get_value(final_obs).flatten()
            next_obs = to_tensor(next_obs)

        # advantages, bootstrapped from the value of the obs after the rollout
        with torch.no_grad():
            next_value = learner.get_value(next_obs).flatten()
        keys = ("rewards", "values", "final_values", "terminations", "truncations")
        advantages, returns = compute_gae(
            **rollout.select(*keys),
            next_value=next_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
        )
        b = rollout.select("obs", "actions", "logprobs", "values").flatten(0, 1)
        b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()

        # update
        for _epoch in range(args.update_epochs):
            for mb_inds in torch.randperm(batch_size, device=device).split(minibatch_size):
                stats = update(b[mb_inds])
            # so that every rank takes the same early-stop decision
            stats = mean_over_ranks(stats, world_size)
            # host sync, once per epoch
            if args.target_kl is not None and stats[4] > args.target_kl:
                break

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        metrics = dict(zip(names, stats), explained_variance=explained_var)
        run.log_progress(pbar, global_step, metrics)
        run.steps = global_step
        # torchrun forwards a Ctrl-C or SIGTERM to every rank, each at its own moment: all stop here
        # (a signal that comes after this all-reduce waits for the next iteration's)
        signum = max_over_ranks(run.stop_signal, world_size, device)
        run.checkpoint(iteration, training_state, signum)  # when due, on a signal, at the end
        if signum:
            run.stop_signal = run.stop_signal or signum
            break
        if run.diverged:  # on every rank at once: the losses it checks are all-reduced, the same
            break

    spread = parameter_spread(agent, world_size)
    if world_size > 1:
        dist.destroy_process_group()
    # the observation normalization (the first env's) is part of the policy
    rms = envs.envs[0].get_wrapper_attr("obs_rms")
    obs_rms = {key: torch.as_tensor(getattr(rms, key)) for key in ("mean", "var", "count")}
    model = {"agent": agent.state_dict(), "obs_rms": obs_rms}
    envs.close()
    if rank > 0:  # rank 0 alone saves, evaluates and reports
        sys.exit(3 if run.diverged else 128 + run.stop_signal if run.stop_signal else 0)
    run.finish(device, model, evaluate_agent, world_size=world_size, parameter_spread=spread)


# ==================================================================================================
# Run plumbing, the single-process scripts' with ranks: flag errors, the run folder and summary,
# wandb, Ctrl-C and SIGTERM, divergence, checkpoints, save, load, evaluation. `check_args` is this
# script's own.


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


def check_args(args, world_size):
    """Flag values that make no sense: one line naming the flag and exit status 2."""
    # nan passes every comparison below; past 1e30 float32 overflows
    for flag, value in vars(args).items():
        if isinstance(value, float) and not abs(value) <= 1e30:
            name = flag.replace("_", "-")
            fail(f"--{name} must be a finite number, at most 1e30 in size, got {value}")
    # numpy's seeds are below 2**32, envpool's below 2**31
    if not 0 <= args.seed < 2**31 or args.measure_burnin < 0:
        fail(
            f"--seed must be in [0, 2**31) and --measure-burnin >= 0; got {args.seed} and "
            f"{args.measure_burnin}"
        )
    positive = "total_timesteps num_envs num_steps num_minibatches update_epochs learning_rate"
    for flag in positive.split() + ["dist_timeout", "clip_coef", "max_grad_norm", "target_kl"]:
        value = getattr(args, flag)
        if value is not None and value <= 0:  # --target-kl None: off
            fail(f"--{flag.replace('_', '-')} must be positive, got {value}")
    batch_size = args.num_steps * args.num_envs
    if args.total_timesteps < batch_size * world_size:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one rollout of all ranks "
            f"({world_size})"
        )
    if batch_size % args.num_minibatches or batch_size < 2 * args.num_minibatches:
        fail(
            f"--num-minibatches must split --num-steps x --num-envs ({batch_size}) into equal "
            "parts of 2 or more"
        )
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail(
            "--cudagraphs needs a CUDA device and none is available (run without it, or with "
            "--compile)"
        )
    if world_size > 1 and (args.cudagraphs or args.eval_model):
        fail(
            f"--cudagraphs and --eval-model run in one process, not in {world_size} ranks (run "
            "without torchrun)"
        )


class Run:
    """Everything around training: seeds, `runs/<run_name>/`, wandb, signals, checkpoints, the
    progress bar, the summary; rank 0 alone keeps the folder, wandb and the messages. A first
    Ctrl-C or SIGTERM sets `stop_signal` and a non-finite loss sets `diverged`: the loop stops
    after its step."""

    VARIANTS = r"_(torchcompile|cpu|distributed|ray|async|seeds)$"  # one algorithm, many scripts
    # flags that a resumed run may change: they do not change what is trained
    FREE_FLAGS = ("total_timesteps", "track", "wandb_project_name", "wandb_entity", "cuda")
    FREE_FLAGS += ("capture_video", "save_model", "eval_episodes", "measure_burnin")
    FREE_FLAGS += ("checkpoint_minutes", "resume", "run_name", "dist_backend", "dist_timeout")

    def __init__(self, args, script, rank, world_size):
        if args.eval_episodes < 0 or (args.eval_model and args.eval_episodes == 0):
            n = args.eval_episodes
            fail(f"--eval-episodes must be >= 0, and > 0 with --eval-model, got {n}")
        if args.checkpoint_minutes < 0 or (args.resume and args.eval_model):
            fail("--checkpoint-minutes must be >= 0, and --resume cannot go with --eval-model")
        folder = args.run_name
        if folder is not None and (os.sep in folder or folder in ("", ".", "..")):
            fail(f"--run-name must name one folder under runs/, got {folder!r}")
        self.args, self.script, self.rank, self.world_size = args, script, rank, world_size
        self.saved_model = self.load_model(args.eval_model) if args.eval_model else None
        self.name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.name = (args.run_name or self.name).replace(":", "_")
        self.dir = os.path.join("runs", self.name)
        self.saved = self.load_checkpoint()  # None unless resumed; its folder becomes the run's
        self.videos = self.video_folder() if args.capture_video and rank == 0 else None
        if rank == 0:
            os.makedirs(self.dir, exist_ok=True)
        self.wandb = None
        if args.track and rank == 0:
            self.wandb = __import__("wandb")  # only with --track
            self.wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                config=vars(args),
                name=self.name,
                id=self.saved and self.saved["wandb_id"],  # a resumed run logs to the same run
                resume="allow",
            )
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        self.returns = deque(maxlen=20)  # the last 20 episodic returns
        self.curve = []  # [step, seconds, return] of every episode
        self.start_time, self.measure_start, self.measure_step = time.time(), None, 0
        self.steps, self.stop_signal, self.diverged = 0, 0, None
        self.resumes = []
        self.next_checkpoint = time.time() + 60 * (args.checkpoint_minutes or float("inf"))
        self.envs_restored = False  # by `resume`, where the checkpoint holds them
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame):
        self.stop_signal = signum
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second signal stops at once
            signal.signal(signum, signal.SIG_DFL)

    def load_model(self, path):
        algorithm = re.sub(self.VARIANTS, "", self.script)
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            saved_by, trained = saved["script"], dict(saved["args"])
        except Exception as e:
            fail(f"--eval-model {path} is not a model saved by these scripts ({e!r})")
        if re.sub(self.VARIANTS, "", saved_by) != algorithm:
            fail(f"--eval-model {path} was saved by {saved_by}, not by a script of {algorithm}")
        if trained.get("env_id") != self.args.env_id:
            fail(f"--eval-model {path} was trained with --env-id {trained.get('env_id')}")
        return saved["model"]

    def load_checkpoint(self):
        """The checkpoint that --resume names (a file or a run folder), checked against the
        flags and the number of ranks."""
        args, own = self.args, os.path.join(self.dir, "checkpoint.pt")
        if args.resume is None and args.run_name and os.path.exists(own):
            fail(f"{own} exists: --resume auto continues that run, or choose another --run-name")
        if args.resume == "auto" and not args.run_name:
            fail("--resume auto needs --run-name, the folder under runs/ to continue")
        if args.resume is None or (args.resume == "auto" and not os.path.exists(own)):
            return None
        path = own if args.resume == "auto" else args.resume
        path = os.path.join(path, "checkpoint.pt") if os.path.isdir(path) else path
        try:
            saved = torch.load(path, map_location="cpu", weights_only=False)
            saved_by, trained, ranks = saved["script"], saved["args"], len(saved["ranks"])
        except Exception as e:
            fail(f"--resume {path} is not a checkpoint of these scripts ({e!r})")
        if saved_by != self.script:
            fail(f"--resume {path} was written by {saved_by}, not {self.script}")
        if ranks != self.world_size:
            fail(f"--resume {path} was trained by {ranks} ranks, not {self.world_size}")
        own_seed = args.seed - self.rank * args.num_envs  # rank 0's, the one the checkpoint keeps
        for flag, value in (vars(args) | dict(seed=own_seed)).items():
            if flag not in self.FREE_FLAGS and trained.get(flag) != value:
                fail(f"--resume {path} trained with --{flag.replace('_', '-')} {trained.get(flag)}")
        if saved["final"] and args.total_timesteps <= trained["total_timesteps"]:
            print(f"{path}: the run finished at step {saved['step']}; nothing to resume")
            sys.exit(0)
        self.dir = os.path.dirname(os.path.abspath(path))
        self.name = os.path.basename(self.dir)
        return saved

    def resume(self, state, iterations):
        """Copy the checkpoint's training state into `state` (in place) and its counters, curve and
        generators into the run; returns the part of `iterations` left to run."""
        saved, self.saved, self.iterations = self.saved, None, iterations  # the buffer once
        if saved is None:
            return iterations
        generators, envs = saved["ranks"][self.rank]  # this rank's own
        self.restore(state, saved["state"] | dict(envs=envs), self.args.seed + saved["step"])
        python, numpy, cpu, cuda = generators
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if len(cuda) == torch.cuda.device_count() > 0:  # on as many GPUs
            torch.cuda.set_rng_state_all(cuda)
        self.steps, self.curve = saved["step"], saved["curve"]
        self.returns.extend(saved["returns"])
        self.start_time = time.time() - saved["wall_s"]
        resumed = dict(step=self.steps, fresh_episodes=not self.envs_restored)
        self.resumes = saved["resumes"] + [resumed]
        self.start_clock(self.steps)
        return range(saved["iteration"], iterations.stop)

    def checkpoint(self, iteration, state, stop_signal):
        """After `iteration`, when due, on the first signal the ranks agreed on (`stop_signal`)
        and at the end: `state()`, the counters and every rank's generators and envs to
        checkpoint.pt, which rank 0 writes to a temporary file and renames. Every rank calls it
        after each iteration; the learner, the same on every rank, is rank 0's."""
        final = iteration + 1 == self.iterations.stop
        due = [time.time() > self.next_checkpoint]
        if self.world_size > 1:  # each rank has its own clock: rank 0's decides
            collective(dist.broadcast_object_list, due, src=0)
        if self.diverged or not (final or stop_signal or due[0]):
            return
        self.next_checkpoint = time.time() + 60 * (self.args.checkpoint_minutes or float("inf"))
        state = state()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        generators = (random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)
        own = (generators, self.state_of(state.pop("envs")))
        ranks = [own]
        if self.world_size > 1:  # every rank's, on rank 0
            ranks = [None] * self.world_size if self.rank == 0 else None
            collective(dist.gather_object, own, object_gather_list=ranks, dst=0)
        if self.rank > 0:
            return
        saved = dict(script=self.script, args=vars(self.args), iteration=iteration + 1)
        saved |= dict(step=self.steps, final=final, curve=self.curve, returns=list(self.returns))
        saved |= dict(wall_s=time.time() - self.start_time, resumes=self.resumes)
        saved |= dict(wandb_id=self.wandb and self.wandb.run.id, ranks=ranks)
        path = os.path.join(self.dir, "checkpoint.pt")
        torch.save(saved | dict(state=self.state_of(state)), path + ".tmp")
        os.replace(path + ".tmp", path)

    def state_of(self, obj):
        """What `restore` puts back: state dicts, tensors, and for (envs, obs) the envs' wrappers
        and envs pickled but their functions, which the same flags make again, or None where they
        cannot be (a video recorder)."""
        if hasattr(obj, "state_dict"):
            return obj.state_dict()
        if isinstance(obj, SimpleNamespace):
            obj = vars(obj)
        if isinstance(obj, dict):  # what has a state: no functions
            kept = {k: v for k, v in obj.items() if hasattr(v, "state_dict") or not callable(v)}
            return {k: self.state_of(v) for k, v in kept.items()}
        if isinstance(obj, tuple):  # (envs, obs)
            # between the layers, and how to make them
            links = ("env", "envs", "env_fns", "_saved_kwargs")
            layers = [
                {k: v for k, v in vars(x).items() if k not in links and not callable(v)}
                for x in self.layers(obj)
            ]
            try:
                envs = pickle.dumps(layers)
            except Exception:  # an env that renders for a video recorder holds its screen
                envs = None
            return (envs, *(self.state_of(x) for x in obj[1:]))
        return obj.to("cpu", copy=True)  # a rank's observations travel to rank 0

    def restore(self, obj, saved, seed):
        """`saved` into `obj`, in place; envs that were not saved start fresh episodes, seeded with
        `seed`."""
        if isinstance(obj, torch.optim.Optimizer):  # a tensor lr in place: a CUDA graph reads it
            rates = [group["lr"] for group in obj.param_groups]
            obj.load_state_dict(saved)
            for group, rate in zip(obj.param_groups, rates):
                if isinstance(rate, torch.Tensor):
                    group["lr"] = rate.copy_(group["lr"])
        elif hasattr(obj, "load_state_dict"):
            obj.load_state_dict(saved)
        elif isinstance(obj, (dict, SimpleNamespace)):
            items = obj.items() if isinstance(obj, dict) else vars(obj).items()
            for key, value in items:
                if key in saved:
                    self.restore(value, saved[key], seed)
        elif isinstance(obj, tuple) and saved[0] is None:  # fresh episodes
            self.restore(obj[1], obj[0].reset(seed=seed)[0], seed)
        elif isinstance(obj, tuple):
            for layer, attributes in zip(self.layers(obj), pickle.loads(saved[0])):
                vars(layer).update(attributes)
            for x, value in zip(obj[1:], saved[1:]):
                self.restore(x, value, seed)
            self.envs_restored = True
        else:
            with torch.no_grad():
                obj.copy_(torch.as_tensor(saved))

    @staticmethod
    def layers(envs_obs):
        """The vector env, then each env's wrappers and the env itself, outermost first."""
        layers = [envs_obs[0]]
        for env in envs_obs[0].envs:
            layers.append(env)
            while hasattr(env, "env"):
                env = env.env
                layers.append(env)
        return layers

    def video_folder(self):
        """runs/<run_name>/videos, once we know that this machine can record the env."""
        os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders without a display
        # torch's compiler loads triton's LLVM (CUDA builds); after Mesa's EGL has loaded its own,
        # that crashes the process, so it comes first
        __import__("torch._dynamo")
        try:
            __import__("moviepy")  # RecordVideo's writer
            env = gym.make(self.args.env_id, render_mode="rgb_array")
            env.reset(seed=0)
            assert isinstance(env.render(), np.ndarray), "no frame"
        except Exception as e:
            fail(f"--capture-video: {self.args.env_id} cannot record video here ({e!r})")
        videos = os.path.join(self.dir, "videos")
        # a resumed run's recorder counts episodes from 0 again: a folder of its own keeps the first
        return os.path.join(videos, f"resumed-{self.saved['step']}") if self.saved else videos

    def start_clock(self, global_step):
        self.measure_start, self.measure_step = time.time(), global_step

    def sps(self, global_step, now=None):
        if self.measure_start:  # None before the clock starts
            seconds = (now or time.time()) - self.measure_start
            return (global_step - self.measure_step) / seconds

    def log_episodes(self, global_step, returns):
        for episodic_return in returns:
            self.returns.append(episodic_return)
            self.curve.append([global_step, time.time() - self.start_time, episodic_return])
            if self.wandb:
                self.wandb.log({"charts/episodic_return": episodic_return}, step=global_step)

    def log_progress(self, pbar, global_step, metrics):
        """Show sps and the mean return; log `metrics` to wandb. A loss or `weight_norm` that is not
        finite diverges the run."""
        tensors = {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)}
        values = torch.stack([*tensors.values()]).tolist() if tensors else []  # host sync
        metrics = metrics | dict(zip(tensors, values))
        sps = self.sps(global_step) or 0.0
        return_mean = np.mean(self.returns) if self.returns else float("nan")
        pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
        if self.wandb:
            losses = {f"losses/{k}": float(v) for k, v in metrics.items()}
            self.wandb.log(losses | {"charts/SPS": sps}, step=global_step)
        for name, value in metrics.items():
            if ("loss" in name or name == "weight_norm") and not np.isfinite(value):
                self.diverge(global_step, name, value)

    def diverge(self, step, metric, value):
        if self.diverged:
            return
        rates = [(k, v) for k, v in vars(self.args).items() if k.endswith(("lr", "learning_rate"))]
        rates = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in rates if isinstance(v, float))
        line = f"error: diverged at step {step}: {metric} is {value}; maybe too large: {rates}"
        if self.rank == 0:  # every rank checks the same all-reduced losses
            tqdm.tqdm.write(line, file=sys.stderr)
        self.diverged = dict(step=step, metric=metric, value=str(value))

    def finish(self, device, model, evaluate, **extra):
        """Save `model` (--save-model), write summary.json, play --eval-episodes with
        `evaluate(episodes, videos)`, print the SUMMARY line. A diverged run saves and plays
        nothing and exits 3; a stopped one exits as a shell reports a signal (130 or 143)."""
        args, end_time = self.args, time.time()
        weights = [w for v in model.values() for w in (v.values() if isinstance(v, dict) else [v])]
        weight_sum = float(sum(w.double().sum() for w in weights))  # host sync, once
        if not np.isfinite(weight_sum):
            self.diverge(self.steps, "weight_sum", weight_sum)
        if self.returns and not np.isfinite(np.mean(self.returns)):
            self.diverge(self.steps, "return_mean", np.mean(self.returns))
        model_file = None
        if args.save_model and not self.diverged:  # torch.load(model_file, weights_only=True)
            model_file = os.path.abspath(os.path.join(self.dir, f"{self.script}.pt"))
            saved = {"script": self.script, "args": vars(args), "model": model}
            torch.save(saved, model_file + ".tmp")
            os.replace(model_file + ".tmp", model_file)
        wall_s = end_time - self.start_time
        summary = dict(
            script=self.script,
            env_id=args.env_id,
            seed=args.seed,
            device=str(device),
            compile=getattr(args, "compile", False),
            cudagraphs=getattr(args, "cudagraphs", False),
            num_envs=args.num_envs,
            total_timesteps=self.steps,
            sps=self.sps(self.steps, end_time),
            sps_wall=self.steps / wall_s,
            wall_s=wall_s,
            torch_version=torch.__version__,
            episodes=len(self.curve),
            return_mean=float(np.mean(self.returns)) if self.returns else None,
            interrupted=self.stop_signal > 0,
            resumes=self.resumes,
            model_file=model_file,
            eval_returns=[],
            eval_return_mean=None,
        )
        summary |= extra  # a script's own fields, which may override the ones above
        if args.eval_episodes and not self.diverged:
            self.write_summary(summary)  # kept if a second signal kills the evaluation
            returns = evaluate(args.eval_episodes, self.videos)
            summary |= dict(eval_returns=returns, eval_return_mean=float(np.mean(returns)))
        print("SUMMARY " + json.dumps(self.write_summary(summary)), flush=True)
        if self.wandb:
            self.wandb.finish()
        if self.diverged or self.stop_signal:
            sys.exit(3 if self.diverged else 128 + self.stop_signal)

    def write_summary(self, summary):
        """summary.json, written atomically, non-finite numbers as strings; returns what the SUMMARY
        line prints."""
        text = json.dumps(summary | {"diverged": self.diverged, "curve": self.curve})
        summary = json.loads(text, parse_constant=lambda c: str(float(c)))
        curve, path = summary.pop("curve"), os.path.join(self.dir, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary | {"curve": curve}, f)
        os.replace(path + ".tmp", path)
        return summary | {"summary_file": os.path.abspath(path)}


def evaluate(act, envs, episodes, seed, device):
    """The returns of `episodes` episodes played on `envs` (one env, closed after) with `act(obs) ->
    actions`."""
    obs, _ = envs.reset(seed=seed)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device, dtype=torch.float))
        obs, _, _, _, infos = envs.step(actions.cpu().numpy())
        returns += finished_episodes(infos)
    envs.close()
    return returns[:episodes]


if __name__ == "__main__":
    main(tyro.cli(Args))
