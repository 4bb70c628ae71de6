"""Proximal Policy Optimization for continuous actions whose rollouts come from Ray actors: the optimized twin
(ppo_continuous_action_torchcompile.py), scaled out.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps, 2048 steps per
iteration: 2 runners x 1 env x 1024 steps), the update is the twin's.

    python leanrl/ppo_continuous_action_ray.py                                  # a local Ray instance on loopback
    python leanrl/ppo_continuous_action_ray.py --num-envs 4 --num-steps 256 --double-buffer   # 2 runners x 4 envs
    python leanrl/ppo_continuous_action_ray.py --ray-address 10.0.0.1:6379     # join a running cluster (`ray start`)

Sampling is split from learning. Each env runner is a Ray actor holding `--num-envs` environments (a gymnasium
vector env) and a CPU copy of the policy; one remote call returns a whole rollout fragment of `--num-steps` x
`--num-envs` steps (observations, actions, log-probabilities, rewards, terminations, truncations, true final
observations, finished episodes' returns). The learner (this process) puts the weights in Ray's object store once
per iteration (`ray.put`), every runner reads them from there, and the update is the twin's, on the
`--num-runners` x `--num-envs` columns of the fragments side by side. Values are computed by the learner, on the
whole batch in one forward pass, so runners only act.

`--double-buffer`: every runner has its next fragment in flight while the learner updates on the last one, so
sampling never waits for learning. The price is a one-iteration policy lag: the fragment of iteration i was
sampled with the weights before update i-1. Taking PPO's ratio against that behaviour policy would leave update i
little room: update i-1 already moved the learner's policy to the edge of the clip. So the update uses the decoupled
objective of Hilton et al. (2021, arxiv.org/abs/2110.00641): the ratio is clipped around the learner's policy at the
start of the update (the proximal policy, its log-probabilities recomputed in one forward pass), and each sample's
loss is weighted by pi_prox / pi_behaviour to correct for the policy that sampled. Without --double-buffer the
weights are 1 and the loss is the twin's. README measures what the lag still costs.

Observation normalization is part of the policy and is kept by the learner: runners normalize with the statistics
shipped with the weights (frozen within a fragment) and return the raw observations too, which update one
running mean and variance over all environments. A restarted runner thus loses nothing of it, and the saved
model holds the statistics it acted with. Reward normalization (the training signal only) stays in each env.

Faults: a runner that dies is restarted by Ray (up to `--runner-restarts` times each) with fresh environments; its
fragment of that iteration is sampled again, so the run goes on (SUMMARY counts the restarts). What is lost: the
dead fragment's steps, the episodes it had running and the reward-normalization statistics of its envs. Every wait on a runner has a
timeout (`--ray-timeout`) that ends the run with one line; the runners end with the run (also on Ctrl-C and on
failure). An unreachable `--ray-address` exits with status 2 within seconds. A local instance listens on
127.0.0.1 only, without a dashboard.

Truncation is bootstrapped from the true final observation, as in the twin (see its docstring).
"""

import json
import math
import os
import random
import signal
import socket
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
from gymnasium.wrappers.utils import RunningMeanStd
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule


