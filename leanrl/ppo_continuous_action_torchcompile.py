"""Proximal Policy Optimization for continuous actions, optimized: the twin of ppo_continuous_action.py.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps, 2048 steps per rollout).

    python leanrl/ppo_continuous_action_torchcompile.py --compile               # on a CPU
    python leanrl/ppo_continuous_action_torchcompile.py --compile --cudagraphs  # fastest on a CUDA GPU
    python leanrl/ppo_continuous_action_torchcompile.py --compile --env-id InvertedPendulum-v4 --total-timesteps 40960

Same algorithm, same defaults and same loop as the eager twin; what changes is the data flow:
- the rollout is one TensorDict preallocated on the device: flattening it and cutting minibatches are one call;
- acting uses a copy of the agent that shares its weights but carries no autograd state;
- the Gaussian's log-density and entropy are written out (torch.distributions validates and builds objects
  on every call, which costs more than the math at these sizes);
- GAE solves its backward recurrence by doubling: log2(num_steps) vectorized steps instead of a num_steps-long
  Python loop, so the compiled graph is small and compiles in seconds;
- a fused Adam (capturable under `--cudagraphs`) whose learning rate is a tensor annealed in place; on the CPU,
  one intra-op thread;
- `--compile` compiles GAE and the update, and on CUDA the acting policy: there the update's loss (forward and
  backward; the clip and the fused Adam step stay eager); on a CPU the whole update as one graph, written as a
  function of the parameters (`torch.func` gradients, the clip and Adam written out), and acting moves to the host:
  the policy in numpy on views of the agent's weights, the rollout written through numpy views of its tensors
  (`cpu_fast_path` chooses);
- `--cudagraphs` records the acting policy and the update as CUDA graphs (tensordict's `CudaGraphModule`)
  and replays them with one launch each; it needs a CUDA device and exits with status 2 without one.

Each iteration collects `num_steps` vector steps, computes advantages with GAE, then runs `update_epochs`
epochs of `num_minibatches` clipped-surrogate steps; the learning rate falls linearly to 0 over the run. The env
chain is CleanRL's: clipped actions, normalized and clipped observations and rewards (the episode returns logged
are the raw ones).

Truncation: CleanRL treats a time-limit cut like a termination, so the value of the state where the episode was
cut is taken as 0. That state is not terminal (the agent could have gone on collecting reward), so here a
truncated step bootstraps with gamma * V(final obs), the value of its true final observation: the vector env runs
in same-step autoreset mode, which returns the reset observation for acting and the final one, normalized by the
same wrapper chain, in `infos["final_obs"]`. A terminated step bootstraps with 0. Either way GAE stops at the end
of the episode. `gae` is a pure function of the rollout's tensors, so this is checked on hand-made data.
"""

import functools
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

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from torch.func import functional_call, grad_and_value


@dataclass
class Args:
    exp_name: str = "ppo_continuous_action_torchcompile"
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
    """total environment steps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments"""
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
    """record the acting policy and the update as CUDA graphs (needs a CUDA device)"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    for flag in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.total_timesteps < args.num_steps * args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout (--num-steps x --num-envs)")
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
    if args.eval_episodes < 0:
        fail(f"--eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.eval_model and args.eval_episodes == 0:
        fail("--eval-model needs --eval-episodes N, N > 0")


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


def make_update(agent, optimizer, args, compile_loss=False):
    """One clipped-surrogate gradient step on a minibatch (a TensorDict); returns its statistics.
    `compile_loss`: compile the forward and backward of the loss; the clip and the Adam step stay eager."""
    loss_fn = make_loss(agent.get_action_and_value, args)
    if compile_loss:
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb):
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
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


def make_functional_update(agent, lr, args):
    """The update of `make_update` written as a function of the parameters, for a CPU: `torch.func` takes the
    gradients, the clip and Adam are written out, so `torch.compile(fullgraph=True)` makes the whole update, from
    the forward pass to the parameters' step, one graph (autograd's `backward` and an optimizer's `step` would
    split it). The parameters are the agent's own tensors, updated in place. Returns the update and its Adam."""
    params = {name: p.data for name, p in agent.named_parameters()}
    optimizer = Adam(params, lr, eps=1e-5)

    def params_loss(params, mb):
        return make_loss(lambda obs, actions: functional_call(agent, params, (obs, actions)), args)(mb)

    def update(mb):
        grads, (loss, stats) = grad_and_value(params_loss, has_aux=True)(params, mb)
        optimizer.step(clip_grad_norm(grads, args.max_grad_norm))
        return stats

    return update, optimizer


