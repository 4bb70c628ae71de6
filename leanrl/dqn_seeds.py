"""Deep Q-Network for discrete actions: dqn_cpu.py as `--num-seeds N` runs in one vmapped program.

Paper: https://www.nature.com/articles/nature14236. Defaults are CleanRL's, per member.

    python leanrl/dqn_seeds.py                             # 8 members (seeds 1..8), compiled
    python leanrl/dqn_seeds.py --num-seeds 3 --no-compile  # 3 members, the same functions, eagerly
    python leanrl/dqn_seeds.py --compile --cudagraphs      # on CUDA, as CUDA graphs

Member k is dqn_cpu.py with `--seed seed + k * num_envs`: the same initial weights and env seeds,
its own target network, Adam state, replay buffer and random draws. `make_learner` writes one
member's functions as dqn_cpu.py does, then one block vmaps them over a leading seeds axis of the
stacked parameters: `diff leanrl/dqn_cpu.py leanrl/dqn_seeds.py` shows how N runs become one
program. Each step is one call for all members: one vector env of N x `--num-envs` envs (member k's
the k-th slice), one buffer write and sample, one update; on a CPU the members act in numpy, as in
dqn_cpu.py. A member whose loss or weights turn non-finite is left out, and the others go on. The
SUMMARY, model files and `--resume`, per member: docs/usage.md, "The seeds scripts".
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
import torch.nn.functional as F
import tqdm
import tyro
from tensordict.nn import CudaGraphModule
from torch.func import functional_call, grad_and_value, stack_module_state, vmap


@dataclass
class Args:
    exp_name: str = "dqn_seeds"
    """the name of this experiment"""
    seed: int = 1
    """seed of the first member; member k has seed `seed + k * num_envs`, its envs the next ones"""
    num_seeds: int = 8
    """the number of independent runs (members) trained together"""
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
    """record videos of the first env, and of evaluation, to runs/<run_name>/videos/"""
    save_model: bool = False
    """save each member's weights, with its arguments, to runs/<run_name>/<script>_seed<seed>.pt at
    the end"""
    eval_episodes: int = 0
    """after training, play this many episodes with each member's policy and report their mean
    returns (0: none)"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes episodes instead of training, as every
    member"""
    measure_burnin: int = 3
    """gradient steps after `learning_starts` left out of `sps` (compile, warm-up)"""
    checkpoint_minutes: float = 10.0
    """save the training state to runs/<run_name>/checkpoint.pt this often, and always on a first
    Ctrl-C or SIGTERM and at the end (0: only then)"""
    resume: str | None = None
    """continue the run of this checkpoint or run folder (`auto`: of runs/<run_name>, if any)"""
    run_name: str | None = None
    """the run folder's name under runs/ (default: <env_id>__<exp_name>__<seed>__<unix time>)"""

    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500_000
    """environment steps of each member"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments of each member"""
    buffer_size: int = 10_000
    """the replay memory buffer size of each member, in transitions"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: a hard copy)"""
    target_network_frequency: int = 500
    """the frequency of updates for the target network, in iterations (vector steps)"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` over which epsilon falls from `start_e` to `end_e`"""
    learning_starts: int = 10_000
    """environment steps before learning starts"""
    train_frequency: int = 10
    """one gradient step every `train_frequency` iterations"""

    compile: bool = True
    """compile acting and the update, one graph each; --no-compile runs the same functions
    eagerly"""
    threads: int | None = None
    """torch's intra-op threads (default 1; 2 pay on an idle machine)"""
    cudagraphs: bool = False
    """acting and the update as CUDA graphs (tensordict's CudaGraphModule); needs CUDA"""