@dataclass
class Args:
    exp_name: str = "ppo_continuous_action_ray"
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use a CUDA device for the learner when there is one, else the CPU (runners act on their CPU)"""
    track: bool = False
    """log to Weights and Biases (the only way wandb is touched)"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of the evaluation episodes to runs/<run_name>/videos/ (runners record nothing: they may run on
    other machines)"""
    save_model: bool = False
    """save the weights the policy needs, with the run's arguments, to runs/<run_name>/<script>.pt at the end"""
    eval_episodes: int = 0
    """after training, play this many episodes with the trained policy and report their mean return (0: none)"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes episodes instead of training"""
    measure_burnin: int = 3
    """iterations (rollout + update) excluded from `sps` (they start the runners, compile and warm up)"""

    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total environment steps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_runners: int = 2
    """the number of env runners (Ray actors, one CPU each)"""
    num_envs: int = 1
    """the number of environments of each runner (stepped one after another in a vector env)"""
    num_steps: int = 1024
    """the number of vector steps of each fragment (env steps per iteration: num_steps * num_envs * num_runners)"""
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

    double_buffer: bool = False
    """keep each runner's next fragment in flight during the update (sampled with the weights one update old)"""
    ray_address: str | None = None
    """join the Ray cluster whose head is at this host:port (`ray start --head` prints it; a head with token
    authentication needs RAY_AUTH_MODE=token and its token in the environment); default: start a local instance
    sized to this machine"""
    ray_timeout: float = 120.0
    """seconds a runner may take to start or to return a fragment before the run ends with one line"""
    runner_restarts: int = 3
    """how many times Ray restarts each runner that dies before the run gives up"""

    compile: bool = False
    """compile GAE and the update's loss with `torch.compile` (runners act eagerly)"""
    cudagraphs: bool = False
    """record the update as a CUDA graph (needs a CUDA device)"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class RunFailed(Exception):
    """A failure during the run (a runner gone for good, a timeout): the run ends with this one line, exit status 1."""


def check_args(args):
    for flag in ("total_timesteps", "num_runners", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                 "learning_rate", "ray_timeout"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    batch_size = args.num_steps * args.num_envs * args.num_runners
    if args.total_timesteps < batch_size:
        fail(f"--total-timesteps {args.total_timesteps} is less than one iteration (--num-steps x --num-envs x --num-runners)")
    if batch_size % args.num_minibatches != 0:
        fail(f"--num-steps x --num-envs x --num-runners ({batch_size}) is not divisible by --num-minibatches {args.num_minibatches}")
    if batch_size < 2 * args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} leaves minibatches of one sample (--num-steps x --num-envs x --num-runners too small)")
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.clip_coef <= 0 or args.max_grad_norm <= 0 or args.measure_burnin < 0:
        fail("--clip-coef and --max-grad-norm must be positive and --measure-burnin >= 0")
    if args.target_kl is not None and args.target_kl <= 0:
        fail(f"--target-kl must be positive, got {args.target_kl}")
    if args.runner_restarts < 0:
        fail(f"--runner-restarts must be >= 0, got {args.runner_restarts}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and none is available (run without it, or with --compile)")
    if args.eval_episodes < 0:
        fail(f"--eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.eval_model and args.eval_episodes == 0:
        fail("--eval-model needs --eval-episodes N, N > 0")
    if args.capture_video and args.eval_episodes == 0:
        fail("--capture-video records the evaluation episodes here: add --eval-episodes N")


def make_env(env_id, seed, gamma, video_dir=None, video_episodes=None):
    def thunk():
        if video_dir is None:
            env = gym.make(env_id)
        else:  # evaluation: its first `video_episodes` episodes
            env = gym.make(env_id, render_mode="rgb_array")
            record = lambda episode: episode < video_episodes  # noqa: E731
            env = gym.wrappers.RecordVideo(env, video_dir, record, name_prefix="eval", disable_logger=True)
        if not isinstance(env.action_space, gym.spaces.Box):
            fail(f"--env-id {env_id!r} has a {type(env.action_space).__name__} action space; PPO here needs a Box")
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)  # before the normalization: it records the raw returns
        env = gym.wrappers.ClipAction(env)
        # no NormalizeObservation: the learner keeps one set of statistics for every runner (`normalize`)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(env_id, num_envs, seed, gamma, video_dir=None, video_episodes=None):
    """A vector env in same-step autoreset mode: the step that ends an episode returns the reset obs and puts the
    true final obs in `info["final_obs"]`; with `video_dir`, the first env records its first `video_episodes`
    episodes there. A bad id or a non- Box action space exits with status 2."""
    if env_id not in gym.registry:
        fail(f"--env-id {env_id!r} is not a registered gymnasium environment")
    try:
        videos = [video_dir] + [None] * (num_envs - 1)  # the first env alone records
        thunks = [make_env(env_id, seed + i, gamma, videos[i], video_episodes) for i in range(num_envs)]
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except gym.error.Error as e:
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    return envs


def normalize(obs, obs_rms):
    """Raw observations normalized as gymnasium's NormalizeObservation does, then clipped to [-10, 10] (CleanRL's
    chain), with the statistics `obs_rms` (`mean`, `var` arrays); float32."""
    return np.clip((obs - obs_rms["mean"]) / np.sqrt(obs_rms["var"] + 1e-8), -10, 10).astype(np.float32)


def obs_rms_state(rms):
    """A RunningMeanStd's statistics as tensors: what a saved model and the runners need to normalize."""
    return {"mean": torch.as_tensor(rms.mean), "var": torch.as_tensor(rms.var), "count": torch.tensor(float(rms.count))}


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

    def get_value(self, x):
        return self.critic(x)

    def get_action(self, x, action=None):
        """An action (sampled unless given), its log-probability and the policy's entropy: what a runner needs."""
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        if action is None:
            action = action_mean + action_std * torch.randn_like(action_mean)
        # Normal(action_mean, action_std).log_prob(action) and .entropy(), written out
        log_prob = -((action - action_mean) ** 2) / (2 * action_std**2) - action_logstd - 0.5 * math.log(2 * math.pi)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + action_logstd
        return action, log_prob.sum(1), entropy.sum(1)

    def get_action_and_value(self, x, action=None):
        return *self.get_action(x, action), self.critic(x)


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


