"""PPO for continuous actions on a CPU, grown from ppo_continuous_action_torchcompile.py.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps).

    python leanrl/ppo_continuous_action_cpu.py  # the benchmark run
    python leanrl/ppo_continuous_action_cpu.py --env-id InvertedPendulum-v4 --total-timesteps 40960

It trains on the CPU whatever the machine has; for a GPU, run the twin. Same algorithm, defaults
and loop. What changes for speed on a CPU:
- the update is a function of the parameters, with the clip and Adam written out, so that it
  compiles whole into one graph, as GAE does (`--no-compile`: eager);
- acting runs in numpy on views of the agent's weights;
- one intra-op thread unless `--threads` says otherwise: every op here is tiny.

A resumed run (`--resume`) goes on exactly, but with `--capture-video`, whose recorder cannot be
saved: then its episodes and its observation and reward normalization start afresh.
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
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tqdm
import tyro
from tensordict import TensorDict
from torch.func import functional_call, grad_and_value


@dataclass
class Args:
    exp_name: str = "ppo_continuous_action_cpu"
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
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
    """after training, play this many episodes with the trained policy (0: none)"""
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
    """total environment steps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments"""
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
    """stop an update's epochs once the approximate KL exceeds this (off by default)"""

    compile: bool = True
    """compile GAE and each update as one graph; --no-compile runs the same functions eagerly"""
    threads: int | None = None
    """torch's intra-op threads (default 1: every op here is tiny)"""


