"""Proximal Policy Optimization (https://arxiv.org/abs/1707.06347) for continuous actions whose
rollouts come from Ray actors: grown from the optimized twin ppo_continuous_action_torchcompile.py,
so that `diff` against it shows what sampling on Ray changes. Defaults are CleanRL's
(HalfCheetah-v4, 1M steps, 2048 steps per iteration).

    # 2 runners x 4 envs
    python leanrl/ppo_continuous_action_ray.py --num-envs 4 --num-steps 256 --double-buffer
    # join a running cluster (`ray start`)
    python leanrl/ppo_continuous_action_ray.py --ray-address 10.0.0.1:6379

Each runner is a Ray actor with `--num-envs` envs and a CPU copy of the policy, returning fragments
of `--num-steps` steps; the learner normalizes observations and updates as the twin.
`--double-buffer` samples during the update with weights one update old, under Hilton et al.'s
decoupled objective (arxiv.org/abs/2110.00641). Runners restart when they die and end with the run;
a silent one ends it after `--ray-timeout` (docs/scaling-ray.md).
"""

import json
import math
import os
import random
import re
import signal
import socket
import sys
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
    """use a CUDA device for the learner when there is one, else the CPU (runners act on their
    CPU)"""
    track: bool = False
    """log to Weights and Biases (the only way wandb is touched)"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of the evaluation episodes to runs/<run_name>/videos/ (runners, maybe remote,
    record none)"""
    save_model: bool = False
    """save the weights the policy needs, with the run's arguments, to runs/<run_name>/<script>.pt
    at the end"""
    eval_episodes: int = 0
    """after training, play this many episodes with the trained policy and report their mean return
    (0: none)"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes episodes instead of training"""
    measure_burnin: int = 3
    """iterations (rollout + update) excluded from `sps` (they start the runners, compile and warm
    up)"""

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
    """the number of vector steps of each fragment (env steps per iteration: num_steps * num_envs *
    num_runners)"""
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
    """keep each runner's next fragment in flight during the update (sampled with the weights one
    update old)"""
    ray_address: str | None = None
    """join the Ray cluster at this host:port (`ray start --head` prints it); default: a local
    instance on loopback"""
    ray_timeout: float = 120.0
    """seconds a runner may take to start or to return a fragment before the run ends with one
    line"""
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


