"""Proximal Policy Optimization for continuous actions, data-parallel over N processes with torch.distributed: the
optimized twin ppo_continuous_action_torchcompile.py, scaled out.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps, 2048 steps per rollout).

    python leanrl/ppo_continuous_action_distributed.py --compile                                    # one process
    torchrun --standalone --nproc_per_node 2 leanrl/ppo_continuous_action_distributed.py --compile  # 2 on this machine
    # 2 machines with 8 GPUs each: run on each, with --node_rank 0 on the first and 1 on the second
    torchrun --nnodes 2 --nproc_per_node 8 --node_rank 0 --rdzv_backend static --rdzv_endpoint 10.0.0.1:29500 \
        leanrl/ppo_continuous_action_distributed.py --compile

Same algorithm, flags and loop as the twin; what changes is that WORLD_SIZE processes (ranks) run it together:
- torchrun sets RANK (the global rank), LOCAL_RANK (the rank on this machine) and WORLD_SIZE; the device is
  cuda:LOCAL_RANK and everything else is keyed by RANK (CleanRL's multi-GPU script keys the seed by LOCAL_RANK, which
  gives the ranks of two machines the same seeds and two rank 0s). Run without torchrun, it trains as one process;
- each rank steps its own `--num-envs` envs, seeded `seed + RANK * num_envs + i`: N ranks step the envs of one
  process with N x num_envs envs. Each env normalizes its observations and rewards with statistics of its own,
  as in the twin, so nothing about the normalization has to be shared between ranks (a saved model keeps rank 0's
  first env's statistics, as the twin keeps its first env's);
- rank 0's initial weights are broadcast to every rank; after each minibatch's backward, the gradients of all
  parameters are averaged over the ranks with one all-reduce of one flat buffer, before the clip and the Adam step,
  so every rank takes the same step and the weights stay identical without being sent again. Each rank shuffles its
  own rollout into `num_minibatches` minibatches, so one step learns from N minibatches, one of each rank: a
  minibatch of one process with N x num_envs envs, except that `--norm-adv` normalizes each rank's share with that
  share's statistics (with --no-norm-adv the steps equal one process's, to float rounding). We average
  the gradients by hand rather than with DistributedDataParallel: DDP synchronizes only what runs through the
  wrapped module's forward(), and PPO's loss calls get_action_and_value; and with ~10k parameters (one bucket) its
  overlap of communication with the backward pass would have nothing to overlap;
- `--total-timesteps` counts the steps of all ranks: the iterations, and with them the annealed learning rate, are
  the same on every rank without a message. The early stop on `--target-kl` and the stop after a Ctrl-C are agreed
  by all-reduces (once an epoch, once an iteration), so the ranks always run the same number of updates;
- rank 0 alone keeps the run folder, prints the bar and the SUMMARY (sps of all ranks together), logs to wandb,
  records videos, saves and evaluates; its episodes are the ones counted;
- every collective waits at most `--dist-timeout` seconds: a rank that dies or hangs ends the run with exit
  status 1 and one line naming the cause, not a wait forever;
- `--dist-backend`: nccl on CUDA, gloo on the CPU by default.

`--compile` compiles what the twin compiles (on a CPU the whole functional update; with more than one rank its two
halves, on each side of the all-reduce). `--cudagraphs` records the acting policy and the update of one process; with more than one rank it is refused (the
all-reduce would be recorded into the update's graph, which this script has not been run with). On a CPU each rank
uses one intra-op thread, as the twin does.

Each iteration collects `num_steps` vector steps, computes advantages with GAE, then runs `update_epochs`
epochs of `num_minibatches` clipped-surrogate steps; the learning rate falls linearly to 0 over the run. The env
chain is CleanRL's: clipped actions, normalized and clipped observations and rewards (the episode returns logged
are the raw ones). A truncated step bootstraps with gamma * V(final obs), as in the twin (its docstring says why).
"""

