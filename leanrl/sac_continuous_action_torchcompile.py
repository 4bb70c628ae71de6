"""Soft Actor-Critic for continuous actions, optimized: the twin of sac_continuous_action.py.

Paper: https://arxiv.org/abs/1812.05905. Hyperparameters are CleanRL's; the default env is LeanRL's benchmark env,
HalfCheetah-v4 (CleanRL's SAC defaults to Hopper-v4), 1M steps.

    python leanrl/sac_continuous_action_torchcompile.py --compile --cudagraphs  # on a CUDA GPU
    python leanrl/sac_continuous_action_torchcompile.py --compile               # on a CPU
    python leanrl/sac_continuous_action_torchcompile.py --compile --env-id Pendulum-v1 --total-timesteps 10000

Same algorithm, same defaults and same loop as the eager twin; what changes is the data flow:
- the replay buffer is one TensorDict preallocated on the device: adding and sampling are a few indexing ops;
- the two Q-networks are one ensemble: their parameters stacked with `from_modules` and run with `torch.vmap`,
  so each layer of both networks is one batched matmul, and target networks are updated with one `lerp_`;
- acting uses a copy of the actor that shares its weights but carries no autograd state;
- the Gaussian is written out: `torch.distributions.Normal` checks its arguments on every call, a host sync;
- the entropy coefficient `alpha` is a tensor updated in place: no `.item()` sync, and a CUDA graph sees it;
- `--compile` on CUDA wraps the acting policy and both updates in `torch.compile`; on a CPU it compiles each update
  whole, forward pass to Adam step, as one graph: the updates are written as functions of the parameters
  (`torch.func` gradients, Adam written out), since autograd's backward and an optimizer's step would split the
  graph, and acting moves to the host: the actor in numpy on views of its weights, the replay buffer written
  through numpy views of its tensors (torch's batch-1 calls, compiled or not, were slower there); `cpu_fast_path`
  makes that choice;
- `--cudagraphs` records the updates and the policy as CUDA graphs (tensordict's `CudaGraphModule`) and
  replays them with one launch each; it needs a CUDA device and exits with status 2 without one.
How each variant fares on a CPU and where a step's time goes is measured in the README.
One gradient step per vector step, as in CleanRL, so with `--num-envs N` the updates per env step drop by N.
Truncated episodes bootstrap from their true final observation; terminated ones do not.
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
from functools import partial

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tqdm
import tyro
from tensordict import TensorDict, from_module, from_modules
from tensordict.nn import CudaGraphModule
from torch.func import functional_call, grad_and_value


@dataclass
class Args:
    exp_name: str = "sac_continuous_action"
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
    """gradient steps after `learning_starts` excluded from `sps` (they compile and warm up)"""

    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total environment steps of the experiment"""
    num_envs: int = 1
    """the number of parallel environments"""
    buffer_size: int = 1_000_000
    """the replay memory buffer size, in transitions"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_starts: int = 5_000
    """environment steps of random actions before learning starts"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the Q network optimizer"""
    policy_frequency: int = 2
    """the frequency of training policy (delayed): every `policy_frequency` steps, `policy_frequency` updates"""
    target_network_frequency: int = 1
    """the frequency of updates for the target networks, in gradient steps"""
    alpha: float = 0.2
    """entropy regularization coefficient, when not autotuned (autotuning starts at 1, as CleanRL's)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient"""

    compile: bool = False
    """compile the updates (on a CPU as whole functional graphs) and, on CUDA, the policy"""
    cudagraphs: bool = False
    """record the policy and the update functions as CUDA graphs (needs a CUDA device)"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    for flag in ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency", "target_network_frequency"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.learning_starts < 0:
        fail(f"--learning-starts must be >= 0, got {args.learning_starts}")
    if not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail("--tau must be in (0, 1] and --gamma in [0, 1]")
    if not args.autotune and args.alpha <= 0:
        fail(f"--alpha must be positive, got {args.alpha}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and none is available (run without it, or with --compile)")
    if args.eval_episodes < 0:
        fail(f"--eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.eval_model and args.eval_episodes == 0:
        fail("--eval-model needs --eval-episodes N, N > 0")


def make_env(env_id, seed, video_dir=None, video_episodes=None):
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
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(env_id, num_envs, seed, video_dir=None, video_episodes=None):
    """A vector env in same-step autoreset mode: the step that ends an episode returns the reset obs and puts the
    true final obs in `info["final_obs"]`; with `video_dir`, the first env records videos there (the first
    `video_episodes` episodes if given). A bad id or a discrete action space exits with status 2."""
    if env_id not in gym.registry:
        fail(f"--env-id {env_id!r} is not a registered gymnasium environment")
    try:
        videos = [video_dir] + [None] * (num_envs - 1)  # the first env alone records
        thunks = [make_env(env_id, seed + i, videos[i], video_episodes) for i in range(num_envs)]
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except gym.error.Error as e:
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        fail(f"--env-id {env_id!r} has a {type(envs.single_action_space).__name__} action space; SAC needs a Box")
    if not envs.single_action_space.is_bounded():
        fail(f"--env-id {env_id!r} has an unbounded action space; SAC needs finite bounds")
    envs.action_space.seed(seed)  # the random actions of the first `learning_starts` steps
    return envs


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
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # from SpinUp / Denis Yarats
        return mean, log_std

    def get_action(self, obs):
        mean, log_std = self(obs)
        return sample_action(mean, log_std, self.action_scale, self.action_bias)


def sample_action(mean, log_std, action_scale, action_bias):
    """A squashed Gaussian action, its log-probability and the squashed mean, from the actor's outputs."""
    std = log_std.exp()
    # the Gaussian written out: torch.distributions.Normal validates its arguments, a host sync per call
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
    """A circular buffer of transitions, preallocated on `device`; `sample` draws uniformly with replacement.
    One TensorDict holds every field, so adding or sampling a batch is one indexing call for all of them. With
    `host` (the CPU fast path) each step is written through numpy views of the tensors instead (the same memory):
    a numpy write costs a fraction of a torch one."""

    def __init__(self, buffer_size, n_obs, n_act, device, host=False):
        self.storage = TensorDict(
            obs=torch.zeros(buffer_size, n_obs, device=device),
            next_obs=torch.zeros(buffer_size, n_obs, device=device),
            actions=torch.zeros(buffer_size, n_act, device=device),
            rewards=torch.zeros(buffer_size, device=device),
            terminations=torch.zeros(buffer_size, device=device),
            batch_size=[buffer_size],
            device=device,
        )
        self.views = self.storage.numpy() if host else None
        self.buffer_size, self.cursor, self.size = buffer_size, 0, 0

    def add(self, transition):
        """Write one vector step's transitions, a dict of arrays (the env's, and the actions)."""
        n = len(transition["obs"])
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        if self.views is not None:
            for key, view in self.views.items():
                view[idx] = transition[key]
        else:
            device = self.storage.device
            transition = {k: torch.as_tensor(v, device=device, dtype=torch.float) for k, v in transition.items()}
            self.storage[torch.as_tensor(idx, device=device)] = TensorDict(transition, [n])
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):
        idx = torch.randint(0, self.size, (batch_size,), device=self.storage.device)
        return self.storage[idx]