def make_update(agent, optimizer, args, compile_loss=False):
    """One clipped-surrogate gradient step on a minibatch (a TensorDict); returns its statistics. The ratio is taken
    against `logprobs`, the proximal policy's; `behaviour_weights` correct for the policy that sampled.
    `compile_loss`: compile the forward and backward of the loss; the clip and the Adam step stay eager."""

    def loss_fn(mb):
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
        # the decoupled objective: weighted by pi_prox / pi_behaviour (1 without --double-buffer: the twin's loss)
        pg_loss = (torch.max(pg_loss1, pg_loss2) * mb["behaviour_weights"]).mean()

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


def make_learner(args, n_obs, n_act, device):
    """PPO's agent, optimizer and step functions on `device`, as `main` runs them (tests build them here too).
    Returns the agent, the optimizer and the functions (get_value, get_action, update)."""
    agent = Agent(n_obs, n_act, device=device)
    # the learning rate is a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, **adam_options(args.cudagraphs))
    update = make_update(agent, optimizer, args, compile_loss=args.compile)
    # the learner's values read the agent's weights through a copy that shares their memory but has no autograd state
    agent_inference = Agent(n_obs, n_act, device=device)
    from_module(agent).data.to_module(agent_inference)
    return agent, optimizer, (agent_inference.get_value, agent_inference.get_action, update)


def sample_fragment(envs, agent, next_obs, obs_rms, num_steps):
    """`num_steps` steps of `envs` from the raw observations `next_obs`, acting with `agent` on observations
    normalized with `obs_rms`. Returns the fragment, tensors [num_steps, num_envs, ...] (`obs` normalized as the
    policy saw them, `raw_obs` for the learner's statistics, `final_obs` the true next observation of each step,
    normalized: the one where an episode ended, else the next step's), `next_obs` [num_envs, n_obs] normalized for
    the bootstrap, `episodes` [(step, return)] of the episodes that ended; and the raw observations to go on from."""
    n_envs, n_obs = next_obs.shape
    n_act = envs.single_action_space.shape[0]
    obs = np.zeros((num_steps, n_envs, n_obs), dtype=np.float32)
    raw_obs = np.zeros((num_steps, n_envs, n_obs), dtype=np.float32)
    final_obs = np.zeros((num_steps, n_envs, n_obs), dtype=np.float32)
    actions = np.zeros((num_steps, n_envs, n_act), dtype=np.float32)
    logprobs, rewards = np.zeros((num_steps, n_envs), dtype=np.float32), np.zeros((num_steps, n_envs), dtype=np.float32)
    terminations, truncations = np.zeros((num_steps, n_envs), dtype=bool), np.zeros((num_steps, n_envs), dtype=bool)
    episodes = []
    for step in range(num_steps):
        raw_obs[step] = next_obs
        obs[step] = normalize(next_obs, obs_rms)
        with torch.no_grad():
            action, logprob, _ = agent.get_action(torch.from_numpy(obs[step]))
        actions[step], logprobs[step] = action.numpy(), logprob.numpy()
        next_obs, rewards[step], terminations[step], truncations[step], infos = envs.step(actions[step])
        final_obs[step] = normalize(true_next_obs(next_obs, infos), obs_rms)
        episodes += [(step, episodic_return) for episodic_return in finished_episodes(infos)]
    fragment = {
        "obs": obs, "raw_obs": raw_obs, "actions": actions, "logprobs": logprobs, "rewards": rewards,
        "terminations": terminations, "truncations": truncations, "final_obs": final_obs,
        "next_obs": normalize(next_obs, obs_rms),
    }
    return {key: torch.from_numpy(value) for key, value in fragment.items()} | {"episodes": episodes}, next_obs