import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from torch.func import functional_call, grad_and_value


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
    """record videos of the first environment to runs/<run_name>/videos/ (and of every evaluation episode)"""
    save_model: bool = False
    """save the weights the policy needs, with the run's arguments, to runs/<run_name>/<script>.pt at the end"""
    eval_episodes: int = 0
    """after training, play this many episodes with the trained policy and report their mean return (0: none)"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes episodes instead of training"""
    measure_burnin: int = 3
    """iterations (rollout + update) excluded from `sps` (they compile and warm up)"""

    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total environment steps of the experiment, all ranks together"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments of each rank"""
    num_steps: int = 2048
    """the number of vector steps of each rollout (env steps per iteration: num_steps * num_envs)"""
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
    """stop an update's epochs early once the approximate KL exceeds this (off by default)"""

    compile: bool = False
    """compile GAE, the acting policy and the update (its loss on CUDA, all of it on a CPU) with `torch.compile`"""
    cudagraphs: bool = False
    """record the acting policy and the update as CUDA graphs (needs a CUDA device; one process only)"""
    dist_backend: str | None = None
    """the torch.distributed backend under torchrun, nccl or gloo (default: nccl on CUDA, gloo on the CPU)"""
    dist_timeout: float = 120.0
    """seconds a collective may wait for the other ranks; past it the run ends with an error naming the cause"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def process_layout(environ):
    """(rank, local_rank, world_size) from torchrun's RANK, LOCAL_RANK and WORLD_SIZE in `environ`: the global rank,
    the rank on this machine (it picks the GPU) and the number of processes; (0, 0, 1) without torchrun."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    if not any(name in environ for name in names):
        return 0, 0, 1
    try:
        rank, local_rank, world_size = (int(environ[name]) for name in names)
    except (KeyError, ValueError):
        fail(f"RANK, LOCAL_RANK and WORLD_SIZE must all be set, as integers (got {[environ.get(n) for n in names]}): launch with torchrun")
    if not (0 <= rank < world_size and 0 <= local_rank <= rank):
        fail(f"RANK {rank}, LOCAL_RANK {local_rank} and WORLD_SIZE {world_size} do not fit together")
    return rank, local_rank, world_size


def rank_device(cuda, local_rank):
    """The device of the rank `local_rank` of this machine: its own GPU if `cuda` and there is one, else the CPU."""
    if not (cuda and torch.cuda.is_available()):
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        fail(f"LOCAL_RANK {local_rank} has no GPU: this machine has {torch.cuda.device_count()} (lower --nproc_per_node)")
    torch.cuda.set_device(local_rank)  # nccl's own work (barriers, its streams) goes to this rank's GPU, not GPU 0
    return torch.device("cuda", local_rank)


def dist_backend(args, device):
    """The backend named by --dist-backend, or the device's default: nccl on CUDA, gloo on the CPU."""
    backend = args.dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend not in ("nccl", "gloo") or not dist.is_backend_available(backend):
        fail(f"--dist-backend {backend!r} is not available here (nccl needs a CUDA build, gloo works everywhere)")
    if backend == "nccl" and device.type != "cuda":
        fail(f"--dist-backend nccl needs a CUDA device and this rank runs on {device} (use gloo)")
    return backend


def check_args(args, world_size):
    for flag in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.total_timesteps < args.num_steps * args.num_envs * world_size:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout of all ranks (--num-steps x --num-envs x {world_size} ranks)")
    if (args.num_steps * args.num_envs) % args.num_minibatches != 0:
        fail(f"--num-steps x --num-envs ({args.num_steps * args.num_envs}) is not divisible by --num-minibatches {args.num_minibatches}")
    if args.num_steps * args.num_envs < 2 * args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} leaves minibatches of one sample (--num-steps x --num-envs too small)")
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.clip_coef <= 0 or args.max_grad_norm <= 0 or args.measure_burnin < 0:
        fail("--clip-coef and --max-grad-norm must be positive and --measure-burnin >= 0")
    if args.target_kl is not None and args.target_kl <= 0:
        fail(f"--target-kl must be positive, got {args.target_kl}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and none is available (run without it, or with --compile)")
    if args.cudagraphs and world_size > 1:
        fail(f"--cudagraphs runs in one process only, not in {world_size} ranks (use --compile)")
    if args.dist_timeout <= 0:
        fail(f"--dist-timeout must be positive, got {args.dist_timeout}")
    if args.eval_episodes < 0:
        fail(f"--eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.eval_model and args.eval_episodes == 0:
        fail("--eval-model needs --eval-episodes N, N > 0")
    if args.eval_model and world_size > 1:
        fail("--eval-model evaluates in one process: run it without torchrun")


def make_env(env_id, seed, gamma, video_dir=None, video_episodes=None):
    def thunk():
        if video_dir is None:
            env = gym.make(env_id)
        else:
            env = gym.make(env_id, render_mode="rgb_array")
            if video_episodes is None:  # training: gymnasium's schedule, episodes 0, 1, 8, 27, ..., then every 1000th
                env = gym.wrappers.RecordVideo(env, video_dir, name_prefix="train", disable_logger=True)
            else:  # evaluation: its first `video_episodes` episodes
                record = lambda episode: episode < video_episodes  # noqa: E731
                env = gym.wrappers.RecordVideo(env, video_dir, record, name_prefix="eval", disable_logger=True)
        if not isinstance(env.action_space, gym.spaces.Box):
            fail(f"--env-id {env_id!r} has a {type(env.action_space).__name__} action space; PPO here needs a Box")
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)  # before the normalization: it records the raw returns
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(env_id, num_envs, seed, gamma, video_dir=None, video_episodes=None):
    """A vector env in same-step autoreset mode: the step that ends an episode returns the reset obs and puts the
    true final obs in `info["final_obs"]`; with `video_dir`, the first env records videos there (the first
    `video_episodes` episodes if given). A bad id or a non- Box action space exits with status 2."""
    if env_id not in gym.registry:
        fail(f"--env-id {env_id!r} is not a registered gymnasium environment")
    try:
        videos = [video_dir] + [None] * (num_envs - 1)  # the first env alone records
        thunks = [make_env(env_id, seed + i, gamma, videos[i], video_episodes) for i in range(num_envs)]
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except gym.error.Error as e:
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    return envs


