"""PPO for continuous actions, its rollouts sampled by Ray actors: grown from the optimized twin
ppo_continuous_action_torchcompile.py, so `diff` against it shows what sampling on Ray changes.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps).

    python leanrl/ppo_continuous_action_ray.py --num-envs 4 --num-steps 256 --double-buffer
    # join a cluster (`ray start`)
    python leanrl/ppo_continuous_action_ray.py --ray-address 10.0.0.1:6379

Each runner, a Ray actor, steps `--num-envs` envs with a CPU copy of the policy and returns
fragments of `--num-steps` steps; the learner normalizes observations and updates as the twin.
`--double-buffer` samples during the update with weights one update old, under the decoupled
objective of Hilton et al. (arxiv.org/abs/2110.00641). A runner that dies restarts, a silent one
ends the run (docs/scaling-ray.md). A resumed run's runners start fresh episodes.
"""

import functools
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from flags import CudaFlags, fail
from gymnasium.wrappers.utils import RunningMeanStd
from runs import Run
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from vector_envs import evaluate, finished_episodes, make_envs, true_next_obs


@dataclass
class Args(CudaFlags):
    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total environment steps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_runners: int = 2
    """the number of env runners (Ray actors, a CPU each)"""
    num_envs: int = 1
    """the number of environments of each runner"""
    num_steps: int = 1024
    """the number of vector steps of each runner's fragment"""
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

    double_buffer: bool = False
    """sample the next fragments during the update, with weights one update old"""
    ray_address: str | None = None
    """join the Ray cluster at host:port (default: a local one, on loopback)"""
    ray_timeout: float = 120.0
    """seconds a runner may take to start or to return a fragment"""
    runner_restarts: int = 3
    """how often Ray restarts a runner that dies before the run gives up"""

    compile: bool = False
    """compile GAE and the update's loss (runners act eagerly)"""
    cudagraphs: bool = False
    """record the update as a CUDA graph (needs a CUDA device)"""


def wrap(env, gamma, obs_rms=None):
    """CleanRL's wrappers, but a runner's observations stay raw (`normalize` applies the learner's
    statistics); an evaluation normalizes them with `obs_rms`, a trained policy's, frozen."""
    if not isinstance(env.action_space, gym.spaces.Box):
        return env  # refused in main
    space = env.observation_space
    flatten = functools.partial(gym.spaces.flatten, space)
    env = gym.wrappers.TransformObservation(env, flatten, gym.spaces.flatten_space(space))
    space = env.action_space
    clip_action = functools.partial(np.clip, a_min=space.low, a_max=space.high)
    unbounded = gym.spaces.Box(-np.inf, np.inf, space.shape, space.dtype)
    env = gym.wrappers.TransformAction(env, clip_action, unbounded)
    clip = functools.partial(np.clip, a_min=-10, a_max=10)
    if obs_rms is not None:
        env = gym.wrappers.NormalizeObservation(env)
        env.obs_rms.mean, env.obs_rms.var = obs_rms["mean"].numpy(), obs_rms["var"].numpy()
        env.obs_rms.count, env.update_running_mean = float(obs_rms["count"]), False
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

    def get_action(self, x, action=None):
        """Without the value: what a runner needs."""
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
    """`obs` normalized by `obs_rms` as NormalizeObservation does, then clipped."""
    obs = (obs - obs_rms["mean"]) / np.sqrt(obs_rms["var"] + 1e-8)
    return np.clip(obs, -10, 10).astype(np.float32)


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


def make_learner(args, n_obs, n_act, device):
    """PPO's agent, optimizer and steps on `device`."""
    agent = Agent(n_obs, n_act, device=device)
    # a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # fused: one kernel for all parameters; capturable: the Adam a CUDA graph can record
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=args.cudagraphs
    )

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
        # the decoupled objective: weighted by pi_prox / pi_behaviour (1 without --double-buffer)
        pg_loss = (torch.max(pg_loss1, pg_loss2) * mb["behaviour_weights"]).mean()

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

    if args.compile:  # the forward and backward; the clip and the Adam step stay eager
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb):
        """One gradient step on a minibatch (a TensorDict); returns its statistics."""
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    # values read the weights through a copy that shares their memory, with no autograd state
    agent_inference = Agent(n_obs, n_act, device=device)
    from_module(agent).data.to_module(agent_inference)
    return SimpleNamespace(
        agent=agent,
        optimizer=optimizer,
        get_value=agent_inference.get_value,
        get_action=agent_inference.get_action,
        update=update,
    )


