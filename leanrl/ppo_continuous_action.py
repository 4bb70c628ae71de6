"""PPO for continuous actions, the eager reference (CleanRL's ppo_continuous_action.py).

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps).

    python leanrl/ppo_continuous_action.py  # the benchmark run
    python leanrl/ppo_continuous_action.py --env-id InvertedPendulum-v4 --total-timesteps 40960

Plain PyTorch, written in the shape of ppo_continuous_action_torchcompile.py so that `diff` shows
only what buys speed. The env chain is CleanRL's: clipped actions, normalized and clipped
observations and rewards, raw returns logged. Unlike CleanRL, a truncated episode bootstraps from
the value of its true final observation, a terminated one from 0. A resumed run (`--resume`)
goes on exactly, but with `--capture-video`, whose recorder cannot be saved: then its episodes
and its observation and reward normalization start afresh.
"""

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from flags import CudaFlags, TensorEnvFlags, fail
from runs import Run
from torch.distributions.normal import Normal
from vector_envs import evaluate, finished_episodes, make_envs, obs_rms_of, true_next_obs


@dataclass
class Args(TensorEnvFlags, CudaFlags):
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


def wrap(env, gamma, obs_rms=None):
    """CleanRL's wrappers of one env, after its episode statistics (raw returns): flattened
    observations, clipped actions, observations and rewards normalized and clipped; `obs_rms`, a
    trained policy's statistics, frozen. Partials, not lambdas: checkpoints pickle the wrappers.
    On the tensor envs, the same on the whole batch, with one set of statistics."""
    tensor = isinstance(env, gym.vector.VectorEnv)  # the tensor envs, all at once
    if not isinstance(env.single_action_space if tensor else env.action_space, gym.spaces.Box):
        return env  # refused in main
    if tensor:
        return env.normalized(obs_rms=obs_rms, gamma=gamma)
    space = env.observation_space
    flatten = functools.partial(gym.spaces.flatten, space)
    env = gym.wrappers.TransformObservation(env, flatten, gym.spaces.flatten_space(space))
    space = env.action_space
    clip_action = functools.partial(np.clip, a_min=space.low, a_max=space.high)
    unbounded = gym.spaces.Box(-np.inf, np.inf, space.shape, space.dtype)
    env = gym.wrappers.TransformAction(env, clip_action, unbounded)
    env = gym.wrappers.NormalizeObservation(env)
    if obs_rms is not None:
        env.obs_rms.mean, env.obs_rms.var = obs_rms["mean"].numpy(), obs_rms["var"].numpy()
        env.obs_rms.count, env.update_running_mean = float(obs_rms["count"]), False
    clip = functools.partial(np.clip, a_min=-10, a_max=10)
    env = gym.wrappers.TransformObservation(env, clip, env.observation_space)
    env = gym.wrappers.NormalizeReward(env, gamma=gamma)
    return gym.wrappers.TransformReward(env, clip)


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
        probs = Normal(action_mean, action_std, validate_args=False)  # the run reports a nan
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


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
    # A_t = delta_t + gamma * lambda * A_{t+1}, stopped at the end of an episode
    advantages = torch.zeros_like(values)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(len(values))):
        lastgaelam = deltas[t] + gamma * gae_lambda * (1 - dones[t]) * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def make_learner(args, n_obs, n_act, device):
    """PPO's agent, optimizer and steps on `device`."""
    agent = Agent(n_obs, n_act, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    def loss_fn(mb):
        """The clipped-surrogate loss of a minibatch, and its statistics."""
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

    def update(mb):
        """One gradient step on a minibatch (a dict of tensors); returns its statistics."""
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    return SimpleNamespace(
        agent=agent,
        optimizer=optimizer,
        policy=agent.get_action_and_value,
        get_value=agent.get_value,
        update=update,
    )


def main(args):
    check_args(args)
    run = Run(args, "ppo_continuous_action")  # runs.py: folder, seeds, ...
    videos = None if args.eval_model else run.videos
    wrappers = functools.partial(wrap, gamma=args.gamma)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    envs = make_envs(
        args.env_id,
        args.num_envs,
        args.seed,
        videos,
        wrap=wrappers,
        tensor=args.tensor_envs,  # the tensor envs, on the device
        device=device,
    )
    space = envs.single_action_space
    if not isinstance(space, gym.spaces.Box):
        fail(f"--env-id {args.env_id!r} has a {space} action space; PPO needs a Box")
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(space.shape))
    learner = make_learner(args, n_obs, n_act, device)
    agent, optimizer = learner.agent, learner.optimizer

    def evaluate_agent(episodes, videos):  # the Gaussian's mean; `obs_rms` is bound below
        eval_wrappers = functools.partial(wrap, gamma=args.gamma, obs_rms=obs_rms)
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes, eval_wrappers)
        return evaluate(agent.actor_mean, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        agent.load_state_dict(run.saved_model["agent"])
        obs_rms = run.saved_model["obs_rms"]
        envs.close()
        return run.finish(device, run.saved_model, evaluate_agent)

    policy, get_value, update = learner.policy, learner.get_value, learner.update
    compute_gae = gae

    def to_tensor(x):  # the envs' numpy arrays, as float32 on the device
        return torch.as_tensor(x, device=device, dtype=torch.float)

    # the rollout, [num_steps, num_envs, ...]
    scalars = ("logprobs", "values", "rewards", "terminations", "truncations", "final_values")
    rollout = {key: torch.zeros(args.num_steps, args.num_envs, device=device) for key in scalars}
    rollout["obs"] = torch.zeros(args.num_steps, args.num_envs, n_obs, device=device)
    rollout["actions"] = torch.zeros(args.num_steps, args.num_envs, n_act, device=device)

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = to_tensor(next_obs)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(agent=learner.agent, optimizer=learner.optimizer)
        return dict(learner=state, envs=(envs, next_obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    global_step = run.steps  # 0 unless resumed
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs
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
                # the value where each truncated episode was cut (gae reads it only there)
                final_obs = to_tensor(true_next_obs(next_obs, infos))
                with torch.no_grad():
                    rollout["final_values"][step] = get_value(final_obs).flatten()
            next_obs = to_tensor(next_obs)

        # advantages
        with torch.no_grad():
            next_value = get_value(next_obs).flatten()
        keys = ("rewards", "values", "final_values", "terminations", "truncations")
        advantages, returns = compute_gae(
            **{key: rollout[key] for key in keys},
            next_value=next_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
        )

        # update
        b = {key: rollout[key].flatten(0, 1) for key in ("obs", "actions", "logprobs", "values")}
        b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                stats = update({key: value[mb_inds] for key, value in b.items()})
            # host sync, once per epoch
            if args.target_kl is not None and stats[4] > args.target_kl:
                break

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        # checked like a loss: at the next rollout, Normal.sample raises on a nan standard deviation
        weight_norm = nn.utils.get_total_norm(agent.parameters())
        metrics = dict(zip(names, stats), explained_variance=explained_var, weight_norm=weight_norm)
        metrics["learning_rate"] = optimizer.param_groups[0]["lr"]
        run.log_progress(global_step, metrics)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    # the first env's observation normalization is part of the policy, saved with it
    obs_rms = obs_rms_of(envs)
    envs.close()
    run.finish(device, {"agent": agent.state_dict(), "obs_rms": obs_rms}, evaluate_agent)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
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


if __name__ == "__main__":
    main(tyro.cli(Args))