def obs_normalizations(envs):
    """The NormalizeObservation wrapper of each env of `envs` (each env normalizes with statistics of its own)."""
    wrappers = []
    for env in envs.envs:
        while not isinstance(env, gym.wrappers.NormalizeObservation):
            env = env.env
        wrappers.append(env)
    return wrappers


def obs_rms_of(envs):
    """The first env's observation normalization statistics, as tensors (what a saved model needs to act)."""
    rms = obs_normalizations(envs)[0].obs_rms
    return {"mean": torch.as_tensor(rms.mean), "var": torch.as_tensor(rms.var), "count": torch.tensor(float(rms.count))}


def obs_rms_to(envs, stats, update=True):
    """Every env of `envs` normalizes with the statistics `stats`; `update=False` freezes them there."""
    for wrapper in obs_normalizations(envs):
        wrapper.obs_rms.mean = stats["mean"].numpy().copy()
        wrapper.obs_rms.var = stats["var"].numpy().copy()
        wrapper.obs_rms.count = float(stats["count"])
        wrapper.update_running_mean = update


def finished_episodes(infos):
    """The returns of every episode that ended on this step (several envs can finish on the same step)."""
    if "final_info" not in infos or "episode" not in infos["final_info"]:
        return []
    final_info = infos["final_info"]
    return final_info["episode"]["r"][final_info["_episode"]].tolist()


def true_next_obs(next_obs, infos):
    """`next_obs` with the true final observation of each episode that ended on this step: in same-step
    autoreset mode `next_obs` already holds the reset observation there. Bootstrapping a truncated episode
    needs the state where it was cut, not the first state of the next episode."""
    real_next_obs = next_obs.copy()
    if "_final_obs" in infos:
        for idx in np.flatnonzero(infos["_final_obs"]):
            real_next_obs[idx] = infos["final_obs"][idx]
    return real_next_obs


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
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

    def forward(self, x, action=None):  # what `torch.func.functional_call` runs (the CPU fast path)
        return self.get_action_and_value(x, action)

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        if action is None:
            action = action_mean + action_std * torch.randn_like(action_mean)
        # Normal(action_mean, action_std).log_prob(action) and .entropy(), written out
        log_prob = -((action - action_mean) ** 2) / (2 * action_std**2) - action_logstd - 0.5 * math.log(2 * math.pi)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + action_logstd
        return action, log_prob.sum(1), entropy.sum(1), self.critic(x)


