"""Proximal Policy Optimization (https://arxiv.org/abs/1707.06347) for continuous actions, with
rollouts sampled by Ray actors. Grown from the optimized twin ppo_continuous_action_torchcompile.py:
`diff` against it shows what sampling on Ray changes. Defaults are CleanRL's (HalfCheetah-v4, 1M
steps, 2048 steps per iteration).

    # 2 runners x 4 envs
    python leanrl/ppo_continuous_action_ray.py --num-envs 4 --num-steps 256 --double-buffer
    # join a running cluster (`ray start`)
    python leanrl/ppo_continuous_action_ray.py --ray-address 10.0.0.1:6379

Each runner is a Ray actor with `--num-envs` envs and a CPU copy of the policy; it returns
fragments of `--num-steps` steps. The learner normalizes observations and updates as the twin.
`--double-buffer` samples during the update with weights one update old, under Hilton et al.'s
decoupled objective (arxiv.org/abs/2110.00641). Runners restart when they die and end with the
run; a silent one ends it after `--ray-timeout` (docs/scaling-ray.md). A resumed run continues
the learner and the observation statistics exactly, while its runners start fresh episodes,
seeded from the step (the summary's `resumes` say `fresh_episodes: true`).
"""

import json
import math
import os
import pickle
import random
import re
import signal
import socket
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
    """use a CUDA device for the learner when there is one, else the CPU (runners use theirs)"""
    track: bool = False
    """log to Weights and Biases (the only way wandb is touched)"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of the evaluation episodes to runs/<run_name>/videos/ (runners record none)"""
    save_model: bool = False
    """save the policy's weights and the run's arguments to runs/<run_name>/<script>.pt"""
    eval_episodes: int = 0
    """after training, play this many episodes with the policy and report their mean return"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes episodes instead of training"""
    measure_burnin: int = 3
    """iterations (rollout + update) excluded from `sps`: runners start, functions compile"""
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
    num_runners: int = 2
    """the number of env runners (Ray actors, one CPU each)"""
    num_envs: int = 1
    """the number of environments of each runner, stepped in turn in a vector env"""
    num_steps: int = 1024
    """the number of vector steps of each fragment (of each runner, each iteration)"""
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

    double_buffer: bool = False
    """sample each runner's next fragment during the update, with weights one update old"""
    ray_address: str | None = None
    """join the Ray cluster at this host:port (default: a local instance on loopback)"""
    ray_timeout: float = 120.0
    """seconds a runner may take to start or to return a fragment, else the run ends"""
    runner_restarts: int = 3
    """how many times Ray restarts each runner that dies before the run gives up"""

    compile: bool = False
    """compile GAE and the update's loss with `torch.compile` (runners act eagerly)"""
    cudagraphs: bool = False
    """record the update as a CUDA graph (needs a CUDA device)"""


def make_env(env_id, seed, gamma, video_dir=None, video_episodes=None, obs_rms=None):
    def thunk():
        env = gym.make(env_id, render_mode=None if video_dir is None else "rgb_array")
        # evaluation (runners record nothing): its first `video_episodes` episodes
        if video_dir is not None:
            record = lambda episode: episode < video_episodes  # noqa: E731
            env = gym.wrappers.RecordVideo(
                env, video_dir, record, name_prefix="eval", disable_logger=True
            )
        if not isinstance(env.action_space, gym.spaces.Box):
            fail(
                f"--env-id {env_id!r} has a {type(env.action_space).__name__} action space; PPO "
                "here needs a Box"
            )
        env = gym.wrappers.FlattenObservation(env)
        # before the normalization: it records the raw returns
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        # evaluation: the learner's statistics, frozen (runners use `normalize`)
        if obs_rms is not None:
            env = gym.wrappers.NormalizeObservation(env)
            env.obs_rms.mean, env.obs_rms.var = obs_rms["mean"].numpy(), obs_rms["var"].numpy()
            env.obs_rms.count, env.update_running_mean = float(obs_rms["count"]), False
            env = gym.wrappers.TransformObservation(
                env, lambda obs: np.clip(obs, -10, 10), env.observation_space
            )
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(env_id, num_envs, seed, gamma, video_dir=None, video_episodes=None, obs_rms=None):
    """Vector env, same-step autoreset; the first env records `video_episodes` to `video_dir`, if
    given; `obs_rms` normalizes observations, frozen (else raw). A bad id or action space exit 2."""
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

    def get_action(self, x, action=None):
        """An action (sampled unless given), its log-probability and the policy's entropy: what a
        runner needs."""
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
        return action, log_prob.sum(1), entropy.sum(1)

    def get_action_and_value(self, x, action=None):
        return *self.get_action(x, action), self.critic(x)