def make_ensemble_qf(n_obs, n_act):
    """A function that runs a stack of Q-networks at once: `ensemble_qf(params, obs, actions)`, with `params` the
    stacked parameters of shape [2] (from `from_modules`), gives Q-values of shape [2, batch, 1]. `torch.vmap`
    maps over the stack, so each layer of both networks is one batched matmul."""
    # a weightless shell: the parameters are swapped in from `params` at each call
    qnet = SoftQNetwork(n_obs, n_act, device="meta")

    def qf(params, obs, actions):
        with params.to_module(qnet):
            return qnet(obs, actions)

    return torch.vmap(qf, (0, None, None))


@torch.no_grad()
def soft_target(data, get_action, ensemble_qf_target, qnet_target, alpha, gamma):
    """SAC's critic target: the smaller target Q-value of a fresh next action minus alpha times its log-probability,
    discounted, plus the reward."""
    next_actions, next_log_pi, _ = get_action(data["next_obs"])
    qf_next_target = ensemble_qf_target(qnet_target, data["next_obs"], next_actions)
    min_qf_next_target = qf_next_target.min(0).values - alpha * next_log_pi
    return data["rewards"] + (1 - data["terminations"]) * gamma * min_qf_next_target.view(-1)


def make_updates(actor, ensemble_qf, ensemble_qf_target, qnet_params, qnet_target, log_alpha, alpha, optimizers, args, target_entropy):
    """The critic step and the actor (plus entropy) step of SAC. `optimizers` is (q, actor, alpha)."""
    q_optimizer, actor_optimizer, a_optimizer = optimizers

    def update_critic(data):
        next_q_value = soft_target(data, actor.get_action, ensemble_qf_target, qnet_target, alpha, args.gamma)

        qf_a_values = ensemble_qf(qnet_params, data["obs"], data["actions"]).view(2, -1)
        # the sum of both networks' mean squared errors, as in the eager twin
        qf_loss = (qf_a_values - next_q_value).pow(2).mean(1).sum()

        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        return qf_loss.detach()

    def update_actor(data):
        pi, log_pi, _ = actor.get_action(data["obs"])
        # `.data`: the actor's loss needs no gradient of the Q-networks' parameters
        min_qf_pi = ensemble_qf(qnet_params.data, data["obs"], pi).min(0).values
        actor_loss = ((alpha * log_pi) - min_qf_pi).mean()

        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()

        alpha_loss = torch.zeros((), device=log_alpha.device)
        if args.autotune:
            with torch.no_grad():
                _, log_pi, _ = actor.get_action(data["obs"])
            alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()

            a_optimizer.zero_grad()
            alpha_loss.backward()
            a_optimizer.step()
            alpha.copy_(log_alpha.detach().exp())
        return actor_loss.detach(), alpha_loss.detach()

    def update_targets():
        # target + tau * (params - target), i.e. tau * params + (1 - tau) * target, on all leaves at once
        qnet_target.lerp_(qnet_params.data, args.tau)

    return update_critic, update_actor, update_targets