def make_env(env_id, seed, video_dir=None, video_episodes=None):
    def thunk():
        env = gym.make(env_id, render_mode=None if video_dir is None else "rgb_array")
        if video_dir is not None:
            # gymnasium's schedule in training, the first `video_episodes` in evaluation
            record = None if video_episodes is None else lambda episode: episode < video_episodes
            prefix = "train" if video_episodes is None else "eval"
            env = gym.wrappers.RecordVideo(
                env, video_dir, record, name_prefix=prefix, disable_logger=True
            )
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(env_id, num_envs, seed, num_seeds, video_dir=None, video_episodes=None):
    """A vector env of `num_envs` envs per member, member k's the k-th slice (seeded as dqn_cpu.py's
    envs with `--seed seed + k * num_envs`); its first env records videos to `video_dir`, if given.
    """
    num_envs *= num_seeds  # one env loop per step for all members, not one per member
    try:
        videos = [video_dir] + [None] * (num_envs - 1)
        thunks = [make_env(env_id, seed + i, videos[i], video_episodes) for i in range(num_envs)]
        # same-step autoreset: the true last obs of an episode is in info["final_obs"]
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except (gym.error.Error, ModuleNotFoundError) as e:  # ModuleNotFoundError: `module:EnvId`
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    spaces = envs.single_observation_space, envs.single_action_space
    if not (isinstance(spaces[0], gym.spaces.Box) and isinstance(spaces[1], gym.spaces.Discrete)):
        fail(f"--env-id {env_id!r} has spaces {spaces}; DQN needs Box obs and Discrete actions")
    return envs


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


def true_next_obs(next_obs, infos):
    """`next_obs` with the true final observation of each episode that ended on this step, where
    same-step autoreset put the reset one: a truncated episode bootstraps from the state where it
    was cut."""
    real_next_obs = next_obs.copy()
    for idx in np.flatnonzero(infos.get("_final_obs", [])):
        real_next_obs[idx] = infos["final_obs"][idx]
    return real_next_obs


class QNetwork(nn.Module):
    def __init__(self, n_obs, n_act, device=None):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(n_obs, 120, device=device),
            nn.ReLU(),
            nn.Linear(120, 84, device=device),
            nn.ReLU(),
            nn.Linear(84, n_act, device=device),
        )

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step `t` (a number or a tensor): from `start_e` at 0 down to `end_e` at
    `duration`, then flat."""
    epsilon = start_e + (end_e - start_e) * t / duration
    return epsilon.clamp_min(end_e) if isinstance(epsilon, torch.Tensor) else max(epsilon, end_e)


class ReplayBuffer:
    """A circular buffer per member, stacked in CPU tensors [num_seeds, buffer_size, ...], written
    from numpy arrays through numpy views of the tensors (a numpy write costs a fraction of a torch
    one), sampled uniformly, each member from its own buffer, onto `device`."""

    def __init__(self, num_seeds, buffer_size, n_obs, device):
        self.storage = dict(
            obs=torch.zeros(num_seeds, buffer_size, n_obs),
            next_obs=torch.zeros(num_seeds, buffer_size, n_obs),
            actions=torch.zeros(num_seeds, buffer_size, dtype=torch.long),
            rewards=torch.zeros(num_seeds, buffer_size),
            terminations=torch.zeros(num_seeds, buffer_size),
        )
        self.views = {key: column.numpy() for key, column in self.storage.items()}
        self.buffer_size, self.cursor, self.size = buffer_size, 0, 0
        # the members' buffers end to end, and where each one starts: one index samples them all
        self.flat = {key: column.flatten(0, 1) for key, column in self.storage.items()}
        self.starts, self.device = torch.arange(num_seeds).unsqueeze(1) * buffer_size, device

    def extend(self, transitions):  # the vector env's arrays: member k's envs the k-th slice
        n = sum(len(t["obs"]) for t in transitions) // len(self.starts)
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        for key, view in self.views.items():
            columns = [per_member(t[key], len(view)) for t in transitions]
            view[:, idx] = np.concatenate(columns, axis=1)  # at its dtype
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):  # [num_seeds, batch_size, ...]
        idx = torch.randint(0, self.size, (len(self.starts), batch_size)) + self.starts
        batch = {key: value.index_select(0, idx.flatten()) for key, value in self.flat.items()}
        return {key: value.unflatten(0, idx.shape).to(self.device) for key, value in batch.items()}

    def state_dict(self):  # the filled part (a copy: torch.save writes a view's whole storage)
        storage = {key: value[:, : self.size].clone() for key, value in self.storage.items()}
        return dict(storage=storage, cursor=self.cursor, size=self.size)

    def load_state_dict(self, state):
        self.cursor, self.size = state["cursor"], state["size"]
        for key, value in state["storage"].items():
            self.storage[key][:, : self.size] = value


class Adam:
    """torch.optim.Adam's step (no weight decay, no amsgrad) written out on a dict of tensors, in
    place. Called inside a compiled update it becomes part of that update's graph;
    `torch.optim.Adam.step` would break the graph."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        # beta1**t and beta2**t as running products, tensors so that nothing recompiles: inductor
        # would inline a power of a step count into the kernel, once per vector: a slow step
        self.beta1_power, self.beta2_power = torch.ones(()), torch.ones(())

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

    def state_dict(self):  # the moments and the step (as the betas' powers), for checkpoints
        powers = dict(beta1_power=self.beta1_power, beta2_power=self.beta2_power)
        return dict(exp_avg=self.exp_avg, exp_avg_sq=self.exp_avg_sq) | powers

    def load_state_dict(self, state):  # in place: a compiled update holds these tensors
        for moments in ("exp_avg", "exp_avg_sq"):
            for name, value in state[moments].items():
                getattr(self, moments)[name].copy_(value)
        self.beta1_power.copy_(state["beta1_power"])
        self.beta2_power.copy_(state["beta2_power"])