class ObservationStatistics(RunningMeanStd):
    """gymnasium's running mean and variance, with a state for checkpoints."""

    def state_dict(self):
        return dict(mean=self.mean, var=self.var, count=self.count)

    def load_state_dict(self, state):
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


def normalize(obs, obs_rms):
    """Raw `obs` normalized with `obs_rms` as NormalizeObservation does, clipped to [-10, 10]."""
    obs = (obs - obs_rms["mean"]) / np.sqrt(obs_rms["var"] + 1e-8)
    return np.clip(obs, -10, 10).astype(np.float32)


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


def make_learner(args, n_obs, n_act, device):
    """PPO's agent, optimizer and step functions on `device`."""
    agent = Agent(n_obs, n_act, device=device)
    # a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # fused: one kernel for all parameters; capturable: the only Adam torch records in a graph
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=args.cudagraphs
    )

    def loss_fn(mb):
        """The clipped-surrogate loss of a minibatch (a TensorDict) and its statistics. The ratio
        is taken against `logprobs`, the proximal policy's; `behaviour_weights` correct for the
        policy that sampled."""
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
        # the decoupled objective: weighted by pi_prox / pi_behaviour (1 without --double-buffer)
        pg_loss = (torch.max(pg_loss1, pg_loss2) * mb["behaviour_weights"]).mean()

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
        # the forward and backward; the clip and Adam's step stay eager
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb):
        """One gradient step on a minibatch; its statistics."""
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    # the learner's values read the weights through a copy that shares their memory, without
    # autograd state
    agent_inference = Agent(n_obs, n_act, device=device)
    from_module(agent).data.to_module(agent_inference)
    return SimpleNamespace(
        agent=agent,
        optimizer=optimizer,
        get_value=agent_inference.get_value,
        get_action=agent_inference.get_action,
        update=update,
    )


class EnvRunner:
    """An env runner, run as a Ray actor: `num_envs` environments seeded `seed`, `seed + 1`, ...
    and a CPU copy of the policy. A restarted runner starts again here: fresh environments, the
    same seeds."""

    def __init__(self, env_id, num_envs, seed, gamma):
        # one core per runner: acting on a batch of `num_envs` gains nothing from more threads
        torch.set_num_threads(1)
        self.envs = make_envs(env_id, num_envs, seed, gamma)
        n_obs = int(np.prod(self.envs.single_observation_space.shape))
        # weights come with each call
        self.agent = Agent(n_obs, int(np.prod(self.envs.single_action_space.shape)))
        self.next_obs, _ = self.envs.reset(seed=seed)  # raw: each call normalizes with its stats
        torch.manual_seed(seed)  # the action noise

    def sample(self, policy, num_steps):
        """`num_steps` vector steps acting with `policy` ({"agent", "obs_rms"}): tensors
        [num_steps, num_envs, ...] (`obs` normalized, `raw_obs` for the learner's statistics,
        `final_obs` the true next obs, normalized), `next_obs` for the bootstrap, `episodes`
        [(step, return)] that ended, and `runner`, this process."""
        self.agent.load_state_dict(policy["agent"])
        n_envs, n_obs = self.next_obs.shape
        shapes = dict(obs=(n_obs,), raw_obs=(n_obs,), final_obs=(n_obs,))
        shapes |= dict(actions=self.envs.single_action_space.shape, logprobs=(), rewards=())
        shapes |= dict(terminations=(), truncations=())
        fragment = {k: np.zeros((num_steps, n_envs, *s), np.float32) for k, s in shapes.items()}
        episodes = []
        for step in range(num_steps):
            fragment["raw_obs"][step] = self.next_obs
            obs = fragment["obs"][step] = normalize(self.next_obs, policy["obs_rms"])
            with torch.no_grad():
                action, logprob, _ = self.agent.get_action(torch.from_numpy(obs))
            fragment["actions"][step], fragment["logprobs"][step] = action.numpy(), logprob.numpy()
            self.next_obs, reward, terminations, truncations, infos = self.envs.step(
                fragment["actions"][step]
            )
            fragment["rewards"][step] = reward
            fragment["terminations"][step] = terminations
            fragment["truncations"][step] = truncations
            final_obs = true_next_obs(self.next_obs, infos)
            fragment["final_obs"][step] = normalize(final_obs, policy["obs_rms"])
            episodes += [(step, episodic_return) for episodic_return in finished_episodes(infos)]
        fragment["next_obs"] = normalize(self.next_obs, policy["obs_rms"])
        fragment = {key: torch.from_numpy(value) for key, value in fragment.items()}
        return fragment | {"episodes": episodes, "runner": f"{socket.gethostname()}:{os.getpid()}"}

    def resident_memory_mib(self):
        """This process' resident memory (VmRSS) in MiB, or None where /proc does not say."""
        try:
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return None