def gae(rewards, values, next_value, final_values, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation; returns (advantages, returns), both [num_steps, num_envs].

    Every input is [num_steps, num_envs] but `next_value` [num_envs], the value of the observation after the
    last step. `terminations[t]` / `truncations[t]` (0 or 1) say the episode ended at step t by reaching a
    terminal state / by being cut off; `final_values[t]` is the value of the true final observation of a
    truncated episode (read only where `truncations[t]` is 1 and `terminations[t]` is 0)."""
    dones = torch.maximum(terminations, truncations)
    # the value of the state after step t: the next step's value inside an episode; at an episode's end, the
    # value of its true final observation if it was cut off and 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1} with c_t = gamma * lambda * (1 - done_t), stopped at the end of an episode.
    # Solved by doubling: after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of A_t and
    # coefs[t] is the product of their c's, so ceil(log2(num_steps)) rounds of a few vectorized ops replace the
    # num_steps-long loop, and the compiled graph stays small where an unrolled loop would take minutes to compile.
    # The same sums, added in another order.
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat([advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]])
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


def collective(function, tensor, **kwargs):
    """The torch.distributed collective `function` (all_reduce, broadcast) on `tensor`, in place. A rank that died, or that
    did not join within the process group's timeout, ends this one with exit status 1 and one line naming the cause."""
    try:
        function(tensor, **kwargs)
    except RuntimeError as e:  # what gloo and nccl raise for a lost peer or a timeout
        cause = str(e).strip().splitlines()[0].split("] ")[-1]  # without gloo's "[source file:line] " prefix
        sys.exit(f"error: rank {dist.get_rank()}: {function.__name__} failed, another rank died or hung past --dist-timeout ({cause})")


def all_reduce_gradients(grads, world_size):
    """Average the gradient tensors `grads` over the ranks in place: one all-reduce of all of them in one flat buffer
    (one collective per minibatch, not one per parameter)."""
    flat = torch.cat([grad.flatten() for grad in grads])
    collective(dist.all_reduce, flat)  # the sum over the ranks, the same on every rank
    flat /= world_size
    for grad, averaged in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(averaged.view_as(grad))


def make_loss(get_action_and_value, args):
    """PPO's loss on a minibatch (a TensorDict) and its statistics, for the agent's `get_action_and_value`."""

    def loss_fn(mb):
        _, newlogprob, entropy, newvalue = get_action_and_value(mb["obs"], mb["actions"])
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
            v_clipped = mb["values"] + torch.clamp(newvalue - mb["values"], -args.clip_coef, args.clip_coef)
            v_loss_clipped = (v_clipped - mb["returns"]) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        else:
            v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
        return loss, torch.stack([pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]).detach()

    return loss_fn


def make_update(agent, optimizer, args, compile_loss=False, world_size=1):
    """One clipped-surrogate gradient step on a minibatch (a TensorDict); returns its statistics.
    `compile_loss`: compile the forward and backward of the loss; the averaging over `world_size` ranks, the clip and
    the Adam step stay eager."""
    loss_fn = make_loss(agent.get_action_and_value, args)
    if compile_loss:
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb):
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
        if world_size > 1:
            all_reduce_gradients([p.grad for p in agent.parameters()], world_size)
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    return update