def make_learner(args, n_obs, n_act, seeds, device):
    """The Q networks of the members, their targets, the optimizer and the steps that use them,
    stacked on a leading seeds axis. Member k starts from the weights dqn_cpu.py draws with
    `--seed seeds[k]`."""
    q_networks = []
    for seed in seeds:
        with torch.random.fork_rng():  # the global generator is left as it was
            torch.manual_seed(seed)
            q_networks.append(QNetwork(n_obs, n_act, device=device))
    q_network = QNetwork(n_obs, n_act, device="meta")  # the shell that `functional_call` fills
    # the members' tensors, stacked, which Adam and update_target change in place
    params = {name: param.detach() for name, param in stack_module_state(q_networks)[0].items()}
    target_params = {name: param.clone() for name, param in params.items()}
    with torch.device(device):  # Adam's powers of the betas beside the parameters
        optimizer = Adam(params, lr=args.learning_rate)
    exploration_steps = args.exploration_fraction * args.total_timesteps
    # the env steps acted (by each member), which the policy advances in place (a checkpoint
    # restores it there)
    global_step = torch.zeros((), dtype=torch.long, device=device)

    def act(params, obs, epsilon):
        """Epsilon-greedy with one coin for the member's envs, as CleanRL flips it."""
        q_values = functional_call(q_network, params, (obs,))
        explore = torch.rand((), device=obs.device) < epsilon
        random_actions = torch.randint(0, n_act, (obs.shape[0],), device=obs.device)
        return torch.where(explore, random_actions, q_values.argmax(dim=1))

    def loss_fn(params, data, td_target):
        q_values = functional_call(q_network, params, (data["obs"],))
        old_val = q_values.gather(1, data["actions"].unsqueeze(-1)).squeeze(-1)
        return F.mse_loss(td_target, old_val), old_val.mean()

    def td_grads(params, target_params, data):
        target_max, _ = functional_call(q_network, target_params, (data["next_obs"],)).max(dim=1)
        td_target = data["rewards"] + args.gamma * target_max * (1 - data["terminations"])
        return grad_and_value(loss_fn, has_aux=True)(params, data, td_target)

    # ---- N seeds: the member functions above, vmapped over the leading seeds axis ----
    # Adam's step and update_target need no vmap: each op is elementwise, so on the stacked tensors
    # each member takes its own step (the betas' powers, one for all, count the steps they share)

    def policy(obs):
        """`act` for every member, a coin each (vmap's `randomness="different"`): observations
        [num_seeds, num_envs, n_obs] in, actions [num_seeds, num_envs] out. `global_step` is a
        device tensor: the schedule moves with no host sync and no recompile."""
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        with torch.no_grad():
            actions = vmap(act, in_dims=(0, 0, None), randomness="different")(params, obs, epsilon)
        global_step.add_(obs.shape[1])
        return actions

    def update(data):
        """One TD step as a function of the parameters: `torch.compile(fullgraph=True)` makes it
        one graph, forward pass to Adam's step (`backward` and `torch.optim` would split it)."""
        # each member's td_grads on its slice of the stacks and of the batch, [num_seeds, ...]
        grads, (loss, q_mean) = vmap(td_grads)(params, target_params, data)
        optimizer.step(grads)
        return loss, q_mean

    def update_target():
        """Moves the target a fraction `tau` of the way to the Q network (1: a copy)."""
        for name, target_param in target_params.items():
            target_param.copy_(args.tau * params[name] + (1 - args.tau) * target_param)

    return SimpleNamespace(
        policy=policy,
        global_step=global_step,
        params=params,
        target_params=target_params,
        optimizer=optimizer,
        update=update,
        update_target=update_target,
    )