# a fragment's columns, [num_steps, num_envs, ...]; final_obs: the true next obs
FRAGMENT = "obs raw_obs final_obs actions logprobs rewards terminations truncations".split()


class EnvRunner:
    """A Ray actor: envs seeded `seed`, `seed + 1`, ... and a CPU copy of the policy. Restarted,
    it starts here again: fresh envs, the same seeds."""

    def __init__(self, env_id, num_envs, seed, gamma):
        # acting on `num_envs` observations gains nothing from more threads
        torch.set_num_threads(1)
        self.envs = make_envs(env_id, num_envs, seed, wrap=functools.partial(wrap, gamma=gamma))
        n_obs = int(np.prod(self.envs.single_observation_space.shape))
        # weights come with each call
        self.agent = Agent(n_obs, int(np.prod(self.envs.single_action_space.shape)))
        self.next_obs, _ = self.envs.reset(seed=seed)  # raw
        torch.manual_seed(seed)  # the action noise

    def sample(self, policy, num_steps):
        """`num_steps` vector steps by `policy` ({"agent", "obs_rms"}): the FRAGMENT columns,
        `next_obs`, the `episodes` that ended [(step, return)] and `runner`, this process."""
        self.agent.load_state_dict(policy["agent"])
        steps, episodes = [], []
        for step in range(num_steps):
            raw_obs, obs = self.next_obs, normalize(self.next_obs, policy["obs_rms"])
            with torch.no_grad():
                action, logprob, _ = self.agent.get_action(torch.from_numpy(obs))
            self.next_obs, *outcome, infos = self.envs.step(action.numpy())
            final_obs = normalize(true_next_obs(self.next_obs, infos), policy["obs_rms"])
            steps.append((obs, raw_obs, final_obs, action.numpy(), logprob.numpy(), *outcome))
            episodes += [(step, r) for r in finished_episodes(infos)]
        fragment = {k: np.stack(column) for k, column in zip(FRAGMENT, zip(*steps))}
        fragment["next_obs"] = normalize(self.next_obs, policy["obs_rms"])
        fragment = {k: torch.as_tensor(v, dtype=torch.float) for k, v in fragment.items()}
        return fragment | {"episodes": episodes, "runner": f"{socket.gethostname()}:{os.getpid()}"}

    def resident_memory_mib(self):
        """This process' resident memory in MiB (None without /proc)."""
        try:
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return None


# A Ray cluster, runners on it, and calls that give up after a timeout