def make_env(env_id, seed, gamma, video_dir=None, video_episodes=None, obs_rms=None):
    def thunk():
        env = gym.make(env_id, render_mode=None if video_dir is None else "rgb_array")
        if video_dir is not None:
            # training: gymnasium's schedule; evaluation: the first `video_episodes`
            record = None if video_episodes is None else lambda episode: episode < video_episodes
            prefix = "train" if video_episodes is None else "eval"
            env = gym.wrappers.RecordVideo(
                env, video_dir, record, name_prefix=prefix, disable_logger=True
            )
        if not isinstance(env.action_space, gym.spaces.Box):
            space = type(env.action_space).__name__
            fail(f"--env-id {env_id!r} has a {space} action space; PPO here needs a Box")
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
    """Vector env with same-step autoreset: the true final obs of an episode is in `infos`."""
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

    def get_action_and_value(self, x, action):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        # Normal(action_mean, action_std).log_prob(action) and .entropy(), written out
        log_prob = (
            -((action - action_mean) ** 2) / (2 * action_std**2)
            - action_logstd
            - 0.5 * math.log(2 * math.pi)
        )
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + action_logstd
        return action, log_prob.sum(1), entropy.sum(1), self.critic(x)

    # what `functional_call` runs; acting is in numpy (`make_learner`)
    forward = get_action_and_value


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
    would break. The learning rate is in `param_groups`.
    """

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.betas, self.eps = params, betas, eps
        self.param_groups = [{"lr": lr}]
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        # beta1**t and beta2**t as running products of tensors: nothing recompiles, and Inductor
        # would inline a power of a step count into the kernel of every parameter, slowly
        self.beta1_power = torch.ones((), device=lr.device)
        self.beta2_power = torch.ones((), device=lr.device)

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

    def state_dict(self):  # the moments, beta1**t, beta2**t and the learning rate, for checkpoints
        moments = {f"exp_avg.{name}": value for name, value in self.exp_avg.items()}
        moments |= {f"exp_avg_sq.{name}": value for name, value in self.exp_avg_sq.items()}
        powers = dict(beta1_power=self.beta1_power, beta2_power=self.beta2_power)
        return moments | powers | dict(lr=self.param_groups[0]["lr"])

    def load_state_dict(self, state):  # in place: the compiled update reads these tensors
        for key, value in self.state_dict().items():
            value.copy_(state[key])


def make_learner(args, n_obs, n_act, device):
    """PPO's agent, optimizer and steps on `device`."""
    agent = Agent(n_obs, n_act, device=device)
    # a tensor annealed in place: the compiled update reads it, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # the agent's own tensors, which Adam updates in place
    params = {name: p.data for name, p in agent.named_parameters()}
    optimizer = Adam(params, lr, eps=1e-5)

    def loss_fn(params, mb):
        """The clipped-surrogate loss of a minibatch, and its statistics."""
        inputs = (mb["obs"], mb["actions"])
        _, newlogprob, entropy, newvalue = functional_call(agent, params, inputs)
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

        # policy loss
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        # value loss
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

    def ppo_grads(params, mb):
        """The gradients of a minibatch's loss, clipped, and its statistics. `torch.func` takes
        them and the clip is written out: `backward` would split the compiled graph."""
        grads, (loss, stats) = grad_and_value(loss_fn, has_aux=True)(params, mb)
        # nn.utils.clip_grad_norm_, written out
        total_norm = torch.stack([grad.pow(2).sum() for grad in grads.values()]).sum().sqrt()
        scale = (args.max_grad_norm / (total_norm + 1e-6)).clamp(max=1.0)
        return {name: grad * scale for name, grad in grads.items()}, stats

    def update(mb):
        """One gradient step on a minibatch (a TensorDict); returns its statistics."""
        grads, stats = ppo_grads(params, mb)
        optimizer.step(grads)
        return stats

    # acting in numpy: at batch 1, a torch call costs more to dispatch than its arithmetic.
    # The arrays are views of the weights, which Adam updates in place. The one place that
    # restates the actor: a test holds it to `Agent.get_action_and_value`.
    w = {name: p.detach().numpy() for name, p in agent.named_parameters()}
    rng = np.random.default_rng(args.seed)

    def mlp(net, x):  # Linear, Tanh, Linear, Tanh, Linear
        x = np.tanh(x @ w[f"{net}.0.weight"].T + w[f"{net}.0.bias"])
        x = np.tanh(x @ w[f"{net}.2.weight"].T + w[f"{net}.2.bias"])
        return x @ w[f"{net}.4.weight"].T + w[f"{net}.4.bias"]

    def get_value(x):
        return mlp("critic", x)

    def policy(x):
        action_mean = mlp("actor_mean", x)
        action_logstd = np.broadcast_to(w["actor_logstd"], action_mean.shape)
        action_std = np.exp(action_logstd)
        noise = rng.standard_normal(action_mean.shape, dtype=np.float32)
        action = action_mean + action_std * noise
        log_prob = (
            -((action - action_mean) ** 2) / (2 * action_std**2)
            - action_logstd
            - 0.5 * math.log(2 * math.pi)
        )
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + action_logstd
        return action, log_prob.sum(1), entropy.sum(1), get_value(x)

    return SimpleNamespace(
        agent=agent,
        optimizer=optimizer,
        policy=policy,
        get_value=get_value,
        update=update,
        rng=rng,  # the action noise, which a checkpoint keeps
    )