class Adam:
    """torch.optim.Adam's step (no weight decay, no amsgrad) written out on a dict of tensors, in place. Called inside
    a compiled update it becomes part of that update's graph; `torch.optim.Adam.step` would break the graph. The
    learning rate is a tensor in `param_groups`, as in torch.optim, so the loop anneals either optimizer alike."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.betas, self.eps = params, betas, eps
        self.param_groups = [{"lr": lr}]
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        # beta1**t and beta2**t as running products (tensors: nothing recompiles). Inductor inlines a power of a
        # step-count tensor into the CPU update kernel, once per vector of every parameter: 2-3x slower steps
        self.beta1_power, self.beta2_power = torch.ones((), device=lr.device), torch.ones((), device=lr.device)

    def step(self, grads):
        beta1, beta2 = self.betas
        self.beta1_power.mul_(beta1)
        self.beta2_power.mul_(beta2)
        bias_correction1, bias_correction2 = 1 - self.beta1_power, 1 - self.beta2_power
        for name, param in self.params.items():
            exp_avg, exp_avg_sq, grad = self.exp_avg[name], self.exp_avg_sq[name], grads[name]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq / bias_correction2).sqrt() + self.eps
            param.sub_(self.param_groups[0]["lr"] * (exp_avg / bias_correction1) / denom)


def clip_grad_norm(grads, max_norm):
    """`nn.utils.clip_grad_norm_` on a dict of gradients: all of them scaled down to a total norm of `max_norm`."""
    total_norm = torch.stack([g.pow(2).sum() for g in grads.values()]).sum().sqrt()
    clip_coef = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    return {name: g * clip_coef for name, g in grads.items()}


def make_functional_update(agent, lr, args, world_size=1):
    """The update of `make_update` written as a function of the parameters, for a CPU: `torch.func` takes the
    gradients, the clip and Adam are written out, so `torch.compile(fullgraph=True)` makes the whole update, from
    the forward pass to the parameters' step, one graph (autograd's `backward` and an optimizer's `step` would
    split it). The parameters are the agent's own tensors, updated in place. Returns the update and its Adam.
    With `world_size` > 1 the gradients are averaged over the ranks between the gradients and the step, eagerly, so
    the update compiles here as two graphs, one on each side of the all-reduce."""
    params = {name: p.data for name, p in agent.named_parameters()}
    optimizer = Adam(params, lr, eps=1e-5)

    def params_loss(params, mb):
        return make_loss(lambda obs, actions: functional_call(agent, params, (obs, actions)), args)(mb)

    def gradients(mb):
        grads, (loss, stats) = grad_and_value(params_loss, has_aux=True)(params, mb)
        return grads, stats

    def step(grads):
        optimizer.step(clip_grad_norm(grads, args.max_grad_norm))

    if world_size > 1:
        gradients, step = torch.compile(gradients, fullgraph=True), torch.compile(step, fullgraph=True)

    def update(mb):
        grads, stats = gradients(mb)
        if world_size > 1:
            all_reduce_gradients(list(grads.values()), world_size)
        step(grads)
        return stats

    return update, optimizer


def adam_options(cudagraphs):
    """Adam's flags in every variant. fused: one kernel for all parameters instead of a dozen ops per parameter.
    capturable when the step is recorded in a CUDA graph (`--cudagraphs`, compiled or not): torch refuses to record
    the step of an optimizer that is not."""
    return {"fused": True, "capturable": cudagraphs}


def cuda_graph(fn, compiled):
    """`fn` recorded as a CUDA graph: its first `warmup - 1` calls run as they are (the optimizers create their
    state), the next records the graph, later calls replay it. A compiled `fn` gets one more warm-up call, so that
    it has compiled for the optimizers' created state before the recording."""
    return CudaGraphModule(fn, warmup=3 if compiled else 2)


def cpu_fast_path(args, device):
    """The one choice made per device (README, "Where the time goes"). On a CPU, `--compile` compiles the functional
    update as one graph. On CUDA (and under `--cudagraphs`), the module update, whose loss compiles and which CUDA
    graphs replay."""
    return args.compile and not args.cudagraphs and device.type == "cpu"


def mean_over_ranks(values, world_size):
    """The mean of the tensor `values` over the ranks (one small all-reduce), the same on every rank."""
    if world_size == 1:
        return values
    total = values.clone()
    collective(dist.all_reduce, total)
    return total / world_size


def any_rank(flag, world_size, device):
    """True on every rank if `flag` is true on any: one small all-reduce, so that the ranks leave the loop together."""
    if world_size == 1:
        return flag
    flags = torch.tensor(float(flag), device=device)
    collective(dist.all_reduce, flags, op=dist.ReduceOp.MAX)
    return bool(flags)  # host sync, once per iteration


def parameter_spread(module, world_size):
    """The largest difference between two ranks' values of any parameter of `module` (two small all-reduces, once at
    the end of a run): 0.0 when the ranks stayed in lockstep, as they must."""
    if world_size == 1:
        return 0.0
    flat = torch.cat([parameter.detach().flatten() for parameter in module.parameters()])
    highest, lowest = flat.clone(), flat.clone()
    collective(dist.all_reduce, highest, op=dist.ReduceOp.MAX)
    collective(dist.all_reduce, lowest, op=dist.ReduceOp.MIN)
    return float((highest - lowest).max())


def broadcast_parameters(module):
    """Every rank's parameters of `module` become rank 0's, in place (acting copies that share their memory follow)."""
    for parameter in module.parameters():
        collective(dist.broadcast, parameter.data, src=0)


def start_process_group(backend, timeout):
    """Join the other ranks (torchrun's rendezvous); every collective of the group then waits at most `timeout` s."""
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    except dist.DistError as e:
        sys.exit(f"error: the ranks did not meet within {timeout} s ({str(e).strip().splitlines()[0]})")


