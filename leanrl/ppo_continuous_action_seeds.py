"""PPO for continuous actions: ppo_continuous_action_cpu.py as `--num-seeds N` runs in one vmapped
program.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps), per
member.

    python leanrl/ppo_continuous_action_seeds.py  # 8 members (seeds 1..8), compiled
    python leanrl/ppo_continuous_action_seeds.py --env-id InvertedPendulum-v4 \
        --total-timesteps 40960 --num-seeds 3
    python leanrl/ppo_continuous_action_seeds.py --compile --cudagraphs  # on CUDA

Member k is the CPU script with `--seed seed + k * num_envs`: the same initial weights and seed
numbers for its envs, its own Adam state, normalization statistics and random draws. `make_learner`
writes one member's functions as the CPU script does, then one block vmaps them over a leading seeds
axis of the stacked parameters (`diff` the two files). What else changes: every member's envs are
one envpool, stepped by C++ threads on every core, in next-step reset mode (the step after an
episode's end only resets, and weighs 0 in the loss), without frames; envpool's envs cannot be
saved, so a resumed run's episodes start fresh. A member whose loss or weights turn non-finite is
left out, and the others go on. The SUMMARY, model files and `--resume`, per member: docs/usage.md,
"The seeds scripts".
"""

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
from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tqdm
import tyro
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule
from torch.func import functional_call, grad_and_value, stack_module_state, vmap


@dataclass
class Args:
    exp_name: str = "ppo_continuous_action_seeds"
    """the name of this experiment"""
    seed: int = 1
    """seed of the first member; member k has seed `seed + k * num_envs`, its envs the next ones"""
    num_seeds: int = 8
    """the number of independent runs (members) trained as one program"""
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
    """refused: envpool renders no frames (record a saved member with the single-seed script's
    --eval-model)"""
    save_model: bool = False
    """save each member's weights, with its arguments, to runs/<run_name>/<script>_seed<seed>.pt at
    the end"""
    eval_episodes: int = 0
    """after training, play this many episodes with each member's policy and report their mean
    returns (0: none)"""
    eval_model: str | None = None
    """instead of training, play this saved .pt file as every member for --eval-episodes"""
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
    """the id of the environment (one of envpool's tasks)"""
    total_timesteps: int = 1_000_000
    """total environment steps of each member"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments of each member"""
    num_steps: int = 2048
    """the number of vector steps of each rollout"""
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
    """stop a member's epochs early once its approximate KL exceeds this (off by default)"""

    compile: bool = True
    """compile acting, GAE and the update, each one graph; --no-compile runs the same functions
    eagerly"""
    cudagraphs: bool = False
    """record acting and the update as CUDA graphs (needs a CUDA device)"""
    threads: int | None = None
    """torch's intra-op threads (default 1: every op here is tiny)"""


def update_rms(rms, x):
    """gymnasium's RunningMeanStd.update with one sample per env: rms = (mean, var, count)."""
    mean, var, count = rms
    delta = x - mean
    var = (var + delta**2 / (count + 1)) * count / (count + 1)
    return mean + delta / (count + 1), var, count + 1


class EnvpoolWrappers:
    """make_env's wrappers in numpy, each env its own statistics, around `num_envs` envpool envs,
    with gymnasium's interface. `resetting` marks the envs taking a reset step (next-step mode),
    which the statistics skip. `make(seed)`: a new pool, env i seeded `seed + i`."""

    def __init__(self, envs, num_envs, gamma, obs_rms=None, make=None):
        self.envs, self.num_envs, self.gamma, self.make = envs, num_envs, gamma, make
        self.single_action_space = envs.action_space
        shape, dtype = (num_envs, *envs.observation_space.shape), envs.observation_space.dtype
        # as gymnasium's; one count for all envs
        self.obs_rms = (np.zeros(shape, dtype), np.ones(shape, dtype), 1e-4)
        # a trained policy acts on observations normalized as in its training
        self.frozen = obs_rms is not None
        if self.frozen:
            mean, var, count = obs_rms["mean"], obs_rms["var"], obs_rms["count"]
            self.obs_rms = (mean.numpy(), var.numpy(), float(count))
        self.return_rms = (np.zeros(num_envs), np.ones(num_envs), np.full(num_envs, 1e-4))
        self.discounted_reward = np.zeros(num_envs)
        self.episode_return = np.zeros(num_envs)
        self.resetting = np.zeros(num_envs, bool)

    def close(self):
        self.envs.close()

    def normalize(self, obs):
        """NormalizeObservation, then the clip to [-10, 10]; float32 once, here."""
        self.obs_rms = self.obs_rms if self.frozen else update_rms(self.obs_rms, obs)
        mean, var, _ = self.obs_rms
        return np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10).astype(np.float32)

    def reset(self, seed=None):  # envpool's seeds are fixed when it is made: a seed makes anew
        if seed is not None:
            self.envs.close()
            self.envs = self.make(seed)
        self.episode_return[:], self.resetting[:] = 0.0, False
        return self.normalize(self.envs.reset()[0]), {}

    def state_dict(self):  # the statistics, for checkpoints (envpool's envs cannot be saved)
        rms = dict(obs_rms=self.obs_rms, return_rms=self.return_rms)
        return rms | dict(discounted_reward=self.discounted_reward)

    def load_state_dict(self, state):
        vars(self).update(state)

    def step(self, actions):
        stepped = ~self.resetting
        actions = np.clip(actions, self.envs.action_space.low, self.envs.action_space.high)
        obs, reward, terminations, truncations, _ = self.envs.step(actions)
        self.episode_return = np.where(stepped, self.episode_return, 0.0) + reward
        self.resetting = terminations | truncations
        infos = {"final_info": {"episode": {"r": self.episode_return}, "_episode": self.resetting}}
        # NormalizeReward (its discounted return restarts at a termination only), then the clip
        discounted_reward = self.discounted_reward * self.gamma * (1 - terminations) + reward
        self.discounted_reward = np.where(stepped, discounted_reward, self.discounted_reward)
        rms = update_rms(self.return_rms, self.discounted_reward)
        self.return_rms = tuple(np.where(stepped, x, old) for x, old in zip(rms, self.return_rms))
        reward = np.clip(reward / np.sqrt(self.return_rms[1] + 1e-8), -10, 10)
        return self.normalize(obs), reward, terminations, truncations, infos