def make_host_policy(agent, seed):
    """`get_action_and_value` and `get_value` in numpy, for batch-1 acting on a CPU (the fast path): at batch 1 a
    torch call costs more to dispatch than its arithmetic, a numpy call much less. The arrays are views of the
    agent's weights, which the fast path's Adam updates in place, so the policy always acts with the current ones.
    Numpy observations in, numpy arrays out; the Gaussian noise comes from numpy's generator, seeded with `seed`."""
    w = {name: p.detach().numpy() for name, p in agent.named_parameters()}
    rng = np.random.default_rng(seed)

    def mlp(net, x):  # Linear, Tanh, Linear, Tanh, Linear
        x = np.tanh(x @ w[f"{net}.0.weight"].T + w[f"{net}.0.bias"])
        x = np.tanh(x @ w[f"{net}.2.weight"].T + w[f"{net}.2.bias"])
        return x @ w[f"{net}.4.weight"].T + w[f"{net}.4.bias"]

    def get_value(x):
        return mlp("critic", x)

    def get_action_and_value(x):
        action_mean = mlp("actor_mean", x)
        action_logstd = np.broadcast_to(w["actor_logstd"], action_mean.shape)
        action_std = np.exp(action_logstd)
        action = action_mean + action_std * rng.standard_normal(action_mean.shape, dtype=np.float32)
        log_prob = -((action - action_mean) ** 2) / (2 * action_std**2) - action_logstd - 0.5 * math.log(2 * math.pi)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + action_logstd
        return action, log_prob.sum(1), entropy.sum(1), get_value(x)

    return get_action_and_value, get_value


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
    update as one graph (and GAE), with a C++ wrapper (fewer Python calls per kernel), and acts in numpy on the host,
    writing the rollout through numpy views: at batch 1, torch's dispatch cost more than the arithmetic, compiled or
    not. On CUDA (and under `--cudagraphs`), the module update, whose loss compiles, and the device-side policy,
    which CUDA graphs replay."""
    return args.compile and not args.cudagraphs and device.type == "cpu"


def make_learner(args, n_obs, n_act, device):
    """PPO's agent, optimizer and step functions on `device`, as `main` runs them (tests build them here too).
    Returns the agent, the optimizer and the functions (policy, get_value, update)."""
    agent = Agent(n_obs, n_act, device=device)
    # the learning rate is a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    if cpu_fast_path(args, device):
        update, optimizer = make_functional_update(agent, lr, args)
    else:
        optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, **adam_options(args.cudagraphs))
        update = make_update(agent, optimizer, args, compile_loss=args.compile)
    if cpu_fast_path(args, device):
        policy, get_value = make_host_policy(agent, args.seed)
    else:
        # acting reads the agent's weights through a copy that shares their memory but has no autograd state
        agent_inference = Agent(n_obs, n_act, device=device)
        from_module(agent).data.to_module(agent_inference)
        policy, get_value = agent_inference.get_action_and_value, agent_inference.get_value
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
    check_args(args)
    saved_model = load_model(args.eval_model, "ppo_continuous_action_torchcompile", args.env_id) if args.eval_model else None
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = 0 if args.eval_model else args.total_timesteps // batch_size
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)  # summary.json, the model and the videos go here
    stop = stop_on_ctrl_c()
    os.makedirs(run_dir, exist_ok=True)
    videos = os.path.join(run_dir, "videos") if args.capture_video else None
    if args.capture_video:
        check_rendering(args.env_id)
    envs = make_envs(args.env_id, args.num_envs, args.seed, args.gamma, None if args.eval_model else videos)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=run_name, save_code=True)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if device.type == "cpu":
        # every op here is tiny (batch 1 acting, batch 64 updates): waking a second thread costs more than it
        # saves, and on a shared CPU an oversubscribed thread pool can stall a step for milliseconds
        torch.set_num_threads(1)

    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(envs.single_action_space.shape))
    agent, optimizer, (policy, get_value, update) = make_learner(args, n_obs, n_act, device)
    if saved_model is not None:
        agent.load_state_dict(saved_model["agent"])
        obs_rms_to(envs, saved_model["obs_rms"], update=False)  # the normalization it was trained with
    compute_gae = gae
    if cpu_fast_path(args, device):
        # the whole functional update and GAE, each with a C++ wrapper (fewer Python calls per kernel); acting is numpy
        options = {"cpp_wrapper": True}
        compute_gae = torch.compile(gae, fullgraph=True, options=options)
        update = torch.compile(update, fullgraph=True, options=options)
    elif args.compile:
        # GAE is one small graph per rollout; `make_update` compiled the loss; batch-1 acting gains from compile
        # (README, `benchmarks.inference`)
        compute_gae = torch.compile(gae, fullgraph=True)
        policy = torch.compile(policy)
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
    if cpu_fast_path(args, device):
        # the host policy's numpy arrays are written through numpy views of the rollout's tensors (same memory)
        store, as_stored, as_env_action = rollout.numpy(), functools.partial(np.asarray, dtype=np.float32), np.asarray
    else:
        store, as_stored = rollout, functools.partial(torch.as_tensor, device=device, dtype=torch.float)
        as_env_action = lambda action: action.cpu().numpy()  # noqa: E731

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = as_stored(next_obs)
    episode_returns = deque(maxlen=20)
    curve = []  # [global_step, seconds since start, return] of every finished episode
    global_step = 0
    start_time = time.time()
    measure_start, measure_step = None, 0
    pbar = tqdm.tqdm(range(1, num_iterations + 1))
    for iteration in pbar:
        if iteration == args.measure_burnin + 1:
            measure_start, measure_step = time.time(), global_step
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # in place: no recompile

        for step in range(args.num_steps):
            global_step += args.num_envs
            store["obs"][step] = next_obs

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = policy(next_obs)
            store["values"][step] = value.flatten()
            store["actions"][step] = action
            store["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(as_env_action(action))
            store["rewards"][step] = as_stored(reward)
            store["terminations"][step] = as_stored(terminations)
            store["truncations"][step] = as_stored(truncations)
            if truncations.any():
                # the value of the state each truncated episode was cut at (gae reads it only there)
                final_obs = as_stored(true_next_obs(next_obs, infos))
                with torch.no_grad():
                    store["final_values"][step] = get_value(final_obs).flatten()
            next_obs = as_stored(next_obs)

            for episodic_return in finished_episodes(infos):
                episode_returns.append(episodic_return)
                curve.append([global_step, time.time() - start_time, episodic_return])
                if args.track:
                    wandb.log({"charts/episodic_return": episodic_return}, step=global_step)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = torch.as_tensor(get_value(next_obs), device=device).flatten()
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
            if args.target_kl is not None and stats[4] > args.target_kl:  # host sync, once per epoch
                break

        sps = (global_step - measure_step) / (time.time() - measure_start) if measure_start else 0.0
        return_mean = np.mean(episode_returns) if episode_returns else float("nan")
        pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
        if args.track:
            y_pred, y_true = b["values"], b["returns"]
            explained_var = 1 - (y_true - y_pred).var() / y_true.var()
            logs = torch.cat([stats, explained_var.reshape(1)]).tolist()  # host sync, once per iteration
            names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "explained_variance")
            lr = float(optimizer.param_groups[0]["lr"])
            wandb.log({f"losses/{k}": v for k, v in zip(names, logs)} | {"charts/learning_rate": lr, "charts/SPS": sps}, step=global_step)

        if stop.is_set():  # Ctrl-C: stop after this iteration
            break

    end_time = time.time()
    model_file = os.path.join(run_dir, "ppo_continuous_action_torchcompile.pt")
    if args.save_model:
        model = {"agent": agent.state_dict(), "obs_rms": obs_rms_of(envs)}  # the normalization is part of the policy
        save_model(model_file, "ppo_continuous_action_torchcompile", args, model)
    eval_returns = []
    if args.eval_episodes:  # the Gaussian's mean
        eval_envs = make_envs(args.env_id, 1, args.seed, args.gamma, videos, args.eval_episodes)
        obs_rms_to(eval_envs, obs_rms_of(envs), update=False)  # frozen: evaluation must not move it
        eval_returns = evaluate(agent.actor_mean, eval_envs, args.eval_episodes, args.seed, device)
        eval_envs.close()
    steps = global_step
    summary = {
        "script": "ppo_continuous_action_torchcompile",
        "env_id": args.env_id,
        "seed": args.seed,
        "device": str(device),
        "compile": args.compile,
        "cudagraphs": args.cudagraphs,
        "num_envs": args.num_envs,
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
    write_summary(summary, run_dir)
    envs.close()
    if args.track:
        wandb.finish()
    if stop.is_set():
        sys.exit(130)  # what a shell reports for a Ctrl-C


if __name__ == "__main__":
    main(tyro.cli(Args))