def make_learner(args, n_obs, n_act, device, world_size=1):
    """PPO's agent, optimizer and step functions on `device`, as `main` runs them (tests build them here too);
    with `world_size` > 1 the update averages the gradients over that many ranks of a process group started before.
    Returns the agent, the optimizer and the functions (policy, get_value, update)."""
    agent = Agent(n_obs, n_act, device=device)
    if world_size > 1:
        broadcast_parameters(agent)  # every rank starts from rank 0's weights
    # the learning rate is a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    if cpu_fast_path(args, device):
        update, optimizer = make_functional_update(agent, lr, args, world_size)
    else:
        optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, **adam_options(args.cudagraphs))
        update = make_update(agent, optimizer, args, compile_loss=args.compile, world_size=world_size)
    # acting reads the agent's weights through a copy that shares their memory but has no autograd state
    agent_inference = Agent(n_obs, n_act, device=device)
    from_module(agent).data.to_module(agent_inference)
    policy = agent_inference.get_action_and_value
    get_value = agent_inference.get_value
    return agent, optimizer, (policy, get_value, update)


def write_summary(summary, run_dir):
    """Write the whole summary, learning curve included, to `run_dir/summary.json` (a temporary file, then renamed:
    a reader never sees half of it) and print it as one `SUMMARY` line without the curve, naming that file."""
    path = os.path.join(run_dir, "summary.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f)
    os.replace(path + ".tmp", path)
    line = {key: value for key, value in summary.items() if key != "curve"} | {"summary_file": os.path.abspath(path)}
    print("SUMMARY " + json.dumps(line), flush=True)


def check_rendering(env_id):
    """`--capture-video` needs frames drawn off-screen (MuJoCo through EGL, classic control through pygame) and
    moviepy to write them; without them the run exits with status 2 and the reason."""
    os.environ.setdefault("MUJOCO_GL", "egl")  # read when MuJoCo is first imported: no window, no display
    try:
        env = gym.make(env_id, render_mode="rgb_array")
        env.reset(seed=0)
        frame = env.render()
        env.close()
        import moviepy  # noqa: F401 (gymnasium's video recorder needs it)
    except Exception as e:
        fail(f"--capture-video: {env_id} cannot record video here ({type(e).__name__}: {e})")
    if not isinstance(frame, np.ndarray):
        fail(f"--capture-video: {env_id} rendered no frame")


def evaluate(act, envs, episodes, seed, device):
    """The returns of `episodes` episodes played on `envs` (one env) with `act(obs) -> actions`, in order."""
    obs, _ = envs.reset(seed=seed)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device, dtype=torch.float))
        obs, _, _, _, infos = envs.step(actions.cpu().numpy())
        returns += finished_episodes(infos)
    return returns[:episodes]


def stop_on_ctrl_c():
    """The first Ctrl-C asks the training loop to stop after the current iteration (rollout and update): the run then evaluates, saves and
    reports what it has, and exits with status 130. A second Ctrl-C stops at once."""
    stop = threading.Event()

    def first_ctrl_c(signum, frame):
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, first_ctrl_c)
    return stop