# What scaling out adds: a Ray cluster, runners on it, and calls that give up after a timeout


def check_address(address):
    """`--ray-address` must be host:port where something answers, else exit status 2 within 5
    seconds (Ray itself would retry for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        fail(f"--ray-address {address!r} is not host:port")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        fail(f"--ray-address {address}: no Ray head answers there ({e.strerror or e})")


def connect_ray(address):
    """The `ray` module, joined to the cluster whose head is at `address` (host:port), or to a
    local instance sized to this machine, on 127.0.0.1 only and without a dashboard."""
    if address is None or address.rpartition(":")[0] in ("127.0.0.1", "localhost"):
        # on Linux Ray replaces 127.0.0.1 by the machine's network address unless told that it
        # runs on one machine
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray  # after the line above: Ray reads that variable when it is imported

    # ray.init replaces it by an exit at once: `Run`'s again after
    on_sigterm = signal.getsignal(signal.SIGTERM)
    quiet = dict(logging_level="ERROR", log_to_driver=False)
    if address is None:
        ray.init(
            num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1", **quiet
        )
    else:
        try:
            ray.init(address=address, **quiet)
        # e.g. a head that wants a token: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN
        except ConnectionError as e:
            fail(
                f"--ray-address {address}: Ray did not let this process join "
                f"({str(e).splitlines()[0]}); with token authentication set RAY_AUTH_MODE=token "
                "and the cluster's token (RAY_AUTH_TOKEN or ~/.ray/auth_token)"
            )
    signal.signal(signal.SIGTERM, on_sigterm)
    return ray


def start_runners(ray, args, seed):
    """`args.num_runners` env runners, one CPU each, restarted by Ray when they die. Runner i
    steps the envs seeded `seed + i * num_envs`, ..., as one vector env of all would."""
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < args.num_runners:
        fail(
            f"--num-runners {args.num_runners} needs {args.num_runners} CPUs; the Ray cluster "
            f"has {cpus:g}"
        )
    runner = ray.remote(num_cpus=1, max_restarts=args.runner_restarts)(EnvRunner)
    seeds = [seed + i * args.num_envs for i in range(args.num_runners)]
    return [runner.remote(args.env_id, args.num_envs, seed, args.gamma) for seed in seeds]


def gather(ray, runners, calls, weights, args):
    """The fragment of each call in `calls`, one per runner. A runner that died is asked again,
    with the same `weights`, once Ray has restarted it. One that is silent for --ray-timeout,
    raises, or dies too often ends the run with one line and exit status 1."""
    fragments = []
    for i, call in enumerate(calls):
        failures = 0
        while True:
            try:
                fragments.append(ray.get(call, timeout=args.ray_timeout))
                break
            except ray.exceptions.GetTimeoutError:
                sys.exit(
                    f"error: runner {i} sent nothing within --ray-timeout {args.ray_timeout:g} s"
                )
            except ray.exceptions.RayActorError as e:
                failures += 1
                if failures > args.runner_restarts + 1:
                    sys.exit(
                        f"error: runner {i} is gone and Ray restarts it no more "
                        f"({type(e).__name__})"
                    )
                time.sleep(1.0)  # Ray restarts it meanwhile: a fresh process, fresh environments
                call = runners[i].sample.remote(weights, args.num_steps)
            except ray.exceptions.RayTaskError as e:
                cause = str(e.cause).splitlines()[0] if e.cause else type(e).__name__
                sys.exit(f"error: runner {i} failed: {cause}")
    return fragments


def policy_state(agent, obs_rms):
    """What the runners act with: the agent's weights on the CPU and the observation statistics."""
    weights = {name: value.detach().cpu() for name, value in agent.state_dict().items()}
    return {"agent": weights, "obs_rms": {"mean": obs_rms.mean, "var": obs_rms.var}}