class EnvRunner:
    """An env runner, run as a Ray actor: `num_envs` environments (seeds `seed`, `seed + 1`, ...) in a vector env
    and a CPU copy of the policy. A restarted runner starts again from here: fresh environments, the same seeds."""

    def __init__(self, env_id, num_envs, seed, gamma):
        torch.set_num_threads(1)  # one core per runner: batch-`num_envs` acting gains nothing from more threads
        self.envs = make_envs(env_id, num_envs, seed, gamma)
        n_obs = int(np.prod(self.envs.single_observation_space.shape))
        self.agent = Agent(n_obs, int(np.prod(self.envs.single_action_space.shape)))  # weights come with each call
        self.next_obs, _ = self.envs.reset(seed=seed)
        torch.manual_seed(seed)  # the action noise

    def sample(self, policy, num_steps):
        """A fragment of `num_steps` vector steps acting with `policy` ({"agent": state dict, "obs_rms"})."""
        self.agent.load_state_dict(policy["agent"])
        fragment, self.next_obs = sample_fragment(self.envs, self.agent, self.next_obs, policy["obs_rms"], num_steps)
        return fragment | {"runner": f"{socket.gethostname()}:{os.getpid()}"}

    def resident_memory_mib(self):
        """This process' resident memory (VmRSS) in MiB, or None where /proc does not say."""
        try:
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return None


def check_address(address):
    """`--ray-address` must be host:port where something answers: else exit status 2 within 5 seconds (Ray itself
    would retry for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        fail(f"--ray-address {address!r} is not host:port")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        fail(f"--ray-address {address}: no Ray head answers there ({e.strerror or e})")


def connect_ray(address):
    """Join the Ray cluster whose head is at `address` (host:port), or start a local Ray instance sized to this
    machine, listening on 127.0.0.1 only and without a dashboard; returns the `ray` module."""
    if address is None or address.rpartition(":")[0] in ("127.0.0.1", "localhost"):
        # on Linux Ray replaces 127.0.0.1 by the machine's network address unless told that it runs on one machine
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray  # imported here, after the line above: Ray reads that variable when it is imported

    if address is None:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1",
                 logging_level="ERROR", log_to_driver=False)
    else:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except ConnectionError as e:  # e.g. a head that wants a token: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN
            fail(f"--ray-address {address}: Ray did not let this process join ({str(e).splitlines()[0]}); with token "
                 "authentication set RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN or ~/.ray/auth_token)")
    return ray


def start_runners(ray, args):
    """`args.num_runners` env runners, one CPU each, restarted by Ray when they die; runner i steps the envs seeded
    `seed + i * num_envs`, ... (as `num_runners * num_envs` envs of one vector env would be)."""
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < args.num_runners:
        fail(f"--num-runners {args.num_runners} needs {args.num_runners} CPUs; the Ray cluster has {cpus:g}")
    runner = ray.remote(num_cpus=1, max_restarts=args.runner_restarts)(EnvRunner)
    return [runner.remote(args.env_id, args.num_envs, args.seed + i * args.num_envs, args.gamma) for i in range(args.num_runners)]


def gather(ray, calls, resample, timeout, max_failures):
    """The fragment of each call in `calls` (one per runner, in order). A runner that died or is being restarted is
    asked again (`resample(i)` makes the call) once Ray has restarted it; raises RunFailed when a runner returns
    nothing for `timeout` seconds, raises an error, or fails more than `max_failures` times in a row (Ray gave up)."""
    fragments = []
    for i, call in enumerate(calls):
        failures = 0
        while True:
            try:
                fragments.append(ray.get(call, timeout=timeout))
                break
            except ray.exceptions.GetTimeoutError:
                raise RunFailed(f"runner {i} returned no fragment within --ray-timeout {timeout:g} s") from None
            except ray.exceptions.RayActorError as e:
                failures += 1
                if failures > max_failures:
                    raise RunFailed(f"runner {i} is gone and Ray restarts it no more ({type(e).__name__})") from None
                time.sleep(1.0)  # Ray restarts it meanwhile: a fresh process, fresh environments
                call = resample(i)
            except ray.exceptions.RayTaskError as e:
                raise RunFailed(f"runner {i} failed: {str(e.cause).splitlines()[0] if e.cause else type(e).__name__}") from None
    return fragments


def policy_state(agent, obs_rms):
    """What the runners act with: the agent's weights on the CPU and the observation statistics."""
    return {"agent": {k: v.detach().cpu() for k, v in agent.state_dict().items()}, "obs_rms": {"mean": obs_rms.mean, "var": obs_rms.var}}