def save_model(path, script, args, model):
    """`model` (tensors by name) with the script's name and arguments, written to `path` atomically (a temporary
    file, then renamed) and loadable with `torch.load(path, weights_only=True)`."""
    torch.save({"script": script, "args": vars(args), "model": model}, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_model(path, script, env_id):
    """The `model` that `script` saved at `path` for `env_id`; a missing file, another script's file or another
    env's exits with status 2."""
    if not os.path.isfile(path):
        fail(f"--eval-model {path}: no such file")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        fail(f"--eval-model {path} is not a saved model ({type(e).__name__})")
    saved_by = saved.get("script") if isinstance(saved, dict) else None
    if saved_by != script:
        fail(f"--eval-model {path} was saved by {saved_by}, not by {script}")
    if saved["args"]["env_id"] != env_id:
        fail(f"--eval-model {path} was trained on {saved['args']['env_id']}: add --env-id {saved['args']['env_id']}")
    return saved["model"]


def main(args):
    rank, local_rank, world_size = process_layout(os.environ)
    check_args(args, world_size)
    device = rank_device(args.cuda, local_rank)
    backend = dist_backend(args, device)
    saved_model = load_model(args.eval_model, "ppo_continuous_action_distributed", args.env_id) if args.eval_model else None
    batch_size = args.num_envs * args.num_steps  # one rank's rollout; all ranks together step world_size times more
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = 0 if args.eval_model else args.total_timesteps // (batch_size * world_size)
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)  # summary.json, the model and the videos go here (rank 0's)
    stop = stop_on_ctrl_c()
    track = args.track and rank == 0  # rank 0 alone keeps the run folder, logs, records, saves and evaluates
    if rank == 0:
        os.makedirs(run_dir, exist_ok=True)
    videos = os.path.join(run_dir, "videos") if args.capture_video and rank == 0 else None
    if videos:
        check_rendering(args.env_id)
    seed = args.seed + rank * args.num_envs  # this rank's envs are the global envs seed .. seed + num_envs - 1
    envs = make_envs(args.env_id, args.num_envs, seed, args.gamma, None if args.eval_model else videos)
    if track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=run_name, save_code=True)
    if world_size > 1:  # every input is checked: from here on, each rank waits for the others at most --dist-timeout
        start_process_group(backend, args.dist_timeout)
        print(f"rank {rank} of {world_size} (local rank {local_rank}, pid {os.getpid()}) on {device} with {backend}: "
              f"envs seeded {seed}..{seed + args.num_envs - 1}", file=sys.stderr, flush=True)

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if device.type == "cpu":
        # every op here is tiny (batch 1 acting, batch 64 updates): waking a second thread costs more than it
        # saves, and on a shared CPU an oversubscribed thread pool can stall a step for milliseconds
        torch.set_num_threads(1)

    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(envs.single_action_space.shape))
    agent, optimizer, (policy, get_value, update) = make_learner(args, n_obs, n_act, device, world_size)
    if saved_model is not None:
        agent.load_state_dict(saved_model["agent"])
        obs_rms_to(envs, saved_model["obs_rms"], update=False)  # the normalization it was trained with
    compute_gae = gae
    if args.compile:
        # GAE is one small graph per rollout; on CUDA `make_update` compiles the loss, on a CPU the whole functional
        # update compiles; batch-1 acting gains from compile (README, `benchmarks.inference`)
        compute_gae = torch.compile(gae, fullgraph=True)
        policy = torch.compile(policy)
    if cpu_fast_path(args, device) and world_size == 1:  # with more ranks, make_functional_update compiles its parts
        update = torch.compile(update, fullgraph=True)
    if args.cudagraphs:
        policy = cuda_graph(policy, args.compile)
        update = cuda_graph(update, args.compile)

    # ALGO Logic: Storage setup, [num_steps, num_envs, ...], one TensorDict
    rollout = TensorDict(
        obs=torch.zeros(args.num_steps, args.num_envs, n_obs, device=device),
        actions=torch.zeros(args.num_steps, args.num_envs, n_act, device=device),
        logprobs=torch.zeros(args.num_steps, args.num_envs, device=device),
        values=torch.zeros(args.num_steps, args.num_envs, device=device),
        rewards=torch.zeros(args.num_steps, args.num_envs, device=device),
        terminations=torch.zeros(args.num_steps, args.num_envs, device=device),
        truncations=torch.zeros(args.num_steps, args.num_envs, device=device),
        final_values=torch.zeros(args.num_steps, args.num_envs, device=device),
        batch_size=[args.num_steps, args.num_envs],
        device=device,
    )

    next_obs, _ = envs.reset(seed=seed)
    next_obs = torch.as_tensor(next_obs, device=device, dtype=torch.float)
    episode_returns = deque(maxlen=20)
    curve = []  # [global_step, seconds since start, return] of every finished episode
    global_step = 0
    start_time = time.time()
    measure_start, measure_step = None, 0
    pbar = tqdm.tqdm(range(1, num_iterations + 1), disable=rank != 0)
    for iteration in pbar:
        if iteration == args.measure_burnin + 1:
            measure_start, measure_step = time.time(), global_step
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # in place: no recompile

        for step in range(args.num_steps):
            global_step += args.num_envs * world_size
            rollout["obs"][step] = next_obs

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = policy(next_obs)
            rollout["values"][step] = value.flatten()
            rollout["actions"][step] = action
            rollout["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            rollout["rewards"][step] = torch.as_tensor(reward, device=device, dtype=torch.float)
            rollout["terminations"][step] = torch.as_tensor(terminations, device=device, dtype=torch.float)
            rollout["truncations"][step] = torch.as_tensor(truncations, device=device, dtype=torch.float)
            if truncations.any():
                # the value of the state each truncated episode was cut at (gae reads it only there)
                final_obs = torch.as_tensor(true_next_obs(next_obs, infos), device=device, dtype=torch.float)
                with torch.no_grad():
                    rollout["final_values"][step] = get_value(final_obs).flatten()
            next_obs = torch.as_tensor(next_obs, device=device, dtype=torch.float)

            for episodic_return in finished_episodes(infos):
                episode_returns.append(episodic_return)
                curve.append([global_step, time.time() - start_time, episodic_return])
                if track:
                    wandb.log({"charts/episodic_return": episodic_return}, step=global_step)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = get_value(next_obs).flatten()
        advantages, returns = compute_gae(
            rollout["rewards"], rollout["values"], next_value, rollout["final_values"],
            rollout["terminations"], rollout["truncations"], args.gamma, args.gae_lambda,
        )

        # flatten the batch
        b = rollout.select("obs", "actions", "logprobs", "values").flatten(0, 1)
        b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()

        # Optimizing the policy and value network
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                stats = update(b[mb_inds])
            stats = mean_over_ranks(stats, world_size)  # so that every rank takes the same early-stop decision
            if args.target_kl is not None and stats[4] > args.target_kl:  # host sync, once per epoch
                break

        sps = (global_step - measure_step) / (time.time() - measure_start) if measure_start else 0.0
        return_mean = np.mean(episode_returns) if episode_returns else float("nan")
        pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
        if track:
            y_pred, y_true = b["values"], b["returns"]
            explained_var = 1 - (y_true - y_pred).var() / y_true.var()
            logs = torch.cat([stats, explained_var.reshape(1)]).tolist()  # host sync, once per iteration
            names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "explained_variance")
            lr = float(optimizer.param_groups[0]["lr"])
            wandb.log({f"losses/{k}": v for k, v in zip(names, logs)} | {"charts/learning_rate": lr, "charts/SPS": sps}, step=global_step)

        if any_rank(stop.is_set(), world_size, device):  # Ctrl-C (torchrun forwards it to every rank): stop here
            stop.set()
            break

    end_time = time.time()
    spread = parameter_spread(agent, world_size)
    if world_size > 1:
        dist.destroy_process_group()
    model_file = os.path.join(run_dir, "ppo_continuous_action_distributed.pt")
    if args.save_model and rank == 0:
        model = {"agent": agent.state_dict(), "obs_rms": obs_rms_of(envs)}  # the normalization is part of the policy
        save_model(model_file, "ppo_continuous_action_distributed", args, model)
    eval_returns = []
    if args.eval_episodes and rank == 0:  # the Gaussian's mean
        eval_envs = make_envs(args.env_id, 1, args.seed, args.gamma, videos, args.eval_episodes)
        obs_rms_to(eval_envs, obs_rms_of(envs), update=False)  # frozen: evaluation must not move it
        eval_returns = evaluate(agent.actor_mean, eval_envs, args.eval_episodes, args.seed, device)
        eval_envs.close()
    steps = global_step
    summary = {
        "script": "ppo_continuous_action_distributed",
        "env_id": args.env_id,
        "seed": args.seed,
        "device": str(device),
        "compile": args.compile,
        "cudagraphs": args.cudagraphs,
        "num_envs": args.num_envs,
        "world_size": world_size,
        "parameter_spread": spread,  # across ranks, at the end: 0.0 in lockstep
        "total_timesteps": steps,
        "sps": (steps - measure_step) / (end_time - measure_start) if measure_start else None,
        "sps_wall": steps / (end_time - start_time),
        "episodes": len(curve),
        "return_mean": float(np.mean(episode_returns)) if episode_returns else None,
        "wall_s": end_time - start_time,
        "torch_version": torch.__version__,
        "interrupted": stop.is_set(),
        "model_file": os.path.abspath(model_file) if args.save_model else None,
        "eval_returns": eval_returns,
        "eval_return_mean": float(np.mean(eval_returns)) if eval_returns else None,
        "curve": curve,
    }
    if rank == 0:
        write_summary(summary, run_dir)
    envs.close()
    if track:
        wandb.finish()
    if stop.is_set():
        sys.exit(130)  # what a shell reports for a Ctrl-C


if __name__ == "__main__":
    main(tyro.cli(Args))