def side_by_side(fragments, device):
    """The runners' fragments as one rollout, a TensorDict [num_steps, num_runners * num_envs] on
    `device`, and the observations after it, [num_runners * num_envs, n_obs]."""
    keys = "obs raw_obs actions logprobs rewards terminations truncations final_obs".split()
    rollout = {key: torch.cat([f[key] for f in fragments], dim=1) for key in keys}
    rollout = TensorDict(rollout, batch_size=rollout["rewards"].shape, device=device)
    return rollout, torch.cat([f["next_obs"] for f in fragments]).to(device)


def main(args):
    check_args(args)
    if args.ray_address and not args.eval_model:
        check_address(args.ray_address)
    # seeds, run folder, wandb, signals: see the end of the file
    run = Run(args, "ppo_continuous_action_ray")
    # here, before Ray starts: a bad --env-id exits 2 at once
    envs = make_envs(args.env_id, 1, args.seed, args.gamma)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(envs.single_action_space.shape))
    envs.close()  # the runners step the envs
    learner = make_learner(args, n_obs, n_act, device)
    agent, get_value, update = learner.agent, learner.get_value, learner.update
    # every env of every runner: the columns of the rollout
    num_envs = args.num_runners * args.num_envs
    scaling = dict(num_runners=args.num_runners, double_buffer=args.double_buffer)

    def evaluate_agent(episodes, videos):  # the Gaussian's mean
        obs_rms = model["obs_rms"]
        eval_envs = make_envs(args.env_id, 1, args.seed, args.gamma, videos, episodes, obs_rms)
        return evaluate(agent.actor_mean, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        model = run.saved_model
        agent.load_state_dict(model["agent"])
        scaling |= dict(runner_restarts=0, runner_memory_mib=None, num_envs=num_envs)
        run.finish(device, model, evaluate_agent, **scaling)
        return

    compute_gae = gae
    if args.compile:
        # GAE is one small graph per rollout (runners act eagerly)
        compute_gae = torch.compile(gae, fullgraph=True)
    if args.cudagraphs:
        # the first `warmup - 1` calls run as they are (Adam creates its state; a compiled function
        # compiles once more for it), the next records a CUDA graph, later calls replay it
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    batch_size = num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    # one normalization for every env of every runner
    obs_rms = ObservationStatistics(shape=(n_obs,))

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        return dict(learner=learner, obs_rms=obs_rms)  # the runners' envs: fresh on resume

    iterations = run.resume(training_state(), range(1, num_iterations + 1))
    global_step, restarts = run.steps, 0  # run.steps: 0 unless resumed
    runner_processes = [None] * args.num_runners  # host:pid of each runner
    ray = connect_ray(args.ray_address)
    try:
        # a resumed run's runners: fresh episodes, seeded from the step
        runners = start_runners(ray, args, args.seed + run.steps)

        def sample(weights):  # the runners' next fragments, and the weights they act with
            return [runner.sample.remote(weights, args.num_steps) for runner in runners], weights

        # the weights go to Ray's object store once per iteration; every runner reads them there
        weights = ray.put(policy_state(agent, obs_rms))
        calls, calls_weights = sample(weights)
        pbar = tqdm.tqdm(iterations)
        for iteration in pbar:
            if iteration == args.measure_burnin + 1:
                # sps counts from here: the runners' start and compile are behind
                run.start_clock(global_step)
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                # in place: no recompile
                learner.optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)

            # rollout: the runners' fragments, side by side
            fragments = gather(ray, runners, calls, calls_weights, args)
            # a runner that answers from another process was restarted (also between two calls)
            processes = [f["runner"] for f in fragments]
            restarts += sum(old not in (None, new) for old, new in zip(runner_processes, processes))
            runner_processes = processes
            if args.double_buffer and iteration < num_iterations:
                # the next fragments are sampled during this update, with the weights from before it
                calls, calls_weights = sample(weights)
            rollout, next_obs = side_by_side(fragments, device)
            obs_rms.update(rollout["raw_obs"].flatten(0, 1).cpu().numpy())  # for the next fragments
            episodes = sorted((step, r) for f in fragments for step, r in f["episodes"])
            for step, episodic_return in episodes:
                run.log_episodes(global_step + (step + 1) * num_envs, [episodic_return])
            global_step += batch_size

            # advantages, from the values of the pre-update critic, in one pass each
            with torch.no_grad():
                rollout["values"] = get_value(rollout["obs"]).squeeze(-1)
                # gae reads them where truncated
                rollout["final_values"] = get_value(rollout["final_obs"]).squeeze(-1)
                next_value = get_value(next_obs).flatten()
            keys = ("rewards", "values", "final_values", "terminations", "truncations")
            advantages, returns = compute_gae(
                **rollout.select(*keys),
                next_value=next_value,
                gamma=args.gamma,
                gae_lambda=args.gae_lambda,
            )
            rollout["behaviour_weights"] = torch.ones_like(rollout["logprobs"])
            if args.double_buffer:
                # the sampling policy is one update behind: clip around the learner's (proximal)
                # policy, weight each sample by pi_prox / pi_behaviour (Hilton et al. 2021)
                obs, actions = rollout["obs"].flatten(0, 1), rollout["actions"].flatten(0, 1)
                with torch.no_grad():
                    _, logprobs, _ = learner.get_action(obs, actions)
                behaviour_logprobs = rollout["logprobs"]
                rollout["logprobs"] = logprobs.view_as(behaviour_logprobs)
                rollout["behaviour_weights"] = (rollout["logprobs"] - behaviour_logprobs).exp()
            keys = ("obs", "actions", "logprobs", "values", "behaviour_weights")
            b = rollout.select(*keys).flatten(0, 1)
            b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()

            # update
            for _epoch in range(args.update_epochs):
                for mb_inds in torch.randperm(batch_size, device=device).split(minibatch_size):
                    stats = update(b[mb_inds])
                # host sync, once per epoch
                if args.target_kl is not None and stats[4] > args.target_kl:
                    break
            weights = ray.put(policy_state(agent, obs_rms))
            if not args.double_buffer and iteration < num_iterations:
                calls, calls_weights = sample(weights)

            # log
            explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
            names = "policy_loss value_loss entropy old_approx_kl approx_kl clipfrac".split()
            metrics = dict(zip(names, stats), explained_variance=explained_var)
            run.log_progress(pbar, global_step, metrics)
            run.steps = global_step
            run.checkpoint(iteration, training_state)  # when due, on a signal, at the end
            if run.stop_signal or run.diverged:  # a first Ctrl-C or SIGTERM, or divergence
                break
        memory = [runner.resident_memory_mib.remote() for runner in runners]
        memory = ray.get(memory, timeout=args.ray_timeout)
    # also on a failure; a second signal kills the driver, and Ray its runners
    finally:
        ray.shutdown()  # ends the runners, and a local Ray instance with them

    # the observation normalization is part of the policy: saved and evaluated with it
    obs_rms = {key: torch.as_tensor(getattr(obs_rms, key)) for key in ("mean", "var", "count")}
    model = {"agent": agent.state_dict(), "obs_rms": obs_rms}
    memory_mib = max(memory) if None not in memory else None
    scaling |= dict(runner_restarts=restarts, runner_memory_mib=memory_mib, num_envs=num_envs)
    run.finish(device, model, evaluate_agent, **scaling)


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
    positive = "total_timesteps num_runners num_envs num_steps num_minibatches update_epochs"
    for flag in positive.split() + [
        "learning_rate",
        "ray_timeout",
        "clip_coef",
        "max_grad_norm",
        "target_kl",
    ]:
        value = getattr(args, flag)
        if value is not None and value <= 0:  # --target-kl None: off
            fail(f"--{flag.replace('_', '-')} must be positive, got {value}")
    batch_size = args.num_steps * args.num_envs * args.num_runners
    if args.total_timesteps < batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one iteration ({batch_size} "
            "steps of all runners)"
        )
    if batch_size % args.num_minibatches or batch_size < 2 * args.num_minibatches:
        fail(
            f"--num-minibatches must split one iteration's {batch_size} steps into equal parts of "
            "2 or more"
        )
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.runner_restarts < 0:
        fail(f"--runner-restarts must be >= 0, got {args.runner_restarts}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail(
            "--cudagraphs needs a CUDA device and none is available (run without it, or with "
            "--compile)"
        )
    if args.capture_video and args.eval_episodes == 0:
        fail("--capture-video records the evaluation episodes here: add --eval-episodes N")


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