def normalize(obs, obs_rms):
    """Raw `obs` normalized with `obs_rms` (`mean`, `var`) as NormalizeObservation does, clipped to
    [-10, 10]."""
    return np.clip((obs - obs_rms["mean"]) / np.sqrt(obs_rms["var"] + 1e-8), -10, 10).astype(
        np.float32
    )


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
    `terminations[t]` / `truncations[t]` (0 or 1): the episode ended at step t in a terminal
    state / cut off; `final_values[t]`: the value of the true final obs of a truncated episode
    (read only there)."""
    dones = torch.maximum(terminations, truncations)
    # the value of the state after step t: the next step's value inside an episode; at an episode's
    # end, the value of its true final observation if it was cut off and 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1}, c_t = gamma * lambda * (1 - done_t), solved by doubling: after
    # the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of A_t and coefs[t] is
    # the product of their c's, so ceil(log2(num_steps)) vectorized rounds replace the loop
    # (unrolled, it would take minutes to compile)
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat(
            [advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]]
        )
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


def make_update(agent, optimizer, args, compile_loss=False):
    """One clipped-surrogate gradient step on a minibatch (a TensorDict); returns its statistics.
    The ratio is taken against `logprobs`, the proximal policy's; `behaviour_weights` correct
    for the policy that sampled. `compile_loss`: compile the forward and backward of the loss;
    the clip and the Adam step stay eager."""

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
        # the decoupled objective: weighted by pi_prox / pi_behaviour (1 without --double-buffer:
        # the twin's loss)
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
        return loss, torch.stack(
            [pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]
        ).detach()

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


def make_learner(args, n_obs, n_act, device):
    """PPO's agent, optimizer and step functions on `device`, as `main` runs them (tests build them
    here too). Returns the agent, the optimizer and the functions (get_value, get_action,
    update)."""
    agent = Agent(n_obs, n_act, device=device)
    # the learning rate is a tensor annealed in place: a captured graph reads its memory, and
    # nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # fused: one kernel for all parameters; capturable (under --cudagraphs): torch records no other
    # Adam in a graph
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=args.cudagraphs
    )
    update = make_update(agent, optimizer, args, compile_loss=args.compile)
    # the learner's values read the agent's weights through a copy that shares their memory but has
    # no autograd state
    agent_inference = Agent(n_obs, n_act, device=device)
    from_module(agent).data.to_module(agent_inference)
    return agent, optimizer, (agent_inference.get_value, agent_inference.get_action, update)


class EnvRunner:
    """An env runner, run as a Ray actor: `num_envs` environments (seeds `seed`, `seed + 1`, ...)
    in a vector env and a CPU copy of the policy. A restarted runner starts again from here:
    fresh environments, the same seeds."""

    def __init__(self, env_id, num_envs, seed, gamma):
        # one core per runner: batch-`num_envs` acting gains nothing from more threads
        torch.set_num_threads(1)
        self.envs = make_envs(env_id, num_envs, seed, gamma)
        n_obs = int(np.prod(self.envs.single_observation_space.shape))
        # weights come with each call
        self.agent = Agent(n_obs, int(np.prod(self.envs.single_action_space.shape)))
        self.next_obs, _ = self.envs.reset(seed=seed)  # raw: normalized with each call's statistics
        torch.manual_seed(seed)  # the action noise

    def sample(self, policy, num_steps):
        """A fragment of `num_steps` vector steps acting with `policy` ({"agent": state dict,
        "obs_rms"}): tensors [num_steps, num_envs, ...] (`obs` normalized as the policy saw them,
        `raw_obs` for the learner's statistics, `final_obs` the true next observation of each step,
        normalized), `next_obs` [num_envs, n_obs] normalized for the bootstrap, `episodes` [(step,
        return)] of the episodes that ended, and `runner`, this process."""
        self.agent.load_state_dict(policy["agent"])
        n_envs, n_obs = self.next_obs.shape
        shapes = dict(
            obs=(n_obs,),
            raw_obs=(n_obs,),
            final_obs=(n_obs,),
            actions=self.envs.single_action_space.shape,
        )
        shapes |= dict(logprobs=(), rewards=(), terminations=(), truncations=())
        fragment = {
            key: np.zeros((num_steps, n_envs, *shape), dtype=np.float32)
            for key, shape in shapes.items()
        }
        episodes = []
        for step in range(num_steps):
            fragment["raw_obs"][step] = self.next_obs
            fragment["obs"][step] = normalize(self.next_obs, policy["obs_rms"])
            with torch.no_grad():
                action, logprob, _ = self.agent.get_action(torch.from_numpy(fragment["obs"][step]))
            fragment["actions"][step], fragment["logprobs"][step] = action.numpy(), logprob.numpy()
            self.next_obs, reward, terminations, truncations, infos = self.envs.step(
                fragment["actions"][step]
            )
            fragment["rewards"][step] = reward
            fragment["terminations"][step], fragment["truncations"][step] = (
                terminations,
                truncations,
            )
            fragment["final_obs"][step] = normalize(
                true_next_obs(self.next_obs, infos), policy["obs_rms"]
            )
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


def check_address(address):
    """`--ray-address` must be host:port where something answers: else exit status 2 within 5
    seconds (Ray itself would retry for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        fail(f"--ray-address {address!r} is not host:port")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        fail(f"--ray-address {address}: no Ray head answers there ({e.strerror or e})")


def connect_ray(address):
    """Join the Ray cluster whose head is at `address` (host:port), or start a local Ray instance
    sized to this machine, listening on 127.0.0.1 only and without a dashboard; returns the
    `ray` module."""
    if address is None or address.rpartition(":")[0] in ("127.0.0.1", "localhost"):
        # on Linux Ray replaces 127.0.0.1 by the machine's network address unless told that it runs
        # on one machine
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray  # imported here, after the line above: Ray reads that variable when it is imported

    # ray.init replaces it by an exit at once: `Run`'s again after
    on_sigterm = signal.getsignal(signal.SIGTERM)
    if address is None:
        local = dict(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1")
        ray.init(**local, logging_level="ERROR", log_to_driver=False)
    else:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        # e.g. a head that wants a token: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN
        except ConnectionError as e:
            fail(
                f"--ray-address {address}: Ray did not let this process join "
                f"({str(e).splitlines()[0]}); with token "
                "authentication set RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN "
                "or ~/.ray/auth_token)"
            )
    signal.signal(signal.SIGTERM, on_sigterm)
    return ray


def start_runners(ray, args):
    """`args.num_runners` env runners, one CPU each, restarted by Ray when they die; runner i steps
    the envs seeded `seed + i * num_envs`, ... (as `num_runners * num_envs` envs of one vector
    env would be)."""
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < args.num_runners:
        fail(
            f"--num-runners {args.num_runners} needs {args.num_runners} CPUs; the Ray cluster has "
            f"{cpus:g}"
        )
    runner = ray.remote(num_cpus=1, max_restarts=args.runner_restarts)(EnvRunner)
    seeds = [args.seed + i * args.num_envs for i in range(args.num_runners)]
    return [runner.remote(args.env_id, args.num_envs, seed, args.gamma) for seed in seeds]


def gather(ray, runners, calls, weights, args):
    """The fragment of each call in `calls` (one per runner, in order); a runner that died is asked
    again, with the same `weights`, once Ray has restarted it. A runner silent for --ray-timeout s,
    that raises, or fails more than --runner-restarts + 1 times in a row ends the run with one line,
    exit status 1 (`main` then shuts Ray down)."""
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
    """The fragments of every runner as one rollout, a TensorDict [num_steps, num_runners *
    num_envs] on `device`, and the observations after it, [num_runners * num_envs, n_obs]."""
    keys = (
        "obs",
        "raw_obs",
        "actions",
        "logprobs",
        "rewards",
        "terminations",
        "truncations",
        "final_obs",
    )
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
    agent, optimizer, (get_value, get_action, update) = make_learner(args, n_obs, n_act, device)
    obs_rms = RunningMeanStd(shape=(n_obs,))  # one normalization for every env of every runner
    if run.saved_model is not None:
        agent.load_state_dict(run.saved_model["agent"])
        saved = run.saved_model["obs_rms"]
        obs_rms.mean, obs_rms.var, obs_rms.count = (
            saved["mean"].numpy(),
            saved["var"].numpy(),
            float(saved["count"]),
        )
    compute_gae = gae
    if args.compile:
        # GAE is one small graph per rollout; `make_update` compiled the loss (runners act eagerly)
        compute_gae = torch.compile(gae, fullgraph=True)
    if args.cudagraphs:
        # the first `warmup - 1` calls run as they are (Adam creates its state; a compiled function
        # compiles once more for it), the next records a CUDA graph, later calls replay it
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    # every env of every runner: the columns of the rollout
    num_envs = args.num_runners * args.num_envs
    batch_size = num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = 0 if args.eval_model else args.total_timesteps // batch_size
    global_step, restarts, runner_memory_mib = 0, 0, None
    runner_processes = [None] * args.num_runners  # host:pid of each runner
    ray = connect_ray(args.ray_address) if num_iterations else None
    try:
        runners = start_runners(ray, args) if num_iterations else []
        # the weights go to Ray's object store once per iteration; every runner reads them from
        # there
        weights = ray.put(policy_state(agent, obs_rms)) if num_iterations else None
        calls, calls_weights = (
            [runner.sample.remote(weights, args.num_steps) for runner in runners],
            weights,
        )
        pbar = tqdm.tqdm(range(1, num_iterations + 1))
        for iteration in pbar:
            if iteration == args.measure_burnin + 1:
                # sps counts from here: the runners' start and compile are behind
                run.start_clock(global_step)
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                # in place: no recompile
                optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)

            fragments = gather(ray, runners, calls, calls_weights, args)
            # a runner that comes back in another process was restarted (also one that died between
            # two calls)
            restarts += sum(
                old is not None and old != f["runner"]
                for old, f in zip(runner_processes, fragments)
            )
            runner_processes = [f["runner"] for f in fragments]
            if args.double_buffer and iteration < num_iterations:
                # the next fragments are sampled during this update, with the weights from before it
                calls, calls_weights = (
                    [runner.sample.remote(weights, args.num_steps) for runner in runners],
                    weights,
                )

            rollout, next_obs = side_by_side(fragments, device)
            obs_rms.update(rollout["raw_obs"].flatten(0, 1).cpu().numpy())  # for the next fragments
            episodes = sorted(
                (step, r) for fragment in fragments for step, r in fragment["episodes"]
            )
            for step, episodic_return in episodes:
                run.log_episodes(global_step + (step + 1) * num_envs, [episodic_return])
            global_step += batch_size

            # ALGO LOGIC: the values of the pre-update critic, for the whole rollout in one pass
            # each
            with torch.no_grad():
                rollout["values"] = get_value(rollout["obs"]).squeeze(-1)
                # gae reads them where truncated
                rollout["final_values"] = get_value(rollout["final_obs"]).squeeze(-1)
                next_value = get_value(next_obs).flatten()
            inputs = {
                key: rollout[key]
                for key in ("rewards", "values", "final_values", "terminations", "truncations")
            }
            advantages, returns = compute_gae(
                **inputs, next_value=next_value, gamma=args.gamma, gae_lambda=args.gae_lambda
            )

            rollout["behaviour_weights"] = torch.ones_like(rollout["logprobs"])
            if args.double_buffer:
                # the policy that sampled is one update behind: clip around the learner's policy
                # (the proximal one) and weight each sample by pi_prox / pi_behaviour (decoupled
                # PPO, Hilton et al. 2021)
                with torch.no_grad():
                    _, logprobs, _ = get_action(
                        rollout["obs"].flatten(0, 1), rollout["actions"].flatten(0, 1)
                    )
                behaviour_logprobs, rollout["logprobs"] = (
                    rollout["logprobs"],
                    logprobs.view_as(rollout["logprobs"]),
                )
                rollout["behaviour_weights"] = (rollout["logprobs"] - behaviour_logprobs).exp()

            b = rollout.select("obs", "actions", "logprobs", "values", "behaviour_weights").flatten(
                0, 1
            )
            b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()

            # Optimizing the policy and value network
            for _epoch in range(args.update_epochs):
                b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
                for mb_inds in b_inds:
                    stats = update(b[mb_inds])
                # host sync, once per epoch
                if args.target_kl is not None and stats[4] > args.target_kl:
                    break

            weights = ray.put(policy_state(agent, obs_rms))
            if not args.double_buffer and iteration < num_iterations:
                calls, calls_weights = (
                    [runner.sample.remote(weights, args.num_steps) for runner in runners],
                    weights,
                )

            explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
            names = (
                "policy_loss",
                "value_loss",
                "entropy",
                "old_approx_kl",
                "approx_kl",
                "clipfrac",
            )
            run.log_progress(
                pbar, global_step, dict(zip(names, stats), explained_variance=explained_var)
            )
            run.steps = global_step
            if run.stop_signal or run.diverged:  # a first Ctrl-C or SIGTERM, or divergence: stop
                break
        if runners:
            memory = ray.get(
                [runner.resident_memory_mib.remote() for runner in runners],
                timeout=args.ray_timeout,
            )
            runner_memory_mib = max(memory) if None not in memory else None
    # also on a failure (`gather`, `start_runners`); a second signal kills the driver, and Ray its
    # runners
    finally:
        if ray:
            ray.shutdown()  # ends the runners, and a local Ray instance with them

    # the observation normalization is part of the policy: saved and evaluated with it
    obs_rms = {key: torch.as_tensor(getattr(obs_rms, key)) for key in ("mean", "var", "count")}

    def evaluate_agent(episodes, videos):  # the Gaussian's mean
        eval_envs = make_envs(args.env_id, 1, args.seed, args.gamma, videos, episodes, obs_rms)
        return evaluate(agent.actor_mean, eval_envs, episodes, args.seed, device)

    scaling = dict(
        num_runners=args.num_runners, double_buffer=args.double_buffer, runner_restarts=restarts
    )
    # all runners' envs, not one runner's
    scaling |= dict(runner_memory_mib=runner_memory_mib, num_envs=num_envs)
    run.finish(device, {"agent": agent.state_dict(), "obs_rms": obs_rms}, evaluate_agent, **scaling)


# ==================================================================================================
# Run plumbing, the same in every single-process script: flag errors, the run folder and summary,
# wandb, Ctrl-C and SIGTERM, divergence, save, load, evaluation. `check_args` is this script's own.


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


def check_args(args):
    """Flag values that make no sense: one line naming the flag and exit status 2."""
    # nan passes every comparison below; past 1e30 float32 overflows
    for flag, value in vars(args).items():
        if isinstance(value, float) and not abs(value) <= 1e30:
            fail(
                f"--{flag.replace('_', '-')} must be a finite number, at most 1e30 in size, got "
                f"{value}"
            )
    # numpy's seeds are below 2**32, envpool's below 2**31
    if not 0 <= args.seed < 2**31 or args.measure_burnin < 0:
        fail(
            f"--seed must be in [0, 2**31) and --measure-burnin >= 0; got {args.seed} and "
            f"{args.measure_burnin}"
        )
    positive = (
        "total_timesteps",
        "num_runners",
        "num_envs",
        "num_steps",
        "num_minibatches",
        "update_epochs",
    )
    for flag in positive + (
        "learning_rate",
        "ray_timeout",
        "clip_coef",
        "max_grad_norm",
        "target_kl",
    ):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:  # --target-kl None: off
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
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
    """Everything around training: seeds, `runs/<run_name>/`, wandb, signals, the progress bar, the
    summary. A first Ctrl-C or SIGTERM sets `stop_signal` and a non-finite loss sets `diverged`:
    the loop stops after its step."""

    VARIANTS = r"_(torchcompile|cpu|distributed|ray|async|seeds)$"  # one algorithm, many scripts

    def __init__(self, args, script):
        if args.eval_episodes < 0 or (args.eval_model and args.eval_episodes == 0):
            n = args.eval_episodes
            fail(f"--eval-episodes must be >= 0, and > 0 with --eval-model, got {n}")
        self.args, self.script = args, script
        self.saved_model = self.load_model(args.eval_model) if args.eval_model else None
        self.name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.name = self.name.replace(":", "_")
        self.dir = os.path.join("runs", self.name)
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
            )
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        self.returns = deque(maxlen=20)  # the last 20 episodic returns
        self.curve = []  # [step, seconds, return] of every episode
        self.start_time, self.measure_start, self.measure_step = time.time(), None, 0
        self.steps, self.stop_signal, self.diverged = 0, 0, None
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

    def video_folder(self):
        """runs/<run_name>/videos, once we know that this machine can record the env."""
        os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders without a display
        try:
            __import__("moviepy")  # RecordVideo's writer
            env = gym.make(self.args.env_id, render_mode="rgb_array")
            env.reset(seed=0)
            assert isinstance(env.render(), np.ndarray), "no frame"
        except Exception as e:
            fail(f"--capture-video: {self.args.env_id} cannot record video here ({e!r})")
        return os.path.join(self.dir, "videos")

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
            model_file=model_file,
            eval_returns=[],
            eval_return_mean=None,
            **extra,
        )
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