def make_envs(env_id, num_envs, seed, num_seeds, gamma, obs_rms=None):
    """All members' envs as one envpool in EnvpoolWrappers, member k's a slice, env i of member k
    seeded seed + k*num_envs + i as the single-seed script with `--seed seed + k*num_envs` seeds it;
    `obs_rms` (a saved model's) normalizes, frozen. A bad id or action space exit 2."""
    if env_id not in envpool.list_all_envs():
        fail(f"--env-id {env_id!r} is not one of envpool's tasks (envpool.list_all_envs())")
    n = num_seeds * num_envs
    threads = min(len(os.sched_getaffinity(0)), n)

    def make(seed):  # env j (env j % num_envs of member j // num_envs) seeded `seed + j`
        env_seeds = [(seed + j) % 2**31 for j in range(n)]
        return envpool.make_gymnasium(env_id, num_envs=n, env_seed=env_seeds, num_threads=threads)

    envs = make(seed)
    if not isinstance(envs.action_space, gym.spaces.Box):
        space = type(envs.action_space).__name__
        fail(f"--env-id {env_id!r} has a {space} action space; PPO here needs a Box")
    return EnvpoolWrappers(envs, n, gamma, obs_rms, make)


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

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        # acting: under vmap's randomness="different", each member draws its own noise
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

    forward = get_action_and_value  # what `functional_call` runs


def per_member(x, num_seeds):
    """The vector env's rows [num_seeds * num_envs, ...] as [num_seeds, num_envs, ...]: member k's
    envs are the k-th slice."""
    return x.reshape(num_seeds, -1, *x.shape[1:])


def flat(x):
    """[num_seeds, num_envs, ...] as the vector env's rows [num_seeds * num_envs, ...]."""
    return x.reshape(-1, *x.shape[2:])


def finished_episodes(infos, num_seeds):
    """Per member, the returns of every episode that ended on this step."""
    final_info = infos.get("final_info", {})
    if "episode" not in final_info:
        return [[]] * num_seeds
    returns = per_member(final_info["episode"]["r"], num_seeds)
    ended = per_member(final_info["_episode"], num_seeds)
    return [member_returns[ends].tolist() for member_returns, ends in zip(returns, ended)]