def check_address(address):
    """Exit status 2 unless a head answers at `--ray-address` within 5 s (Ray would retry for
    minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        fail(f"--ray-address {address!r} is not host:port")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        fail(f"--ray-address {address}: no Ray head answers there ({e.strerror or e})")


def connect_ray(address):
    """`ray`, joined to the head at `address`, or to a local instance on 127.0.0.1 only."""
    if address is None or address.rpartition(":")[0] in ("127.0.0.1", "localhost"):
        # else Ray replaces 127.0.0.1 by the machine's network address
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray  # after the line above: Ray reads it on import

    on_sigterm = signal.getsignal(signal.SIGTERM)  # ray.init puts an exit at once in its place
    # a runner imports the run modules by name, and Ray puts only this file's folder on its path,
    # which another machine may lack: the modules travel with the job
    modules = dict.fromkeys(sys.modules[f.__module__] for f in (make_envs, fail))
    ship = dict(py_modules=list(modules))
    options = dict(logging_level="ERROR", log_to_driver=False, runtime_env=ship)
    if address is None:
        local = dict(num_cpus=os.cpu_count(), _node_ip_address="127.0.0.1")
        ray.init(include_dashboard=False, **local, **options)
    else:
        try:
            ray.init(address=address, **options)
        except ConnectionError as e:  # e.g. a head that wants a token
            cause = str(e).splitlines()[0]
            token = "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or ~/.ray/auth_token)"
            fail(f"--ray-address {address}: Ray did not let this process in ({cause}); set {token}")
    signal.signal(signal.SIGTERM, on_sigterm)
    return ray


def start_runners(ray, args, seed):
    """`args.num_runners` env runners, a CPU each, restarted by Ray when they die. Runner i steps
    the envs seeded `seed + i * num_envs`, ..., as one vector env of all would."""
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < args.num_runners:
        fail(f"--num-runners {args.num_runners} needs as many CPUs; the Ray cluster has {cpus:g}")
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
                sys.exit(f"error: runner {i} sent nothing in --ray-timeout {args.ray_timeout:g} s")
            except ray.exceptions.RayActorError as e:
                failures += 1
                if failures > args.runner_restarts + 1:
                    sys.exit(
                        f"error: runner {i} died; Ray restarts it no more ({type(e).__name__})"
                    )
                time.sleep(1.0)  # Ray restarts it meanwhile: a fresh process, fresh envs
                call = runners[i].sample.remote(weights, args.num_steps)
            except ray.exceptions.RayTaskError as e:
                cause = str(e.cause).splitlines()[0] if e.cause else type(e).__name__
                sys.exit(f"error: runner {i} failed: {cause}")
    return fragments


def policy_state(agent, obs_rms):
    """What the runners act with: the weights on the CPU and the observation statistics."""
    weights = {name: value.detach().cpu() for name, value in agent.state_dict().items()}
    return {"agent": weights, "obs_rms": {"mean": obs_rms.mean, "var": obs_rms.var}}


def side_by_side(fragments, device):
    """The fragments side by side: a rollout [num_steps, all envs] on `device`, and the
    observations after it."""
    rollout = {key: torch.cat([f[key] for f in fragments], dim=1) for key in FRAGMENT}
    rollout = TensorDict(rollout, batch_size=rollout["rewards"].shape, device=device)
    return rollout, torch.cat([f["next_obs"] for f in fragments]).to(device)


def main(args):
    check_args(args)
    if args.ray_address and not args.eval_model:
        check_address(args.ray_address)
    free_flags = ("ray_address", "ray_timeout", "runner_restarts")
    run = Run(args, "ppo_continuous_action_ray", free_flags)  # runs.py: folder, seeds, signals, ...
    # before Ray starts, a bad --env-id exits 2 at once; the runners step the envs
    envs = make_envs(args.env_id, 1, args.seed, wrap=functools.partial(wrap, gamma=args.gamma))
    envs.close()
    space = envs.single_action_space
    if not isinstance(space, gym.spaces.Box):
        fail(f"--env-id {args.env_id!r} has a {space} action space; PPO needs a Box")
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(space.shape))
    learner = make_learner(args, n_obs, n_act, device)
    agent, optimizer = learner.agent, learner.optimizer
    num_envs = args.num_runners * args.num_envs  # the rollout's columns
    scaling = dict(num_runners=args.num_runners, double_buffer=args.double_buffer)

    def evaluate_agent(episodes, videos):  # the Gaussian's mean; `obs_rms` is bound below
        eval_wrappers = functools.partial(wrap, gamma=args.gamma, obs_rms=obs_rms)
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes, eval_wrappers)
        return evaluate(agent.actor_mean, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        agent.load_state_dict(run.saved_model["agent"])
        obs_rms = run.saved_model["obs_rms"]
        scaling |= dict(runner_restarts=0, runner_memory_mib=None, num_envs=num_envs)
        return run.finish(device, run.saved_model, evaluate_agent, **scaling)

    get_value, update = learner.get_value, learner.update
    compute_gae = gae
    if args.compile:
        # GAE is one small graph; make_learner compiled the loss
        compute_gae = torch.compile(gae, fullgraph=True)
    if args.cudagraphs:
        # the first `warmup - 1` calls run as they are (Adam makes its state, compile compiles once
        # more), the next records a CUDA graph, later calls replay it
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    batch_size = num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    rms = ObservationStatistics(shape=(n_obs,))  # of every runner's envs

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(agent=learner.agent, optimizer=learner.optimizer)
        return dict(learner=state, obs_rms=rms)  # the runners' envs: fresh on resume

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    global_step, restarts = run.steps, 0  # run.steps: 0 unless resumed
    processes = [None] * args.num_runners  # host:pid of each runner
    ray = connect_ray(args.ray_address)  # it shuts down at exit, also after a failure
    runners = start_runners(ray, args, args.seed + run.steps)  # resumed: fresh episodes

    def sample(weights):  # the runners' next fragments, and the weights they act with
        return [runner.sample.remote(weights, args.num_steps) for runner in runners], weights

    # the weights go to Ray's object store once an iteration, where every runner reads them
    weights = ray.put(policy_state(agent, rms))
    calls, calls_weights = sample(weights)
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here: the runners have started
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            # in place: no recompile
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)

        # rollout: the runners' fragments, side by side
        fragments = gather(ray, runners, calls, calls_weights, args)
        # a runner that answers from another process was restarted (also between two calls)
        answered = [f["runner"] for f in fragments]
        restarts += sum(old not in (None, new) for old, new in zip(processes, answered))
        processes = answered
        if args.double_buffer and iteration < num_iterations - 1:
            # the next fragments are sampled during this update, with the weights from before it
            calls, calls_weights = sample(weights)
        rollout, next_obs = side_by_side(fragments, device)
        rms.update(rollout["raw_obs"].flatten(0, 1).cpu().numpy())
        episodes = sorted((step, r) for f in fragments for step, r in f["episodes"])
        for step, episodic_return in episodes:
            run.log_episodes(global_step + (step + 1) * num_envs, [episodic_return])
        global_step += batch_size

        # advantages, from the values of the pre-update critic, in one pass each
        with torch.no_grad():
            rollout["values"] = get_value(rollout["obs"]).squeeze(-1)
            rollout["final_values"] = get_value(rollout["final_obs"]).squeeze(-1)
            next_value = get_value(next_obs).flatten()
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
        b["behaviour_weights"] = torch.ones_like(b["logprobs"])
        if args.double_buffer:
            # the sampling policy is one update behind: clip around the learner's (proximal)
            # policy, weight each sample by pi_prox / pi_behaviour (Hilton et al. 2021)
            with torch.no_grad():
                _, logprobs, _ = learner.get_action(b["obs"], b["actions"])
            b["behaviour_weights"] = (logprobs - b["logprobs"]).exp()
            b["logprobs"] = logprobs
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                stats = update(b[mb_inds])
            # host sync, once per epoch
            if args.target_kl is not None and stats[4] > args.target_kl:
                break
        weights = ray.put(policy_state(agent, rms))
        if not args.double_buffer and iteration < num_iterations - 1:
            calls, calls_weights = sample(weights)

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        metrics = dict(zip(names, stats), explained_variance=explained_var)
        metrics["learning_rate"] = optimizer.param_groups[0]["lr"]
        run.log_progress(global_step, metrics)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break
    memory = ray.get([r.resident_memory_mib.remote() for r in runners], timeout=args.ray_timeout)
    ray.shutdown()  # ends the runners, and a local Ray instance with them

    # the observation normalization is part of the policy, saved with it
    obs_rms = {key: torch.as_tensor(getattr(rms, key)) for key in ("mean", "var", "count")}
    memory_mib = max(memory) if None not in memory else None
    scaling |= dict(runner_restarts=restarts, runner_memory_mib=memory_mib, num_envs=num_envs)
    model = {"agent": agent.state_dict(), "obs_rms": obs_rms}
    run.finish(device, model, evaluate_agent, **scaling)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    flags = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    flags += ("learning_rate", "clip_coef", "max_grad_norm", "target_kl")
    flags += ("num_runners", "ray_timeout")
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value <= 0:  # --target-kl None: off
            fail(f"--{flag.replace('_', '-')} must be positive, got {value}")
    batch_size = args.num_steps * args.num_envs * args.num_runners
    if args.total_timesteps < batch_size:
        rollout = "one iteration (--num-steps x --num-envs x --num-runners)"
        fail(f"--total-timesteps {args.total_timesteps} is less than {rollout}")
    if batch_size % args.num_minibatches or batch_size < 2 * args.num_minibatches:
        rollout = f"--num-steps x --num-envs x --num-runners ({batch_size})"
        fail(f"--num-minibatches must split {rollout} into equal parts of 2 or more")
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")
    if args.runner_restarts < 0:
        fail(f"--runner-restarts must be >= 0, got {args.runner_restarts}")
    if args.capture_video and args.eval_episodes == 0:
        fail("--capture-video records the evaluation episodes here: add --eval-episodes N")


if __name__ == "__main__":
    main(tyro.cli(Args))