class Adam:
    """torch.optim.Adam's step (no weight decay, no amsgrad) written out on a dict of tensors, in place. Called inside
    a compiled update it becomes part of that update's graph; `torch.optim.Adam.step` would break the graph."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        # beta1**t and beta2**t as running products (tensors: nothing recompiles). Inductor inlines a power of a
        # step-count tensor into the CPU update kernel, once per vector of every parameter: 2-3x slower steps
        device = next(iter(params.values())).device
        self.beta1_power, self.beta2_power = torch.ones((), device=device), torch.ones((), device=device)

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
            param.sub_(self.lr * (exp_avg / bias_correction1) / denom)


def make_functional_updates(actor, qnet_params, qnet_target, log_alpha, alpha, args, target_entropy):
    """The updates of `make_updates` written as functions of the parameters, for a CPU: `torch.func` takes the
    gradients and Adam is written out, so `torch.compile(fullgraph=True)` makes each update, from the forward pass to
    the parameters' step, one graph (autograd's `backward` and an optimizer's `step` would split it). The parameters
    are the modules' own tensors, updated in place. Returns the update functions and their Adam optimizers."""
    actor_params = {name: p.data for name, p in actor.named_parameters()}
    q_params = {name: p.data for name, p in qnet_params.flatten_keys(".").items()}
    q_target = dict(qnet_target.flatten_keys(".").items())
    alpha_params = {"log_alpha": log_alpha.data}
    optimizers = (Adam(q_params, args.q_lr), Adam(actor_params, args.policy_lr), Adam(alpha_params, args.q_lr))
    q_optimizer, actor_optimizer, a_optimizer = optimizers
    # one Q-network as a function of its parameters, mapped over the stack of both networks' parameters
    qnet = SoftQNetwork(actor.fc1.in_features, actor.fc_mean.out_features, device="meta")
    ensemble_qf = torch.vmap(lambda params, obs, actions: functional_call(qnet, params, (obs, actions)), (0, None, None))

    def get_action(actor_params, obs):
        mean, log_std = functional_call(actor, actor_params, (obs,))
        return sample_action(mean, log_std, actor.action_scale, actor.action_bias)

    def qf_loss_fn(q_params, data, next_q_value):
        qf_a_values = ensemble_qf(q_params, data["obs"], data["actions"]).view(2, -1)
        return (qf_a_values - next_q_value).pow(2).mean(1).sum()

    def actor_loss_fn(actor_params, obs):
        pi, log_pi, _ = get_action(actor_params, obs)
        min_qf_pi = ensemble_qf(q_params, obs, pi).min(0).values
        return ((alpha * log_pi) - min_qf_pi).mean()

    def alpha_loss_fn(alpha_params, log_pi):
        return (-alpha_params["log_alpha"].exp() * (log_pi + target_entropy)).mean()

    def update_critic(data):
        next_q_value = soft_target(data, partial(get_action, actor_params), ensemble_qf, q_target, alpha, args.gamma)
        grads, qf_loss = grad_and_value(qf_loss_fn)(q_params, data, next_q_value)
        q_optimizer.step(grads)
        return qf_loss

    def update_actor(data):
        grads, actor_loss = grad_and_value(actor_loss_fn)(actor_params, data["obs"])
        actor_optimizer.step(grads)

        alpha_loss = torch.zeros((), device=alpha.device)
        if args.autotune:
            with torch.no_grad():
                _, log_pi, _ = get_action(actor_params, data["obs"])
            grads, alpha_loss = grad_and_value(alpha_loss_fn)(alpha_params, log_pi)
            a_optimizer.step(grads)
            alpha.copy_(alpha_params["log_alpha"].exp())
        return actor_loss, alpha_loss

    return update_critic, update_actor, optimizers


