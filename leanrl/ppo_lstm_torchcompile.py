"""Recurrent PPO with an LSTM policy for discrete actions, optimized: the twin of ppo_lstm.py.

Paper: https://arxiv.org/abs/1707.06347. Same algorithm, defaults and loop as
ppo_lstm.py (read its docstring first); what changes is the data flow.

    python leanrl/ppo_lstm_torchcompile.py --compile  # on a CPU
    python leanrl/ppo_lstm_torchcompile.py --compile --cudagraphs  # on a CUDA GPU
    # POPGym's recall task
    python leanrl/ppo_lstm_torchcompile.py --compile --env-id popgym:popgym-RepeatFirstEasy-v0

- The rollout is one TensorDict on the device; a minibatch is one index.
- Acting uses a copy of the agent sharing its weights, without autograd.
- The LSTM cell is written out: the input's share of the gates is one
  matmul for the whole sequence; the time loop does only the recurrent part.
- The categorical is written out (torch.distributions checks its arguments,
  a host sync), and GAE is solved by doubling.
- Adam is fused, capturable under `--cudagraphs`, its learning rate a tensor.
- `--compile` compiles acting, GAE and the sequence loss; `--cudagraphs`
  records acting and the update as CUDA graphs (it needs a CUDA device).
"""

import json
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
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule


@dataclass
class Args:
    exp_name: str = "ppo_lstm_torchcompile"
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
    """record videos of the first env and of evaluation episodes"""
    save_model: bool = False
    """save the weights and the arguments to runs/<run_name>/<script>.pt"""
    eval_episodes: int = 0
    """after training, play this many episodes with the trained policy (0: none)"""
    eval_model: str | None = None
    """evaluate this saved .pt file instead of training"""
    measure_burnin: int = 3
    """iterations excluded from `sps` (they compile and warm up)"""
    checkpoint_minutes: float = 10.0
    """save the training state to runs/<run_name>/checkpoint.pt this often, and always on a first
    Ctrl-C or SIGTERM and at the end (0: only then)"""
    resume: str | None = None
    """continue the run of this checkpoint or run folder (`auto`: of runs/<run_name>, if any)"""
    run_name: str | None = None
    """the run folder's name under runs/ (default: <env_id>__<exp_name>__<seed>__<unix time>)"""

    env_id: str = "CartPole-v1"
    """the id of the environment"""
    obs_indices: tuple[int, ...] | None = None
    """the observation entries the agent sees; by default (0 2) on CartPole-v1, all
    elsewhere; `--obs-indices` with no value keeps them all"""
    memory: bool = True
    """carry the state from step to step; `--no-memory` resets it at every step"""
    total_timesteps: int = 200_000
    """total environment steps of the experiment"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel environments"""
    num_steps: int = 32
    """the number of vector steps of each rollout"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of the general advantage estimation"""
    num_minibatches: int = 2
    """the number of minibatches of each epoch, split by env (whole sequences)"""
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
    """stop an update's epochs once the approximate KL exceeds this"""

    compile: bool = False
    """compile acting, GAE and the sequence loss with `torch.compile`"""
    cudagraphs: bool = False
    """record acting and the update as CUDA graphs (needs a CUDA device)"""