def make_host_policy(params, n_act, global_step, start_e, end_e, duration):
    """The learner's policy in numpy, for a CPU (a torch call, even compiled, costs more to dispatch
    than its arithmetic here): a coin per member, and every member's Q network in one call (matmul
    broadcasts over the seeds axis) on views of the stacked weights, which Adam updates in place.
    It restates `QNetwork.forward`, and a test holds it to it. CPU tensors in and out."""
    layers = [
        (params[f"network.{i}.weight"].numpy(), params[f"network.{i}.bias"].numpy()[:, None])
        for i in (0, 2, 4)
    ]

    def policy(obs):
        epsilon = linear_schedule(start_e, end_e, duration, int(global_step))
        global_step.add_(obs.shape[1])
        explore = np.random.random(len(obs)) < epsilon  # a coin per member
        random_actions = np.random.randint(n_act, size=obs.shape[:2])
        if explore.all():
            return torch.from_numpy(random_actions)
        (w1, b1), (w2, b2), (w3, b3) = layers
        x = np.maximum(obs.numpy() @ w1.mT + b1, 0)
        x = np.maximum(x @ w2.mT + b2, 0)
        greedy = (x @ w3.mT + b3).argmax(axis=2)
        return torch.from_numpy(np.where(explore[:, None], random_actions, greedy))

    return policy