def make_host_policy(actor, seed):
    """`actor.get_action` in numpy, for batch-1 acting on a CPU (the fast path): at batch 1 a torch call costs more
    to dispatch than its arithmetic, a numpy call much less. The arrays are views of the actor's weights, which the
    fast path's Adam updates in place, so the policy always acts with the current ones. Numpy observations in,
    numpy arrays out; the Gaussian noise comes from numpy's generator, seeded with `seed`."""
    w = {name: p.detach().numpy() for name, p in actor.named_parameters()}
    action_scale, action_bias = actor.action_scale.numpy(), actor.action_bias.numpy()
    rng = np.random.default_rng(seed)

    def get_action(obs):
        x = np.maximum(obs @ w["fc1.weight"].T + w["fc1.bias"], 0)
        x = np.maximum(x @ w["fc2.weight"].T + w["fc2.bias"], 0)
        mean = x @ w["fc_mean.weight"].T + w["fc_mean.bias"]
        log_std = np.tanh(x @ w["fc_logstd.weight"].T + w["fc_logstd.bias"])
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        noise = rng.standard_normal(mean.shape, dtype=np.float32)  # then `sample_action`, in numpy
        y_t = np.tanh(mean + np.exp(log_std) * noise)
        log_prob = -0.5 * noise**2 - log_std - 0.5 * math.log(2 * math.pi)
        log_prob -= np.log(action_scale * (1 - y_t**2) + 1e-6)
        action, mean = y_t * action_scale + action_bias, np.tanh(mean) * action_scale + action_bias
        return action, log_prob.sum(-1, keepdims=True), mean

    return get_action


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
    updates, one graph each, and acts on the host in numpy, writing the replay buffer through numpy views: compiled
    module updates ran slower there than eager ones, and at batch 1 torch's dispatch, compiled or not, cost more than
    the arithmetic. On CUDA (and under `--cudagraphs`), the module updates and the device-side policy, which CUDA
    graphs replay."""
    return args.compile and not args.cudagraphs and device.type == "cpu"


def make_learner(args, n_obs, n_act, action_low, action_high, device):
    """SAC's networks, optimizers and step functions on `device`, as `main` runs them (tests build them here too).
    Returns the actor, the entropy coefficient `alpha` (a tensor the updates change in place), the optimizers (q,
    actor, alpha) and the functions (policy, update_critic, update_actor, update_targets)."""
    actor = Actor(n_obs, n_act, action_low, action_high, device=device)
    qf1 = SoftQNetwork(n_obs, n_act, device=device)
    qf2 = SoftQNetwork(n_obs, n_act, device=device)
    qnet_params = from_modules(qf1, qf2, as_module=True)
    qnet_target = qnet_params.data.clone()
    # one shell for each parameter set: torch 2.13's compiler fails on two swaps into one shell in a graph
    ensemble_qf, ensemble_qf_target = make_ensemble_qf(n_obs, n_act), make_ensemble_qf(n_obs, n_act)
    q_optimizer = torch.optim.Adam(qnet_params.values(True, True), lr=args.q_lr, **adam_options(args.cudagraphs))
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr, **adam_options(args.cudagraphs))

    # automatic entropy tuning starts at alpha = 1
    target_entropy = -float(n_act)
    log_alpha = torch.tensor(0.0 if args.autotune else math.log(args.alpha), device=device, requires_grad=args.autotune)
    alpha = log_alpha.detach().exp()
    a_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr, **adam_options(args.cudagraphs))
    optimizers = (q_optimizer, actor_optimizer, a_optimizer)
    update_critic, update_actor, update_targets = make_updates(
        actor, ensemble_qf, ensemble_qf_target, qnet_params, qnet_target, log_alpha, alpha, optimizers, args, target_entropy
    )
    if cpu_fast_path(args, device):
        update_critic, update_actor, optimizers = make_functional_updates(
            actor, qnet_params, qnet_target, log_alpha, alpha, args, target_entropy
        )
    if cpu_fast_path(args, device):
        policy = make_host_policy(actor, args.seed)
    else:
        # acting reads the actor's weights through a copy that shares their memory but has no autograd state
        actor_detach = Actor(n_obs, n_act, action_low, action_high, device=device)
        from_module(actor).data.to_module(actor_detach)
        policy = actor_detach.get_action
    return actor, alpha, optimizers, (policy, update_critic, update_actor, update_targets)


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
    """The first Ctrl-C asks the training loop to stop after the current step: the run then evaluates, saves and
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
    saved_model = load_model(args.eval_model, "sac_continuous_action_torchcompile", args.env_id) if args.eval_model else None
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)  # summary.json, the model and the videos go here
    stop = stop_on_ctrl_c()
    os.makedirs(run_dir, exist_ok=True)
    videos = os.path.join(run_dir, "videos") if args.capture_video else None
    if args.capture_video:
        check_rendering(args.env_id)
    envs = make_envs(args.env_id, args.num_envs, args.seed, None if args.eval_model else videos)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=run_name, save_code=True)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(envs.single_action_space.shape))
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    actor, alpha, _, (policy, update_critic, update_actor, update_targets) = make_learner(
        args, n_obs, n_act, action_low, action_high, device
    )
    if saved_model is not None:
        actor.load_state_dict(saved_model)
    if cpu_fast_path(args, device):
        update_critic = torch.compile(update_critic, fullgraph=True)
        update_actor = torch.compile(update_actor, fullgraph=True)
    elif args.compile:
        policy = torch.compile(policy)
        update_critic = torch.compile(update_critic)
        update_actor = torch.compile(update_actor)
    if args.cudagraphs:
        policy = cuda_graph(policy, args.compile)
        update_critic = cuda_graph(update_critic, args.compile)
        update_actor = cuda_graph(update_actor, args.compile)

    rb = ReplayBuffer(args.buffer_size, n_obs, n_act, device, host=cpu_fast_path(args, device))
    if cpu_fast_path(args, device):  # the host policy takes and gives numpy arrays
        as_policy_obs, as_env_action = functools.partial(np.asarray, dtype=np.float32), np.asarray
    else:
        as_policy_obs = functools.partial(torch.as_tensor, device=device, dtype=torch.float)
        as_env_action = lambda actions: actions.cpu().numpy()  # noqa: E731
    obs, _ = envs.reset(seed=args.seed)
    episode_returns = deque(maxlen=20)
    curve = []  # [global_step, seconds since start, return] of every finished episode
    num_iterations = 0 if args.eval_model else args.total_timesteps // args.num_envs
    learning_starts = args.learning_starts // args.num_envs
    start_time = time.time()
    measure_start, measure_step = None, 0
    steps = 0  # environment steps done
    pbar = tqdm.tqdm(range(num_iterations), mininterval=1.0)
    for iteration in pbar:
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin:
            measure_start, measure_step = time.time(), global_step

        # ALGO LOGIC: put action logic here
        if iteration < learning_starts:
            actions = envs.action_space.sample()
        else:
            with torch.no_grad():
                actions, _, _ = policy(as_policy_obs(obs))
            actions = as_env_action(actions)

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        for episodic_return in finished_episodes(infos):
            episode_returns.append(episodic_return)
            curve.append([global_step, time.time() - start_time, episodic_return])
            if args.track:
                wandb.log({"charts/episodic_return": episodic_return}, step=global_step)

        transition = {
            "obs": obs,
            "next_obs": true_next_obs(next_obs, infos),
            "actions": actions,
            "rewards": rewards,
            "terminations": terminations,
        }
        rb.add(transition)

        # CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if iteration >= learning_starts:
            data = rb.sample(args.batch_size)
            qf_loss = update_critic(data)

            if iteration % args.policy_frequency == 0:  # TD 3 Delayed update support
                for _ in range(args.policy_frequency):  # on the critic's batch, as in CleanRL
                    actor_loss, alpha_loss = update_actor(data)

            if iteration % args.target_network_frequency == 0:
                update_targets()

            if iteration % 100 == 0:
                sps = (global_step - measure_step) / (time.time() - measure_start) if measure_start else 0.0
                return_mean = np.mean(episode_returns) if episode_returns else float("nan")
                pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
                if args.track:
                    losses = torch.stack([qf_loss, actor_loss, alpha_loss, alpha]).tolist()  # host sync
                    names = ("qf_loss", "actor_loss", "alpha_loss", "alpha")
                    wandb.log({f"losses/{k}": v for k, v in zip(names, losses)} | {"charts/SPS": sps}, step=global_step)

        steps = global_step + args.num_envs
        if stop.is_set():  # Ctrl-C: stop after this step
            break

    end_time = time.time()
    model_file = os.path.join(run_dir, "sac_continuous_action_torchcompile.pt")
    if args.save_model:
        save_model(model_file, "sac_continuous_action_torchcompile", args, actor.state_dict())
    eval_returns = []
    if args.eval_episodes:  # the actor's mean action, squashed
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, args.eval_episodes)
        eval_returns = evaluate(lambda obs: actor.get_action(obs)[2], eval_envs, args.eval_episodes, args.seed, device)
        eval_envs.close()
    summary = {
        "script": "sac_continuous_action_torchcompile",
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