def gae(rewards, values, next_value, final_values, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation: (advantages, returns), shaped [num_steps, num_envs].

    `next_value` [num_envs] is the value of the obs after the last step. `final_values[t]` is the
    value of the true final obs of an episode truncated at step t (read only there).
    """
    dones = torch.maximum(terminations, truncations)
    # after an episode's last step: its final obs' value if it was cut off, 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1} with c_t = gamma * lambda * (1 - done_t), solved by doubling:
    # after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of A_t and
    # coefs[t] is the product of their c's. A loop, unrolled, would take minutes to compile.
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat(
            [advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]]
        )
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


class Adam:
    """torch.optim.Adam's step (no weight decay, no amsgrad) on a dict of tensors, in place.

    Written out so that a compiled update holds it in its graph, which `torch.optim.Adam.step`
    would break. The learning rate is in `param_groups`. Every op is elementwise: on parameters
    stacked over the members, each member takes its own step.
    """

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.betas, self.eps = params, betas, eps
        self.param_groups = [{"lr": lr}]
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        # beta1**t and beta2**t as running products of tensors: nothing recompiles, and Inductor
        # would inline a power of a step count into the kernel of every parameter, slowly. A pair
        # per member: --target-kl stops the members after different numbers of steps
        members = next(iter(params.values())).shape[:1]
        self.beta1_power = torch.ones(members, device=lr.device)
        self.beta2_power = torch.ones(members, device=lr.device)

    def step(self, grads):
        beta1, beta2 = self.betas
        self.beta1_power.mul_(beta1)
        self.beta2_power.mul_(beta2)
        bias_correction1, bias_correction2 = 1 - self.beta1_power, 1 - self.beta2_power
        for name, param in self.params.items():
            exp_avg, exp_avg_sq, grad = self.exp_avg[name], self.exp_avg_sq[name], grads[name]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            # each member's bias corrections, against its parameters
            members = (-1,) + (1,) * (param.dim() - 1)
            denom = (exp_avg_sq / bias_correction2.view(members)).sqrt() + self.eps
            lr = self.param_groups[0]["lr"]
            param.sub_(lr * (exp_avg / bias_correction1.view(members)) / denom)

    def state_dict(self):  # the moments, beta1**t, beta2**t and the learning rate, for checkpoints
        moments = {f"exp_avg.{name}": value for name, value in self.exp_avg.items()}
        moments |= {f"exp_avg_sq.{name}": value for name, value in self.exp_avg_sq.items()}
        powers = dict(beta1_power=self.beta1_power, beta2_power=self.beta2_power)
        return moments | powers | dict(lr=self.param_groups[0]["lr"])

    def load_state_dict(self, state):  # in place: the compiled update reads these tensors
        for key, value in self.state_dict().items():
            value.copy_(state[key])


def make_learner(args, n_obs, n_act, seeds, device):
    """PPO's members' agents, optimizer and steps on `device`, stacked on a leading seeds axis.
    Member k starts from the weights ppo_continuous_action_cpu.py draws with `--seed seeds[k]`."""
    members = []
    for seed in seeds:
        with torch.random.fork_rng():  # the global generator is left as it was
            torch.manual_seed(seed)
            members.append(Agent(n_obs, n_act, device=device))
    agent = Agent(n_obs, n_act, device="meta")  # the shell that `functional_call` fills
    # a tensor annealed in place: the compiled update reads it, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # the members' tensors, stacked, which Adam updates in place
    params = {name: p.detach() for name, p in stack_module_state(members)[0].items()}
    optimizer = Adam(params, lr, eps=1e-5)

    def loss_fn(params, mb):
        """The clipped-surrogate loss of a minibatch, and its statistics."""
        inputs = (mb["obs"], mb["actions"])
        _, newlogprob, entropy, newvalue = functional_call(agent, params, inputs)
        logratio = newlogprob - mb["logprobs"]
        ratio = logratio.exp()
        # envpool's reset steps weigh 0 in every mean; a member with one valid row in a
        # minibatch, or none, gets means and a std of 0. Of shape [1], not []: under vmap on a
        # GPU, a number in arithmetic with a 0-d tensor makes a CPU tensor
        valid, count = mb["valid"], mb["valid"].sum(0, keepdim=True)

        def mean(x):
            return (x * valid).sum(0, keepdim=True) / count.clamp(min=1)

        with torch.no_grad():
            # calculate approx_kl http://joschu.net/blog/kl-approx.html
            old_approx_kl = mean(-logratio)
            approx_kl = mean((ratio - 1) - logratio)
            clipfrac = mean(((ratio - 1.0).abs() > args.clip_coef).float())

        mb_advantages = mb["advantages"]
        if args.norm_adv:
            centered = mb_advantages - mean(mb_advantages)
            std = ((centered**2 * valid).sum(0, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
            mb_advantages = centered / (std + 1e-8)

        # policy loss
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = mean(torch.max(pg_loss1, pg_loss2))

        # value loss
        newvalue = newvalue.view(-1)
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - mb["returns"]) ** 2
            v_clipped = mb["values"] + torch.clamp(
                newvalue - mb["values"], -args.clip_coef, args.clip_coef
            )
            v_loss_clipped = (v_clipped - mb["returns"]) ** 2
            v_loss = 0.5 * mean(torch.max(v_loss_unclipped, v_loss_clipped))
        else:
            v_loss = 0.5 * mean((newvalue - mb["returns"]) ** 2)

        entropy_loss = mean(entropy)
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
        stats = [pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]
        return loss.sum(), torch.cat(stats).detach()

    def ppo_grads(params, mb):
        """The gradients of a minibatch's loss, clipped, and its statistics. `torch.func` takes
        them and the clip is written out: `backward` would split the compiled graph."""
        grads, (loss, stats) = grad_and_value(loss_fn, has_aux=True)(params, mb)
        # nn.utils.clip_grad_norm_, written out
        squares = torch.stack([grad.pow(2).sum() for grad in grads.values()])
        total_norm = squares.sum(0, keepdim=True).sqrt()  # of shape [1]: see loss_fn
        scale = (args.max_grad_norm / (total_norm + 1e-6)).clamp(max=1.0)
        return {name: grad * scale for name, grad in grads.items()}, stats

    # ---- N seeds: the member functions above, vmapped over the leading seeds axis ----
    # Each name below stands for its member function lifted over the members: parameters and
    # minibatches [num_seeds, ...]. Acting draws each member's own noise. Adam's step needs no
    # vmap: elementwise, it runs on the stacks as it is.
    ppo_grads = vmap(ppo_grads)
    get_action_and_value = vmap(
        lambda params, obs: functional_call(agent, params, (obs,)), randomness="different"
    )

    def policy(obs):  # every member's envs at once: [num_seeds * num_envs, n_obs]
        return tuple(flat(x) for x in get_action_and_value(params, per_member(obs, len(seeds))))

    # ---- end of the N seeds block ----

    def update(mb):
        """One gradient step on a minibatch (a TensorDict); returns its statistics."""
        grads, stats = ppo_grads(params, mb)
        optimizer.step(grads)
        return stats

    return SimpleNamespace(
        agent=agent,
        params=params,
        optimizer=optimizer,
        policy=policy,
        update=update,
    )


def main(args):
    check_args(args)
    # one env first: its id and sizes, before N members'
    probe = make_envs(args.env_id, 1, args.seed, 1, args.gamma)
    n_obs = int(np.prod(probe.envs.observation_space.shape))
    n_act = int(np.prod(probe.single_action_space.shape))
    probe.close()
    # 3 copies, float32
    check_memory(args, 3 * args.num_steps * args.num_envs * (n_obs + n_act + 8) * 4, "rollouts")
    # seeds, run folder, wandb, signals: see the end of the file
    run = Run(args, "ppo_continuous_action_seeds")
    envs = make_envs(args.env_id, args.num_envs, args.seed, args.num_seeds, args.gamma)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # every op is tiny: waking a second thread costs more than it saves (with many members,
    # --threads 2 can pay: docs/performance.md)
    torch.set_num_threads(args.threads or 1)

    learner = make_learner(args, n_obs, n_act, run.seeds, device)
    params, optimizer = learner.params, learner.optimizer

    def evaluate_agent(member, episodes, videos):  # the Gaussian's mean; `models` is bound below
        model, seed = models[member], run.seeds[member]
        agent = Agent(n_obs, n_act, device=device)
        agent.load_state_dict(model["agent"])
        eval_envs = make_envs(args.env_id, 1, seed, 1, args.gamma, model["obs_rms"])
        return evaluate(agent.actor_mean, eval_envs, episodes, seed, device)

    if args.eval_model:  # the saved model as every member
        models = [run.saved_model] * args.num_seeds
        envs.close()
        return run.finish(device, models, evaluate_agent)
    policy, update = learner.policy, learner.update
    compute_gae = gae
    if args.compile:
        # acting, GAE and the whole update, each one graph; a C++ wrapper makes fewer Python calls
        options = {"cpp_wrapper": device.type == "cpu"}
        policy = torch.compile(policy, fullgraph=True, options=options)
        compute_gae = torch.compile(gae, fullgraph=True, options=options)
        update = torch.compile(update, fullgraph=True, options=options)
    if args.cudagraphs:
        # the first calls run as they are (compiling, with --compile), the next records the graph,
        # later ones replay it
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    # the rollout, [num_steps, num_seeds * num_envs, ...] on the host, one TensorDict
    scalars = ("logprobs", "values", "rewards", "terminations", "truncations", "valid")
    rollout = {key: torch.zeros(args.num_steps, envs.num_envs) for key in scalars}
    rollout["obs"] = torch.zeros(args.num_steps, envs.num_envs, n_obs)
    rollout["actions"] = torch.zeros(args.num_steps, envs.num_envs, n_act)
    rollout = TensorDict(rollout, batch_size=[args.num_steps, envs.num_envs])
    # numpy views of the rollout's tensors, which the policy's arrays are written to
    store = rollout.numpy()

    next_obs, _ = envs.reset()
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        # envpool's envs cannot be saved, their statistics can
        state = dict(params=params, optimizer=optimizer)
        return dict(learner=state, normalization=envs, envs=(envs, next_obs))

    iterations = run.resume(training_state(), range(1, num_iterations + 1))
    # with a [num_seeds, k] index: member rows
    members = torch.arange(args.num_seeds, device=device).unsqueeze(1)
    global_step = run.steps  # 0 unless resumed
    pbar = tqdm.tqdm(iterations)
    for iteration in pbar:
        if iteration == args.measure_burnin + 1:
            run.start_clock(global_step)  # sps counts from here
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            # in place: no recompile
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs
            store["obs"][step] = next_obs
            store["valid"][step] = ~envs.resetting
            action, logprob, _, value = (
                x.cpu().numpy() for x in policy(torch.as_tensor(next_obs, device=device))
            )
            store["values"][step] = value.flatten()
            store["actions"][step] = action
            store["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action)
            run.log_episodes(global_step, finished_episodes(infos, args.num_seeds))
            store["rewards"][step] = reward
            store["terminations"][step] = terminations
            store["truncations"][step] = truncations

        # advantages
        next_value = policy(torch.as_tensor(next_obs, device=device))[3].flatten().cpu()
        # envpool's next-step reset: the true final obs of an episode is the obs stored at the step
        # after its end
        rollout["final_values"] = torch.cat([rollout["values"][1:], next_value.unsqueeze(0)])
        keys = ("rewards", "values", "final_values", "terminations", "truncations")
        advantages, returns = compute_gae(
            **{key: rollout[key] for key in keys},
            next_value=next_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
        )

        # update, on [num_seeds, num_steps * num_envs]: each member its own rows
        b = rollout.select("obs", "actions", "logprobs", "values", "valid")
        b["advantages"], b["returns"] = advantages, returns
        b = b.unflatten(1, (args.num_seeds, args.num_envs)).transpose(0, 1).flatten(1, 2).to(device)
        # members stopped by --target-kl
        stopped = torch.zeros(args.num_seeds, dtype=torch.bool, device=device)
        # what a member past the target keeps: all but the lr (0-d), which the members share
        member_state = [x for x in (*params.values(), *optimizer.state_dict().values()) if x.dim()]
        kept = [x.clone() for x in member_state] + [torch.zeros(args.num_seeds, 6, device=device)]
        for _epoch in range(args.update_epochs):
            # each member its own shuffle
            b_shuffled = b[members, torch.rand(b.shape, device=device).argsort(dim=1)]
            for mb in b_shuffled.split(minibatch_size, dim=1):
                stats = update(mb)
            # host sync, once per epoch: a member past the target keeps this state
            if args.target_kl is not None:
                for x, saved in zip([*member_state, stats], kept):
                    x[stopped], saved[~stopped] = saved[stopped], x[~stopped]
                stopped |= stats[:, 4] > args.target_kl
                if stopped.all():
                    break

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var(1) / b["returns"].var(1)
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        metrics = dict(zip(names, stats.T), explained_variance=explained_var)
        run.log_progress(pbar, global_step, metrics)
        run.steps = global_step
        run.checkpoint(iteration, training_state)  # when due, on a signal, at the end
        if run.stop_signal or len(run.diverged) == args.num_seeds:  # a signal, or no member left
            break

    # each member's observation normalization (its first env's) is part of its policy, saved with it
    mean, var, count = envs.obs_rms
    models = []
    for k in range(args.num_seeds):
        rms = (mean[k * args.num_envs], var[k * args.num_envs], count)
        obs_rms = {key: torch.tensor(x) for key, x in zip(("mean", "var", "count"), rms)}
        weights = {name: param[k].cpu().clone() for name, param in params.items()}
        models.append({"agent": weights, "obs_rms": obs_rms})
    envs.close()
    run.finish(device, models, evaluate_agent)


# ==================================================================================================
# Run plumbing, the same in every seeds script: flag errors, the run folder, each member's
# results, wandb, Ctrl-C and SIGTERM, divergence, checkpoints, save, load, evaluation. `check_args`
# is this script's own.


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


def check_args(args):
    """Flag values that make no sense: one line naming the flag and exit status 2."""
    for flag, value in vars(args).items():
        # nan fails every comparison; past 1e30 float32 overflows
        if isinstance(value, float) and not abs(value) <= 1e30:
            name = "--" + flag.replace("_", "-")
            fail(f"{name} must be a finite number, at most 1e30 in size, got {value}")
    if not 0 <= args.seed <= 2**31 - args.num_seeds * args.num_envs:  # env seeds below 2**31
        fail(f"--seed must be in [0, 2**31 - num_seeds x num_envs], got {args.seed}")
    if args.measure_burnin < 0:
        fail(f"--measure-burnin must be >= 0, got {args.measure_burnin}")
    flags = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    flags += ("learning_rate", "clip_coef", "max_grad_norm", "target_kl", "num_seeds", "threads")
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value <= 0:  # --target-kl None: off, --threads None: 1
            fail(f"--{flag.replace('_', '-')} must be positive, got {value}")
    batch_size = args.num_steps * args.num_envs
    if args.total_timesteps < batch_size:
        rollout = "one rollout (--num-steps x --num-envs)"
        fail(f"--total-timesteps {args.total_timesteps} is less than {rollout}")
    if batch_size % args.num_minibatches or batch_size < 2 * args.num_minibatches:
        rollout = f"--num-steps x --num-envs ({batch_size})"
        fail(f"--num-minibatches must split {rollout} into equal parts of 2 or more")
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")
    if args.capture_video:
        single = "record a saved member with the single-seed script"
        fail(f"--capture-video: envpool renders no frames; {single}")


def check_memory(args, per_member, what):
    """Exit status 2 if the members' `what`, `per_member` bytes each, cannot fit in memory."""
    need = args.num_seeds * per_member / 2**30
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE") / 2**30
    if need > memory:
        members = f"--num-seeds {args.num_seeds}: the members' {what}"
        fail(f"{members} need {need:.1f} GiB, the machine has {memory:.1f} GiB")


class Run:
    """Everything around training: seeds, `runs/<run_name>/`, wandb, signals, checkpoints, the
    progress bar, the summary, per member. A first Ctrl-C or SIGTERM sets `stop_signal`: the loop
    stops after its step. Member k has seed `seeds[k]`, its last 20 returns `returns[k]` and its
    curve `curves[k]`; a non-finite loss or weight sets `diverged[k]`, and the others go on."""

    VARIANTS = r"_(torchcompile|cpu|distributed|ray|async|seeds)$"  # one algorithm, many scripts
    # flags that a resumed run may change: they do not change what is trained
    FREE_FLAGS = ("total_timesteps", "track", "wandb_project_name", "wandb_entity", "cuda")
    FREE_FLAGS += ("capture_video", "save_model", "eval_episodes", "measure_burnin")
    FREE_FLAGS += ("checkpoint_minutes", "resume", "run_name", "threads")

    def __init__(self, args, script):
        if args.eval_episodes < 0 or (args.eval_model and args.eval_episodes == 0):
            n = args.eval_episodes
            fail(f"--eval-episodes must be >= 0, and > 0 with --eval-model, got {n}")
        if args.checkpoint_minutes < 0 or (args.resume and args.eval_model):
            fail("--checkpoint-minutes must be >= 0, and --resume cannot go with --eval-model")
        folder = args.run_name
        if folder is not None and (os.sep in folder or folder in ("", ".", "..")):
            fail(f"--run-name must name one folder under runs/, got {folder!r}")
        # member k is the single-seed script run with seed `seeds[k]`: no two share an env seed
        self.seeds = [args.seed + k * args.num_envs for k in range(args.num_seeds)]
        self.args, self.script = args, script
        self.saved_model = self.load_model(args.eval_model) if args.eval_model else None
        self.name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.name = (args.run_name or self.name).replace(":", "_")
        self.dir = os.path.join("runs", self.name)
        self.saved = self.load_checkpoint()  # None unless resumed; its folder becomes the run's
        self.videos = self.video_folder() if args.capture_video else None
        os.makedirs(self.dir, exist_ok=True)
        self.wandb = None
        if args.track:
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
        self.returns = [deque(maxlen=20) for _ in self.seeds]  # the last 20 episodic returns
        self.curves = [[] for _ in self.seeds]  # [step, seconds, return] of every episode
        self.start_time, self.measure_start, self.measure_step = time.time(), None, 0
        self.steps, self.stop_signal, self.diverged = 0, 0, {}
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
        flags."""
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
            saved_by, trained = saved["script"], saved["args"]
        except Exception as e:
            fail(f"--resume {path} is not a checkpoint of these scripts ({e!r})")
        if saved_by != self.script:
            fail(f"--resume {path} was written by {saved_by}, not {self.script}")
        for flag, value in vars(args).items():
            if flag not in self.FREE_FLAGS and trained.get(flag) != value:
                fail(f"--resume {path} trained with --{flag.replace('_', '-')} {trained.get(flag)}")
        if saved["final"] and args.total_timesteps <= trained["total_timesteps"]:
            print(f"{path}: the run finished at step {saved['step']}; nothing to resume")
            sys.exit(0)
        self.dir = os.path.dirname(os.path.abspath(path))
        self.name = os.path.basename(self.dir)
        return saved

    def resume(self, state, iterations):
        """Copy the checkpoint's training state into `state` (in place) and its counters, curves,
        divergences and generators into the run; returns the part of `iterations` left to run."""
        saved, self.saved, self.iterations = self.saved, None, iterations  # the buffer once
        if saved is None:
            return iterations
        self.restore(state, saved["state"], self.args.seed + saved["step"])
        python, numpy, cpu, cuda = saved["generators"]
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if len(cuda) == torch.cuda.device_count() > 0:  # on as many GPUs
            torch.cuda.set_rng_state_all(cuda)
        self.steps, self.curves = saved["step"], saved["curves"]
        for returns, saved_returns in zip(self.returns, saved["returns"]):
            returns.extend(saved_returns)
        self.diverged = saved["diverged"]
        self.start_time = time.time() - saved["wall_s"]
        resumed = dict(step=self.steps, fresh_episodes=not self.envs_restored)
        self.resumes = saved["resumes"] + [resumed]
        self.start_clock(self.steps)
        return range(saved["iteration"], iterations.stop)

    def checkpoint(self, iteration, state):
        """After `iteration`, when due, on a first signal and at the end: `state()`, the counters
        and the generators to checkpoint.pt, written to a temporary file and renamed; not once
        every member has diverged."""
        final = iteration + 1 == self.iterations.stop
        due = final or self.stop_signal or time.time() > self.next_checkpoint
        if len(self.diverged) == len(self.seeds) or not due:
            return
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        generators = (random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)
        saved = dict(script=self.script, args=vars(self.args), iteration=iteration + 1)
        returns = [list(returns) for returns in self.returns]
        saved |= dict(step=self.steps, final=final, curves=self.curves, returns=returns)
        saved |= dict(wall_s=time.time() - self.start_time, resumes=self.resumes)
        saved |= dict(diverged=self.diverged)
        saved |= dict(wandb_id=self.wandb and self.wandb.run.id, generators=generators)
        path = os.path.join(self.dir, "checkpoint.pt")
        torch.save(saved | dict(state=self.state_of(state())), path + ".tmp")
        os.replace(path + ".tmp", path)
        self.next_checkpoint = time.time() + 60 * (self.args.checkpoint_minutes or float("inf"))

    def state_of(self, obj):
        """What `restore` puts back: state dicts, tensors, arrays, and for (envs, obs) the
        envs' wrappers and envs pickled but their functions, which the same flags make again, or
        None where they cannot be (a video recorder, envpool)."""
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
            try:
                layers = [
                    {k: v for k, v in vars(x).items() if k not in links and not callable(v)}
                    for x in self.layers(obj)
                ]
                envs = pickle.dumps(layers)
            except Exception:  # a renderer's screen cannot be pickled, nor envpool's envs walked
                envs = None
            return (envs, *(self.state_of(x) for x in obj[1:]))
        return obj.copy() if isinstance(obj, np.ndarray) else obj.clone()

    def restore(self, obj, saved, seed):
        """`saved` into `obj`, in place; envs that were not saved start fresh episodes, seeded with
        `seed`."""
        if hasattr(obj, "load_state_dict"):
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
        elif isinstance(obj, np.ndarray):
            obj[...] = saved
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
        """Every member's env steps per second (`global_step` counts one member's)."""
        if self.measure_start:  # None before the clock starts
            seconds = (now or time.time()) - self.measure_start
            return len(self.seeds) * (global_step - self.measure_step) / seconds

    def log_episodes(self, global_step, member_returns):
        """`member_returns[k]`: the returns of member k's episodes that ended on this step."""
        members = zip(self.seeds, self.returns, self.curves, member_returns)
        for seed, returns, curve, episode_returns in members:
            for r in episode_returns:  # a diverged policy's nan goes to its curve, as a string
                returns.extend([r] if np.isfinite(r) else [])
                value = r if np.isfinite(r) else str(r)
                curve.append([global_step, time.time() - self.start_time, value])
                if self.wandb:
                    self.wandb.log({f"charts/episodic_return_seed{seed}": r}, step=global_step)

    def log_progress(self, pbar, global_step, metrics):
        """Show sps and the mean return; log `metrics` (numbers, or tensors on one device with one
        value or one per member) to wandb. A member whose loss is not finite diverges."""
        device = next(v.device for v in metrics.values() if isinstance(v, torch.Tensor))
        values = [torch.as_tensor(v, dtype=torch.float, device=device) for v in metrics.values()]
        values = torch.stack([v.expand(len(self.seeds)) for v in values]).tolist()  # host sync
        metrics = dict(zip(metrics, values))  # a list per metric: a value per member
        sps = self.sps(global_step) or 0.0
        means = [np.mean(r) for k, r in enumerate(self.returns) if r and k not in self.diverged]
        return_mean = np.mean(means) if means else float("nan")
        pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
        if self.wandb:
            members = list(enumerate(self.seeds))
            losses = {f"losses/{k}_seed{s}": v[m] for k, v in metrics.items() for m, s in members}
            self.wandb.log(losses | {"charts/SPS": sps}, step=global_step)
        for name, member_values in metrics.items():
            for member, value in enumerate(member_values):
                if name.endswith("loss") and not np.isfinite(value):
                    self.diverge(member, global_step, name, value)

    def diverge(self, member, step, metric, value):
        if member in self.diverged:
            return
        rates = [(k, v) for k, v in vars(self.args).items() if k.endswith(("lr", "learning_rate"))]
        rates = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in rates if isinstance(v, float))
        seed = self.seeds[member]
        line = f"error: member {member} (seed {seed}) diverged at step {step}: {metric} is {value}"
        tqdm.tqdm.write(f"{line}; the others go on; maybe too large: {rates}", file=sys.stderr)
        self.diverged[member] = dict(step=step, metric=metric, value=str(value), seed=seed)

    def finish(self, device, models, evaluate):
        """Save each member's model (--save-model), write summary.json, play --eval-episodes per
        member with `evaluate(member, episodes, videos)`, print the SUMMARY line. A diverged member
        has no model file, evaluation or return mean; a run whose every member diverged exits 3, a
        stopped one evaluates nothing and exits as a shell reports a signal (130 or 143)."""
        args, end_time, seeds = self.args, time.time(), self.seeds
        for member, model in enumerate(models):
            parts = [v.values() if isinstance(v, dict) else [v] for v in model.values()]
            weight_sum = float(sum(w.double().sum() for part in parts for w in part))  # host sync
            if not np.isfinite(weight_sum):
                self.diverge(member, self.steps, "weight_sum", weight_sum)
        kept = [member not in self.diverged for member in range(len(seeds))]
        model_files = [None] * len(seeds)
        for member, model in enumerate(models):
            if args.save_model and kept[member]:  # torch.load(model_file, weights_only=True)
                model_file = os.path.abspath(f"{self.dir}/{self.script}_seed{seeds[member]}.pt")
                flags = vars(args) | {"seed": seeds[member]}  # as a single-seed run's
                saved = {"script": self.script, "args": flags, "model": model}
                torch.save(saved, model_file + ".tmp")
                os.replace(model_file + ".tmp", model_file)
                model_files[member] = model_file
        means = [float(np.mean(r)) if r and ok else None for r, ok in zip(self.returns, kept)]
        kept_means = [m for m, ok in zip(means, kept) if ok]
        return_mean = float(np.mean(kept_means)) if kept_means and None not in kept_means else None
        wall_s = end_time - self.start_time
        summary = dict(
            script=self.script,
            env_id=args.env_id,
            seed=args.seed,
            device=str(device),
            compile=args.compile,
            cudagraphs=args.cudagraphs,
            num_envs=args.num_envs,
            total_timesteps=self.steps,
            sps=self.sps(self.steps, end_time),
            sps_wall=len(seeds) * self.steps / wall_s,
            wall_s=wall_s,
            torch_version=torch.__version__,
            episodes=sum(map(len, self.curves)),
            return_mean=return_mean,
            interrupted=self.stop_signal > 0,
            resumes=self.resumes,
            model_file=next(filter(None, model_files), None),
            eval_returns=[],
            eval_return_mean=None,
            threads=torch.get_num_threads(),
            num_seeds=len(seeds),
            seeds=seeds,
            return_means=means,
            model_files=model_files if args.save_model else [],
            diverged=[self.diverged[k] | dict(member=k) for k in sorted(self.diverged)],
            eval_return_means=[],
        )
        if args.eval_episodes and not self.stop_signal:
            self.write_summary(summary)  # kept if a second signal kills the evaluation
            videos = [self.videos and f"{self.videos}/seed{seed}" for seed in seeds]
            episodes, members = args.eval_episodes, range(len(seeds))
            returns = [evaluate(k, episodes, videos[k]) if kept[k] else None for k in members]
            means = [None if r is None else float(np.mean(r)) for r in returns]
            mean = float(np.mean([m for m in means if m is not None])) if any(kept) else None
            summary |= dict(eval_returns=returns, eval_return_means=means, eval_return_mean=mean)
        print("SUMMARY " + json.dumps(summary | self.write_summary(summary)), flush=True)
        if self.wandb:
            self.wandb.finish()
        if not any(kept) or self.stop_signal:
            sys.exit(3 if not any(kept) else 128 + self.stop_signal)

    def write_summary(self, summary):
        """summary.json, written atomically; returns its path for the SUMMARY line."""
        path = os.path.join(self.dir, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary | {"curves": self.curves}, f)
        os.replace(path + ".tmp", path)
        return {"summary_file": os.path.abspath(path)}


def evaluate(act, envs, episodes, seed, device):
    """The returns of `episodes` episodes played on `envs` (one env, closed after) with `act(obs) ->
    actions`."""
    obs, _ = envs.reset(seed=seed)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device, dtype=torch.float))
        obs, _, _, _, infos = envs.step(actions.cpu().numpy())
        returns += finished_episodes(infos, 1)[0]
    envs.close()
    return returns[:episodes]


if __name__ == "__main__":
    main(tyro.cli(Args))