def main(args):
    check_args(args)
    # seeds, run folder, wandb, signals: see the end of the file
    run = Run(args, "ppo_continuous_action_cpu")
    videos = None if args.eval_model else run.videos
    envs = make_envs(args.env_id, args.num_envs, args.seed, args.gamma, videos)
    device = torch.device("cpu")
    # every op is tiny: waking a second thread costs more than it saves
    torch.set_num_threads(args.threads or 1)
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(envs.single_action_space.shape))
    learner = make_learner(args, n_obs, n_act, device)
    agent, optimizer = learner.agent, learner.optimizer

    def evaluate_agent(episodes, videos):  # the Gaussian's mean; `obs_rms` is bound below
        eval_envs = make_envs(args.env_id, 1, args.seed, args.gamma, videos, episodes, obs_rms)
        return evaluate(agent.actor_mean, eval_envs, episodes, args.seed, device)

    threads = torch.get_num_threads()
    if args.eval_model:
        agent.load_state_dict(run.saved_model["agent"])
        obs_rms = run.saved_model["obs_rms"]
        envs.close()
        return run.finish(device, run.saved_model, evaluate_agent, threads=threads)

    policy, get_value, update = learner.policy, learner.get_value, learner.update
    compute_gae = gae
    if args.compile:
        # GAE and the whole update, each one graph; a C++ wrapper makes fewer Python calls
        options = {"cpp_wrapper": True}
        compute_gae = torch.compile(gae, fullgraph=True, options=options)
        update = torch.compile(update, fullgraph=True, options=options)

    def to_array(x):  # the envs' observations, as float32
        return np.asarray(x, dtype=np.float32)

    # the rollout, [num_steps, num_envs, ...], one TensorDict
    scalars = ("logprobs", "values", "rewards", "terminations", "truncations", "final_values")
    rollout = {key: torch.zeros(args.num_steps, args.num_envs, device=device) for key in scalars}
    rollout["obs"] = torch.zeros(args.num_steps, args.num_envs, n_obs, device=device)
    rollout["actions"] = torch.zeros(args.num_steps, args.num_envs, n_act, device=device)
    rollout = TensorDict(rollout, batch_size=[args.num_steps, args.num_envs], device=device)
    # numpy views of the rollout's tensors, which the numpy policy's arrays are written to
    store = rollout.numpy()

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = to_array(next_obs)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        return dict(learner=learner, envs=(envs, next_obs))

    iterations = run.resume(training_state(), range(1, num_iterations + 1))
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
            action, logprob, _, value = policy(next_obs)
            store["values"][step] = value.flatten()
            store["actions"][step] = action
            store["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action)
            run.log_episodes(global_step, finished_episodes(infos))
            store["rewards"][step] = reward
            store["terminations"][step] = terminations
            store["truncations"][step] = truncations
            if truncations.any():
                # the value where each truncated episode was cut (gae reads it only there)
                final_obs = to_array(true_next_obs(next_obs, infos))
                store["final_values"][step] = get_value(final_obs).flatten()
            next_obs = to_array(next_obs)

        # advantages
        next_value = torch.from_numpy(get_value(next_obs)).flatten()
        keys = ("rewards", "values", "final_values", "terminations", "truncations")
        advantages, returns = compute_gae(
            **{key: rollout[key] for key in keys},
            next_value=next_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
        )

        # update
        b = rollout.select("obs", "actions", "logprobs", "values").flatten(0, 1)
        b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                stats = update(b[mb_inds])
            # host sync, once per epoch
            if args.target_kl is not None and stats[4] > args.target_kl:
                break

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        metrics = dict(zip(names, stats), explained_variance=explained_var)
        run.log_progress(pbar, global_step, metrics)
        run.steps = global_step
        run.checkpoint(iteration, training_state)  # when due, on a signal, at the end
        if run.stop_signal or run.diverged:  # a first Ctrl-C or SIGTERM, or divergence
            break

    # the first env's observation normalization is part of the policy, saved with it
    rms = envs.envs[0].get_wrapper_attr("obs_rms")
    obs_rms = {key: torch.as_tensor(getattr(rms, key)) for key in ("mean", "var", "count")}
    envs.close()
    model = {"agent": agent.state_dict(), "obs_rms": obs_rms}
    run.finish(device, model, evaluate_agent, threads=threads)


# ==================================================================================================
# Run plumbing, the same in every single-process script: flag errors, the run folder and summary,
# wandb, Ctrl-C and SIGTERM, divergence, checkpoints, save, load, evaluation. `check_args` is this
# script's own.


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
    if not 0 <= args.seed < 2**31:  # numpy's seeds are below 2**32, envpool's below 2**31
        fail(f"--seed must be in [0, 2**31), got {args.seed}")
    if args.measure_burnin < 0:
        fail(f"--measure-burnin must be >= 0, got {args.measure_burnin}")
    flags = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    flags += ("learning_rate", "clip_coef", "max_grad_norm", "target_kl")
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value <= 0:  # --target-kl None: off
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
    if args.threads is not None and args.threads <= 0:
        fail(f"--threads must be positive, got {args.threads}")


class Run:
    """Everything around training: seeds, `runs/<run_name>/`, wandb, signals, checkpoints, the
    progress bar, the summary. A first Ctrl-C or SIGTERM sets `stop_signal` and a non-finite loss
    sets `diverged`: the loop stops after its step."""

    VARIANTS = r"_(torchcompile|cpu|distributed|ray|async|seeds)$"  # one algorithm, many scripts
    # flags that a resumed run may change: they do not change what is trained
    FREE_FLAGS = ("total_timesteps", "track", "wandb_project_name", "wandb_entity", "cuda")
    FREE_FLAGS += ("capture_video", "save_model", "eval_episodes", "measure_burnin")
    FREE_FLAGS += ("checkpoint_minutes", "resume", "run_name")
    FREE_FLAGS += ("threads", "ray_address", "ray_timeout", "runner_restarts")

    def __init__(self, args, script):
        if args.eval_episodes < 0 or (args.eval_model and args.eval_episodes == 0):
            n = args.eval_episodes
            fail(f"--eval-episodes must be >= 0, and > 0 with --eval-model, got {n}")
        if args.checkpoint_minutes < 0 or (args.resume and args.eval_model):
            fail("--checkpoint-minutes must be >= 0, and --resume cannot go with --eval-model")
        folder = args.run_name
        if folder is not None and (os.sep in folder or folder in ("", ".", "..")):
            fail(f"--run-name must name one folder under runs/, got {folder!r}")
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
        """Copy the checkpoint's training state into `state` (in place) and its counters, curve and
        generators into the run; returns the part of `iterations` left to run."""
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
        self.steps, self.curve = saved["step"], saved["curve"]
        self.returns.extend(saved["returns"])
        self.start_time = time.time() - saved["wall_s"]
        resumed = dict(step=self.steps, fresh_episodes=not self.envs_restored)
        self.resumes = saved["resumes"] + [resumed]
        self.start_clock(self.steps)
        return range(saved["iteration"], iterations.stop)

    def checkpoint(self, iteration, state):
        """After `iteration`, when due, on a first signal and at the end: `state()`, the counters
        and the generators to checkpoint.pt, written to a temporary file and renamed."""
        final = iteration + 1 == self.iterations.stop
        if self.diverged or not (final or self.stop_signal or time.time() > self.next_checkpoint):
            return
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        generators = (random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)
        saved = dict(script=self.script, args=vars(self.args), iteration=iteration + 1)
        saved |= dict(step=self.steps, final=final, curve=self.curve, returns=list(self.returns))
        saved |= dict(wall_s=time.time() - self.start_time, resumes=self.resumes)
        saved |= dict(wandb_id=self.wandb and self.wandb.run.id, generators=generators)
        path = os.path.join(self.dir, "checkpoint.pt")
        torch.save(saved | dict(state=self.state_of(state())), path + ".tmp")
        os.replace(path + ".tmp", path)
        self.next_checkpoint = time.time() + 60 * (self.args.checkpoint_minutes or float("inf"))

    def state_of(self, obj):
        """What `restore` puts back: state dicts, tensors, arrays, and for (envs, obs, ...) the
        envs' wrappers and envs pickled but their functions, which the same flags make again
        (observation transforms), or None where they cannot be (a video recorder)."""
        if hasattr(obj, "state_dict"):
            return obj.state_dict()
        if isinstance(obj, np.random.Generator):
            return obj.bit_generator.state
        if isinstance(obj, SimpleNamespace):
            obj = vars(obj)
        if isinstance(obj, dict):  # what has a state: no functions
            kept = {k: v for k, v in obj.items() if hasattr(v, "state_dict") or not callable(v)}
            return {k: self.state_of(v) for k, v in kept.items()}
        if isinstance(obj, tuple):  # (envs, obs, ...)
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
        return obj.copy() if isinstance(obj, np.ndarray) else obj.clone()

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
        elif isinstance(obj, np.random.Generator):
            obj.bit_generator.state = saved
        elif isinstance(obj, (dict, SimpleNamespace)):
            items = obj.items() if isinstance(obj, dict) else vars(obj).items()
            for key, value in items:
                if key in saved:
                    self.restore(value, saved[key], seed)
        elif isinstance(obj, tuple) and saved[0] is None:  # fresh episodes: no dones, no memory
            self.restore(obj[1], obj[0].reset(seed=seed)[0], seed)
            for carried in obj[2:]:
                carried.zero_()
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