def make_env(env_id, seed, obs_indices, video_dir=None, video_episodes=None):
    def thunk():
        # no render_mode without video: POPGym's envs take none
        env = gym.make(env_id) if video_dir is None else gym.make(env_id, render_mode="rgb_array")
        if video_dir is not None:
            # training: gymnasium's schedule; evaluation: its first episodes
            record = None if video_episodes is None else lambda episode: episode < video_episodes
            prefix = "train" if video_episodes is None else "eval"
            env = gym.wrappers.RecordVideo(
                env, video_dir, record, name_prefix=prefix, disable_logger=True
            )
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        if obs_indices:
            space, keep = env.observation_space, list(obs_indices)
            if not all(-space.shape[0] <= i < space.shape[0] for i in keep):
                fail(
                    f"--obs-indices {' '.join(map(str, keep))}: the observation has "
                    f"{space.shape[0]} entries"
                )
            visible = gym.spaces.Box(space.low[keep], space.high[keep], dtype=space.dtype)
            env = gym.wrappers.TransformObservation(env, lambda obs: obs[keep], visible)
        # the hidden task's inputs are small: unnormalized, it learned nothing
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(
            env, lambda obs: np.clip(obs, -10, 10), env.observation_space
        )
        env.action_space.seed(seed)
        return env

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """A 64-unit torso, an LSTM cell, policy and value heads. Time-major:
    observations [T, B, n_obs], done flags [T, B], the state (h, c) [B, H] each."""

    def __init__(self, n_obs, n_act, hidden_size=128, device=None):
        super().__init__()
        self.network = nn.Sequential(layer_init(nn.Linear(n_obs, 64, device=device)), nn.Tanh())
        self.lstm = nn.LSTMCell(64, hidden_size, device=device)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(hidden_size, n_act, device=device), std=0.01)
        self.critic = layer_init(nn.Linear(hidden_size, 1, device=device), std=1)

    def zero_state(self, batch, device=None):
        """The state of `batch` envs at their first step."""
        return tuple(torch.zeros(batch, self.lstm.hidden_size, device=device) for _ in "hc")

    def get_states(self, x, lstm_state, done):
        """The LSTM's outputs [T, B, H] over `x`, and its last state. The state is
        zeroed where `done[t]` is 1: no episode leaks into the next."""
        hidden = self.network(x)
        h, c = lstm_state
        new_hidden = []
        # nn.LSTMCell written out: the input's share of the gates in one matmul
        gates_x = hidden @ self.lstm.weight_ih.T + self.lstm.bias_ih + self.lstm.bias_hh
        for gates_x_t, done_t in zip(gates_x, done):
            keep = (1.0 - done_t).unsqueeze(-1)
            h, c = lstm_step(gates_x_t, keep * h, keep * c, self.lstm.weight_hh)
            new_hidden.append(h)
        return torch.stack(new_hidden), (h, c)

    def get_value(self, x, lstm_state, done):
        hidden, _ = self.get_states(x, lstm_state, done)
        return self.critic(hidden)

    def get_action_and_value(self, x, lstm_state, done, action=None):
        hidden, lstm_state = self.get_states(x, lstm_state, done)
        logits = self.actor(hidden)
        # Categorical's sample, log_prob and entropy, written out. Gumbel-max trick:
        # argmax(logits + Gumbel noise) is distributed as softmax(logits)
        log_probs = logits.log_softmax(-1)
        if action is None:
            gumbel = -torch.log(-torch.log(torch.rand_like(logits)))
            action = (log_probs + gumbel).argmax(-1)
        log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return action, log_prob, entropy, self.critic(hidden), lstm_state