def side_by_side(fragments, device):
    """The fragments of every runner as one rollout: tensors [num_steps, num_runners * num_envs, ...] on `device`."""
    keys = ("obs", "raw_obs", "actions", "logprobs", "rewards", "terminations", "truncations", "final_obs")
    rollout = {key: torch.cat([f[key] for f in fragments], dim=1).to(device) for key in keys}
    rollout["next_obs"] = torch.cat([f["next_obs"] for f in fragments]).to(device)
    for key in ("terminations", "truncations"):
        rollout[key] = rollout[key].float()
    return rollout


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


def evaluate(act, envs, episodes, seed, obs_rms, device):
    """The returns of `episodes` episodes played on `envs` (one env) with `act(normalized obs) -> actions`, in order."""
    obs, _ = envs.reset(seed=seed)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            actions = act(torch.as_tensor(normalize(obs, obs_rms), device=device))
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
    if args.ray_address and not args.eval_model:
        check_address(args.ray_address)
    saved_model = load_model(args.eval_model, "ppo_continuous_action_ray", args.env_id) if args.eval_model else None
    num_envs = args.num_runners * args.num_envs  # every env of every runner: the columns of the rollout
    batch_size = num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = 0 if args.eval_model else args.total_timesteps // batch_size
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)  # summary.json, the model and the videos go here
    stop = stop_on_ctrl_c()
    os.makedirs(run_dir, exist_ok=True)
    videos = os.path.join(run_dir, "videos") if args.capture_video else None
    if args.capture_video:
        check_rendering(args.env_id)
    eval_envs = make_envs(args.env_id, 1, args.seed, args.gamma, videos, args.eval_episodes)  # checks --env-id
    ray = connect_ray(args.ray_address) if num_iterations else None
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=run_name, save_code=True)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if device.type == "cpu":
        # every op here is small (batch 64 updates): waking a second thread costs more than it saves, and on a
        # shared CPU an oversubscribed thread pool can stall a step for milliseconds
        torch.set_num_threads(1)

    n_obs = int(np.prod(eval_envs.single_observation_space.shape))
    n_act = int(np.prod(eval_envs.single_action_space.shape))
    agent, optimizer, (get_value, get_action, update) = make_learner(args, n_obs, n_act, device)
    obs_rms = RunningMeanStd(shape=(n_obs,))  # one normalization for every env of every runner
    if saved_model is not None:
        agent.load_state_dict(saved_model["agent"])
        obs_rms.mean, obs_rms.var = saved_model["obs_rms"]["mean"].numpy(), saved_model["obs_rms"]["var"].numpy()
    compute_gae = gae
    if args.compile:
        # GAE is one small graph per rollout; `make_update` compiles the loss (the Adam step stays eager)
        compute_gae = torch.compile(gae, fullgraph=True)
    if args.cudagraphs:
        update = cuda_graph(update, args.compile)

    episode_returns = deque(maxlen=20)
    curve = []  # [global_step, seconds since start, return] of every finished episode
    global_step, restarts, runner_memory_mib = 0, 0, None
    runner_processes = [None] * args.num_runners  # host:pid of each runner
    start_time = time.time()
    measure_start, measure_step = None, 0
    try:
        runners = start_runners(ray, args) if num_iterations else []
        # the weights go to Ray's object store once per iteration; every runner reads them from there
        weights = ray.put(policy_state(agent, obs_rms)) if num_iterations else None
        calls, calls_weights = [runner.sample.remote(weights, args.num_steps) for runner in runners], weights
        pbar = tqdm.tqdm(range(1, num_iterations + 1))
        for iteration in pbar:
            if iteration == args.measure_burnin + 1:
                measure_start, measure_step = time.time(), global_step
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # in place: no recompile

            resample = lambda i: runners[i].sample.remote(calls_weights, args.num_steps)  # noqa: E731
            fragments = gather(ray, calls, resample, args.ray_timeout, args.runner_restarts + 1)
            # a runner that comes back in another process was restarted (also one that died between two calls)
            restarts += sum(old is not None and old != f["runner"] for old, f in zip(runner_processes, fragments))
            runner_processes = [f["runner"] for f in fragments]
            if args.double_buffer and iteration < num_iterations:
                # the next fragments are sampled during this update, with the weights from before it
                calls, calls_weights = [runner.sample.remote(weights, args.num_steps) for runner in runners], weights

            rollout = side_by_side(fragments, device)
            obs_rms.update(rollout["raw_obs"].flatten(0, 1).cpu().numpy())  # for the next fragments
            episodes = sorted((step, ret) for fragment in fragments for step, ret in fragment["episodes"])
            for step, episodic_return in episodes:
                episode_returns.append(episodic_return)
                curve.append([global_step + (step + 1) * num_envs, time.time() - start_time, episodic_return])
                if args.track:
                    wandb.log({"charts/episodic_return": episodic_return}, step=global_step + (step + 1) * num_envs)
            global_step += batch_size

            # ALGO LOGIC: the values of the pre-update critic, for the whole rollout in one pass each
            with torch.no_grad():
                values = get_value(rollout["obs"]).squeeze(-1)
                final_values = get_value(rollout["final_obs"]).squeeze(-1)  # gae reads them only where truncated
                next_value = get_value(rollout["next_obs"]).flatten()
            advantages, returns = compute_gae(
                rollout["rewards"], values, next_value, final_values,
                rollout["terminations"], rollout["truncations"], args.gamma, args.gae_lambda,
            )

            logprobs, behaviour_weights = rollout["logprobs"], torch.ones_like(rollout["logprobs"])
            if args.double_buffer:
                # the policy that sampled is one update behind: clip around the learner's policy (the proximal one)
                # and weight each sample by pi_prox / pi_behaviour (decoupled PPO, Hilton et al. 2021)
                with torch.no_grad():
                    _, logprobs, _ = get_action(rollout["obs"].flatten(0, 1), rollout["actions"].flatten(0, 1))
                logprobs = logprobs.view_as(behaviour_weights)
                behaviour_weights = (logprobs - rollout["logprobs"]).exp()

            # flatten the batch
            b = TensorDict(obs=rollout["obs"], actions=rollout["actions"], logprobs=logprobs, values=values,
                           behaviour_weights=behaviour_weights, batch_size=[args.num_steps, num_envs]).flatten(0, 1)
            b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()

            # Optimizing the policy and value network
            for epoch in range(args.update_epochs):
                b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
                for mb_inds in b_inds:
                    stats = update(b[mb_inds])
                if args.target_kl is not None and stats[4] > args.target_kl:  # host sync, once per epoch
                    break

            weights = ray.put(policy_state(agent, obs_rms))
            if not args.double_buffer and iteration < num_iterations:
                calls, calls_weights = [runner.sample.remote(weights, args.num_steps) for runner in runners], weights

            sps = (global_step - measure_step) / (time.time() - measure_start) if measure_start else 0.0
            return_mean = np.mean(episode_returns) if episode_returns else float("nan")
            pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
            if args.track:
                y_pred, y_true = b["values"], b["returns"]
                explained_var = 1 - (y_true - y_pred).var() / y_true.var()
                logs = torch.cat([stats, explained_var.reshape(1)]).tolist()  # host sync, once per iteration
                names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "explained_variance")
                lr = float(optimizer.param_groups[0]["lr"])
                wandb.log({f"losses/{k}": v for k, v in zip(names, logs)} | {"charts/learning_rate": lr, "charts/SPS": sps, "charts/runner_restarts": restarts}, step=global_step)

            if stop.is_set():  # Ctrl-C: stop after this iteration
                break
        end_time = time.time()
        if runners:
            memory = ray.get([runner.resident_memory_mib.remote() for runner in runners], timeout=args.ray_timeout)
            runner_memory_mib = max(memory) if None not in memory else None
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        if ray:
            ray.shutdown()  # ends the runners, and a local Ray instance with them

    model_file = os.path.join(run_dir, "ppo_continuous_action_ray.pt")
    if args.save_model:
        model = {"agent": agent.state_dict(), "obs_rms": obs_rms_state(obs_rms)}  # the normalization is part of the policy
        save_model(model_file, "ppo_continuous_action_ray", args, model)
    eval_returns = []
    if args.eval_episodes:  # the Gaussian's mean
        eval_returns = evaluate(agent.actor_mean, eval_envs, args.eval_episodes, args.seed, {"mean": obs_rms.mean, "var": obs_rms.var}, device)
    eval_envs.close()
    steps = global_step
    summary = {
        "script": "ppo_continuous_action_ray",
        "env_id": args.env_id,
        "seed": args.seed,
        "device": str(device),
        "compile": args.compile,
        "cudagraphs": args.cudagraphs,
        "num_envs": num_envs,
        "num_runners": args.num_runners,
        "double_buffer": args.double_buffer,
        "runner_restarts": restarts,
        "runner_memory_mib": runner_memory_mib,
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
    if args.track:
        wandb.finish()
    if stop.is_set():
        sys.exit(130)  # what a shell reports for a Ctrl-C


if __name__ == "__main__":
    main(tyro.cli(Args))