def main(args):
    check_args(args)
    # one env first: its spaces and sizes, before N members' envs
    probe = make_envs(args.env_id, 1, args.seed, 1)
    n_obs = int(np.prod(probe.single_observation_space.shape))
    n_act = int(probe.single_action_space.n)
    probe.close()
    # 2 observations, 3 scalars, 8 bytes
    check_memory(args, args.buffer_size * (2 * n_obs + 3) * 8, "replay buffers")
    # seeds, run folder, wandb, signals: see the end of the file
    run = Run(args, "dqn_seeds")
    videos = None if args.eval_model else run.videos  # no training video
    envs = make_envs(args.env_id, args.num_envs, args.seed, args.num_seeds, videos)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    torch.set_num_threads(args.threads or 1)
    learner = make_learner(args, n_obs, n_act, run.seeds, device)
    params = learner.params

    def evaluate_greedy(member, episodes, videos):
        q_network = QNetwork(n_obs, n_act, device=device)
        q_network.load_state_dict(models[member])
        eval_envs = make_envs(args.env_id, 1, run.seeds[member], 1, videos, episodes)
        greedy = lambda obs: q_network(obs).argmax(dim=1)  # noqa: E731
        return evaluate(greedy, eval_envs, episodes, run.seeds[member], device)

    if args.eval_model:  # the saved model as every member
        envs.close()
        models = [run.saved_model] * args.num_seeds
        run.finish(device, models, evaluate_greedy)
        return

    policy, update = learner.policy, learner.update
    if args.compile:  # one graph each; on a CPU, a C++ wrapper calls the update's kernels
        policy = torch.compile(policy, fullgraph=True)
        options = {"cpp_wrapper": device.type == "cpu"}
        update = torch.compile(update, fullgraph=True, options=options)
    if args.cudagraphs:
        # the first calls run as they are (compiling, with --compile), the next records the graph,
        # later ones replay it
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)
    exploration_steps = args.exploration_fraction * args.total_timesteps
    if device.type == "cpu":  # the members act in numpy: see make_host_policy
        schedule = (args.start_e, args.end_e, exploration_steps)
        policy = make_host_policy(params, n_act, learner.global_step, *schedule)

    rb = ReplayBuffer(args.num_seeds, args.buffer_size, n_obs, device)
    transitions = []
    obs, _ = envs.reset(seed=args.seed)  # env i: seed + i, as in make_envs

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        if transitions:  # written now, where the next write would put them: the same buffer
            rb.extend(transitions)
            transitions.clear()
        return dict(learner=learner, rb=rb, envs=(envs, obs))

    iterations = run.resume(training_state(), range(args.total_timesteps // args.num_envs))
    learning_starts = args.learning_starts // args.num_envs
    qf_loss = q_mean = torch.zeros(args.num_seeds)
    pbar = tqdm.tqdm(iterations, mininterval=1.0)
    for iteration in pbar:
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin * args.train_frequency + 1:
            run.start_clock(global_step)  # compile and warm-up are behind

        # act
        member_obs = per_member(torch.as_tensor(obs, dtype=torch.float), args.num_seeds)
        actions = flat(policy(member_obs.to(device)).cpu().numpy())

        # step the envs
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        run.log_episodes(global_step, finished_episodes(infos, args.num_seeds))

        # store
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions)
        transition |= dict(rewards=rewards, terminations=terminations)
        transitions.append(transition)  # numpy arrays until the next write
        obs = next_obs

        # update
        if iteration % args.train_frequency == 0:
            rb.extend(transitions)
            transitions.clear()
        if iteration > learning_starts:
            if iteration % args.train_frequency == 0:
                qf_loss, q_mean = update(rb.sample(args.batch_size))
            if iteration % args.target_network_frequency == 0:
                learner.update_target()

        # log
        if iteration % 100 == 0:
            epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
            metrics = dict(td_loss=qf_loss, q_values=q_mean, epsilon=epsilon)
            run.log_progress(pbar, global_step, metrics)

        run.steps = global_step + args.num_envs
        run.checkpoint(iteration, training_state)  # when due, on a signal, at the end
        if run.stop_signal or len(run.diverged) == args.num_seeds:  # a signal, or no member left
            break

    envs.close()
    # each member's weights as dqn_cpu.py's state dict (copies: a view would save the whole stack)
    models = [{name: p[k].clone() for name, p in params.items()} for k in range(args.num_seeds)]
    run.finish(device, models, evaluate_greedy)


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
        # nan fails every comparison below; past 1e30 float32 overflows
        if isinstance(value, float) and not abs(value) <= 1e30:
            name = flag.replace("_", "-")
            fail(f"--{name} must be a finite number, at most 1e30 in size, got {value}")
    if not 0 <= args.seed <= 2**31 - args.num_seeds * args.num_envs:  # env seeds below 2**31
        fail(f"--seed must be in [0, 2**31 - num_seeds x num_envs], got {args.seed}")
    sizes = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "train_frequency")
    for flag in ("num_seeds", *sizes, "target_network_frequency", "learning_rate"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than --num-envs {args.num_envs}")
    if args.buffer_size < max(args.batch_size, args.num_envs * args.train_frequency):
        buffer = f"--buffer-size {args.buffer_size}"
        fail(f"{buffer} is smaller than --batch-size or --num-envs x --train-frequency")
    if args.learning_starts < 0 or not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail("--learning-starts must be >= 0, --tau in (0, 1] and --gamma in [0, 1]")
    epsilons = (args.start_e, args.end_e)
    if not 0 < args.exploration_fraction <= 1 or not all(0 <= e <= 1 for e in epsilons):
        fail("--exploration-fraction must be in (0, 1], --start-e and --end-e in [0, 1]")
    if args.threads is not None and args.threads <= 0:
        fail(f"--threads must be positive, got {args.threads}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")


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