def lstm_step(gates_x, h, c, weight_hh):
    """One LSTM cell step: the new (h, c) from the input's share of the gates
    `gates_x` [B, 4H] (input, forget, cell, output) and the state `h`, `c` [B, H]."""
    i, f, g, o = (gates_x + h @ weight_hh.T).chunk(4, -1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c.tanh(), c


def observed_indices(env_id, obs_indices):
    """`obs_indices` if given, else (0 2) on CartPole-v1 and all entries (`()`) elsewhere."""
    if obs_indices is not None:
        return tuple(obs_indices)
    return (0, 2) if env_id == "CartPole-v1" else ()


def make_envs(env_id, num_envs, seed, obs_indices, video_dir=None, video_episodes=None):
    """A vector env in same-step autoreset mode, the first env recording video.
    A bad id or index, or a non-Discrete action space, exits with status 2."""
    try:
        videos = [video_dir] + [None] * (num_envs - 1)
        thunks = [
            make_env(env_id, seed + i, obs_indices, videos[i], video_episodes)
            for i in range(num_envs)
        ]
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    # an unknown id, or a `module:EnvId` whose module is missing
    except (gym.error.Error, ModuleNotFoundError) as e:
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        space = type(envs.single_action_space).__name__
        fail(f"--env-id {env_id!r} has a {space} action space; this PPO needs a Discrete one")
    return envs


def obs_rms_of(envs):
    """The first env's normalization statistics, saved with the model."""
    rms = envs.envs[0].get_wrapper_attr("obs_rms")
    return {
        "mean": torch.tensor(rms.mean),
        "var": torch.tensor(rms.var),
        "count": torch.tensor(float(rms.count)),
    }


def freeze_obs_rms(envs, stats):
    """Every env normalizes with `stats`, which no longer move."""
    for env in envs.envs:
        rms = env.get_wrapper_attr("obs_rms")
        rms.mean = stats["mean"].numpy().copy()
        rms.var = stats["var"].numpy().copy()
        rms.count = float(stats["count"])
        env.set_wrapper_attr("update_running_mean", False)


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


def episode_starts(terminations, truncations, memory):
    """1 where an episode ended; 1 everywhere without `memory`."""
    dones = np.logical_or(terminations, truncations)
    return dones if memory else np.ones_like(dones)


def gae(rewards, values, next_value, final_values, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation: (advantages, returns), [num_steps, num_envs]
    like the inputs but `next_value` [num_envs]. `final_values[t]`: the value of the
    true final observation of an episode truncated at step t."""
    dones = torch.maximum(terminations, truncations)
    # the value after step t: the next step's, the true final observation's if the
    # episode was cut off there, 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1}, c_t = gamma * lambda * (1 - done_t), by doubling:
    # after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of
    # A_t and coefs[t] is the product of their c's (the loop's sums, in another order)
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat(
            [advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]]
        )
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


def make_learner(args, n_obs, n_act, device):
    """The agent, its optimizer and the steps `main` runs, on `device`."""
    agent = Agent(n_obs, n_act, device=device)
    # a tensor learning rate, annealed in place: a captured graph reads its memory
    lr = torch.tensor(args.learning_rate, device=device)
    # fused: one kernel; capturable: else a graph cannot record its step
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=args.cudagraphs
    )

    def loss_fn(mb, state):
        _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
            mb["obs"], state, mb["dones"], mb["actions"]
        )
        logratio = newlogprob - mb["logprobs"]
        ratio = logratio.exp()
        with torch.no_grad():
            # http://joschu.net/blog/kl-approx.html
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
        newvalue = newvalue.squeeze(-1)
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
        # the loss forward and backward; the clip and the Adam step stay eager
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb, state):
        """One gradient step on the sequences `mb` [num_steps, envs], replayed
        from `state`, the state their rollout started with."""
        optimizer.zero_grad()
        loss, stats = loss_fn(mb, state)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    # acting reads the agent's weights through a copy that has no autograd state
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
    check_args(args)
    args.obs_indices = observed_indices(args.env_id, args.obs_indices)
    run = Run(args, "ppo_lstm_torchcompile")  # seeds, run folder, wandb, signals
    # evaluating a saved model records no training episode
    videos = None if args.eval_model else run.videos
    envs = make_envs(args.env_id, args.num_envs, args.seed, args.obs_indices, videos)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if device.type == "cpu":
        # every op is tiny: a second thread costs more than it saves
        torch.set_num_threads(1)
    n_obs = int(np.prod(envs.single_observation_space.shape))
    learner = make_learner(args, n_obs, int(envs.single_action_space.n), device)
    agent, optimizer = learner.agent, learner.optimizer

    def finish(obs_rms):
        def evaluate_agent(episodes, videos):  # the most likely action
            eval_envs = make_envs(args.env_id, 1, args.seed, args.obs_indices, videos, episodes)
            freeze_obs_rms(eval_envs, obs_rms)
            zeros = agent.zero_state(1, device)
            return evaluate(agent, eval_envs, episodes, args.seed, zeros, args.memory, device)

        model = {"agent": agent.state_dict(), "obs_rms": obs_rms}
        run.finish(device, model, evaluate_agent, obs_indices=list(args.obs_indices))

    if args.eval_model:
        agent.load_state_dict(run.saved_model["agent"])
        envs.close()
        return finish(run.saved_model["obs_rms"])

    compute_gae = torch.compile(gae, fullgraph=True) if args.compile else gae
    if args.compile:
        learner.policy = torch.compile(learner.policy)
    if args.cudagraphs:
        # `warmup - 1` calls run as they are (Adam creates its state), the next
        # records the graph; compiled, one more warms up for that state
        warmup = 3 if args.compile else 2
        learner.policy = CudaGraphModule(learner.policy, warmup=warmup)
        learner.update = CudaGraphModule(learner.update, warmup=warmup)

    def as_tensor(x):
        return torch.as_tensor(x, device=device, dtype=torch.float)

    # the rollout, [num_steps, num_envs, ...], one TensorDict
    shape = (args.num_steps, args.num_envs)
    keys = ("logprobs", "values", "rewards", "dones", "terminations", "truncations", "final_values")
    rollout = TensorDict(
        {key: torch.zeros(shape, device=device) for key in keys}, batch_size=shape, device=device
    )
    rollout["obs"] = torch.zeros(*shape, n_obs, device=device)
    rollout["actions"] = torch.zeros(shape, dtype=torch.long, device=device)

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = as_tensor(next_obs)
    # dones[t] = 1: obs[t] starts an episode, and the state is zeroed before it
    next_done = torch.full((args.num_envs,), 0.0 if args.memory else 1.0, device=device)
    next_state = agent.zero_state(args.num_envs, device)
    # a true final observation continues its episode: no reset before it
    final_done = torch.full((1, args.num_envs), 0.0 if args.memory else 1.0, device=device)
    envs_per_batch = args.num_envs // args.num_minibatches
    num_iterations = args.total_timesteps // (args.num_envs * args.num_steps)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        return dict(learner=learner, envs=(envs, next_obs, next_done, *next_state))

    iterations = run.resume(training_state(), range(1, num_iterations + 1))
    global_step = run.steps  # 0, or where the resumed run stopped
    pbar = tqdm.tqdm(iterations)
    for iteration in pbar:
        if iteration == args.measure_burnin + 1:
            run.start_clock(global_step)  # compile and warm-up are behind
        # the update replays each env's sequence from this state
        initial_state = tuple(s.clone() for s in next_state)
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # no recompile

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs
            rollout["obs"][step] = next_obs
            rollout["dones"][step] = next_done

            # act: a sequence of one step
            with torch.no_grad():
                action, logprob, _, value, next_state = learner.policy(
                    next_obs[None], next_state, next_done[None]
                )
            rollout["values"][step] = value.flatten()
            rollout["actions"][step] = action[0]
            rollout["logprobs"][step] = logprob[0]

            # step the envs
            next_obs, reward, terminations, truncations, infos = envs.step(action[0].cpu().numpy())
            run.log_episodes(global_step, finished_episodes(infos))
            rollout["rewards"][step] = as_tensor(reward)
            rollout["terminations"][step] = as_tensor(terminations)
            rollout["truncations"][step] = as_tensor(truncations)
            if truncations.any():
                # the value where each truncated episode was cut, seen with its memory
                final_obs = as_tensor(true_next_obs(next_obs, infos))
                with torch.no_grad():
                    rollout["final_values"][step] = learner.get_value(
                        final_obs[None], next_state, final_done
                    ).flatten()
            next_obs = as_tensor(next_obs)
            next_done = as_tensor(episode_starts(terminations, truncations, args.memory))

        # advantages
        with torch.no_grad():
            next_value = learner.get_value(next_obs[None], next_state, next_done[None]).flatten()
        ends = (rollout["final_values"], rollout["terminations"], rollout["truncations"])
        advantages, returns = compute_gae(
            rollout["rewards"], rollout["values"], next_value, *ends, args.gamma, args.gae_lambda
        )
        # the batch stays [num_steps, num_envs]: a minibatch is the sequences of some envs
        b = rollout.select("obs", "actions", "logprobs", "values", "dones")
        b["advantages"], b["returns"] = advantages, returns

        # update
        for _ in range(args.update_epochs):
            for mb_envs in torch.randperm(args.num_envs, device=device).split(envs_per_batch):
                mb = b[:, mb_envs]
                mb_state = tuple(s[mb_envs] for s in initial_state)
                stats = learner.update(mb, mb_state)
            # host sync, once per epoch
            if args.target_kl is not None and stats[4] > args.target_kl:
                break

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        lr = optimizer.param_groups[0]["lr"]
        metrics = dict(zip(names, stats), explained_variance=explained_var, learning_rate=lr)
        run.log_progress(pbar, global_step, metrics)
        run.steps = global_step
        run.checkpoint(iteration, training_state)  # when due, on a signal, at the end
        if run.stop_signal or run.diverged:  # Ctrl-C, SIGTERM or divergence
            break

    # the normalization the agent was trained with
    obs_rms = obs_rms_of(envs)
    envs.close()
    finish(obs_rms)


# ==================================================================================================
# Run plumbing, the same in every recurrent script: flag errors, the run folder and summary,
# wandb, Ctrl-C and SIGTERM, divergence, checkpoints, save, load, evaluation. `check_args` is this
# script's own.


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


def check_args(args):
    """Flag values that make no sense: one line naming the flag and exit status 2."""
    for name, value in vars(args).items():
        # nan fails every comparison below; past 1e30 float32 overflows
        if isinstance(value, float) and not abs(value) <= 1e30:
            flag = "--" + name.replace("_", "-")
            fail(f"{flag} must be a finite number, at most 1e30 in size, got {value}")
    if not 0 <= args.seed < 2**31:  # numpy's seeds are below 2**32, envpool's below 2**31
        fail(f"--seed must be in [0, 2**31), got {args.seed}")
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"]
    for name in positive + ["learning_rate", "clip_coef", "max_grad_norm", "target_kl"]:
        value = getattr(args, name)
        if value is not None and value <= 0:  # --target-kl None: off
            fail(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.total_timesteps < args.num_steps * args.num_envs:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one rollout (--num-steps x "
            "--num-envs)"
        )
    if args.num_envs % args.num_minibatches != 0:
        fail(
            f"--num-envs {args.num_envs} is not divisible by --num-minibatches "
            f"{args.num_minibatches}"
        )
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail(
            "--cudagraphs needs a CUDA device and none is available (run without it, or with "
            "--compile)"
        )


class Run:
    """Everything around training: seeds, `runs/<run_name>/`, wandb, signals, checkpoints, the
    progress bar, the summary. A first Ctrl-C or SIGTERM sets `stop_signal` and a non-finite loss
    sets `diverged`: the loop stops after its step."""

    VARIANTS = r"_(torchcompile|cpu|distributed|ray|async|seeds)$"  # one algorithm, many scripts
    # flags that a resumed run may change: they do not change what is trained
    FREE_FLAGS = ("total_timesteps", "track", "wandb_project_name", "wandb_entity", "cuda")
    FREE_FLAGS += ("capture_video", "save_model", "eval_episodes", "measure_burnin")
    FREE_FLAGS += ("checkpoint_minutes", "resume", "run_name")

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
        for flag in ("env_id", "obs_indices", "memory"):  # what the policy acts on
            if trained.get(flag) != getattr(self.args, flag):
                value = trained.get(flag)
                fail(f"--eval-model {path} was trained with --{flag.replace('_', '-')} {value}")
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


def evaluate(agent, envs, episodes, seed, state, memory, device):
    """The returns of `episodes` episodes on `envs` (one env, closed after) by `agent`'s most likely
    action, its state (`state`: zeros) carried from step to step and zeroed when an episode starts
    (at every step without `memory`)."""
    obs, _ = envs.reset(seed=seed)
    done = torch.full((1, 1), 0.0 if memory else 1.0, device=device)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            obs = torch.as_tensor(obs, device=device, dtype=torch.float)
            hidden, state = agent.get_states(obs[None], state, done)
            actions = agent.actor(hidden[0]).argmax(-1)
        obs, _, terminations, truncations, infos = envs.step(actions.cpu().numpy())
        starts = episode_starts(terminations, truncations, memory)
        done = torch.as_tensor(starts, device=device, dtype=torch.float)[None]
        returns += finished_episodes(infos)
    envs.close()
    return returns[:episodes]


if __name__ == "__main__":
    main(tyro.cli(Args))
