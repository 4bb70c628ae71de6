"""Deep Q-Network for discrete actions: dqn_cpu.py as `--num-seeds N` runs in one vmapped program.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://www.nature.com/articles/nature14236. Defaults as in dqn_cpu.py, per member.

    python leanrl/dqn_seeds.py  # 8 members (seeds 1..8), compiled
    python leanrl/dqn_seeds.py --num-seeds 3 --no-compile  # the same functions, eagerly
    python leanrl/dqn_seeds.py --compile --cudagraphs  # on CUDA
    python leanrl/dqn_seeds.py --num-seeds 2 --learning-rate 1e-4 3e-4 1e-3 3e-3  # a sweep

Member k is dqn_cpu.py with `--seed seed + k * num_envs`: the same initial weights and env seeds,
its own target network, Adam state, replay buffer and random draws. A flag that takes several
values (`--learning-rate`, `--gamma`, `--tau`, `--start-e`, `--end-e`, `--exploration-fraction`)
makes a sweep: each setting of their grid is trained by `--num-seeds` members, with the same
seeds, and the run ends with a table of the settings, best first (docs/usage.md, "Sweeps").
`make_learner` writes one member's functions as dqn_cpu.py does, then vmaps them over a leading
seeds axis of the stacked parameters (`diff` the two files). Each step is one call for all
members: one vector env of N x `--num-envs` envs (member k's the k-th slice), one buffer write and
sample, one update. On a CPU the members act in numpy. A member whose loss or weights turn
non-finite is left out, and the others go on. The SUMMARY, model files and `--resume`, per
member: docs/usage.md, "The seeds scripts".
"""

from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from flags import CudaFlags, TensorEnvFlags, fail
from optimizers import Adam
from seeds import (
    MemberEpisodes,
    SeedsRun,
    check_memory,
    flat,
    member_values,
    member_view,
    per_member,
    settings,
    sweep_argv,
)
from tensordict.nn import CudaGraphModule
from threads import ThreadFlags
from torch.func import functional_call, grad_and_value, stack_module_state, vmap
from vector_envs import evaluate, make_envs, true_next_obs


@dataclass
class Args(TensorEnvFlags, CudaFlags, ThreadFlags):
    num_seeds: int = 8
    """the number of independent runs (members) trained together; in a sweep, of each setting"""
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500_000
    """environment steps of each member"""
    learning_rate: tuple[float, ...] = (2.5e-4,)
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments of each member"""
    buffer_size: int = 10_000
    """the replay memory buffer size of each member, in transitions"""
    gamma: tuple[float, ...] = (0.99,)
    """the discount factor gamma"""
    tau: tuple[float, ...] = (1.0,)
    """the target network update rate (1: a hard copy)"""
    target_network_frequency: int = 500
    """the frequency of updates for the target network, in iterations (vector steps)"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: tuple[float, ...] = (1.0,)
    """the starting epsilon for exploration"""
    end_e: tuple[float, ...] = (0.05,)
    """the ending epsilon for exploration"""
    exploration_fraction: tuple[float, ...] = (0.5,)
    """the fraction of `total_timesteps` over which epsilon falls from `start_e` to `end_e`"""
    learning_starts: int = 10_000
    """environment steps before learning starts"""
    train_frequency: int = 10
    """one gradient step every `train_frequency` iterations"""

    compile: bool = True
    """compile acting and the update, one graph each; --no-compile runs them eagerly"""
    cudagraphs: bool = False
    """acting and the update as CUDA graphs (tensordict's CudaGraphModule); needs CUDA"""


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
    """Epsilon at env step `t` (numbers, arrays or tensors): from `start_e` down to `end_e`, then
    flat."""
    epsilon = start_e + (end_e - start_e) * t / duration
    maximum = torch.maximum if isinstance(epsilon, torch.Tensor) else np.maximum
    return maximum(epsilon, end_e)


class ReplayBuffer:
    """dqn_cpu.py's buffer per member, stacked [num_seeds, buffer_size, ...]; each member samples
    its own. On `device`: on a CPU written through numpy views, on a GPU with torch."""

    def __init__(self, num_seeds, buffer_size, n_obs, device):
        where = dict(device=device)
        self.storage = dict(
            obs=torch.zeros(num_seeds, buffer_size, n_obs, **where),
            next_obs=torch.zeros(num_seeds, buffer_size, n_obs, **where),
            actions=torch.zeros(num_seeds, buffer_size, dtype=torch.long, **where),
            rewards=torch.zeros(num_seeds, buffer_size, **where),
            terminations=torch.zeros(num_seeds, buffer_size, **where),
        )
        on_cpu = device.type == "cpu"
        self.views = {key: column.numpy() for key, column in self.storage.items()} if on_cpu else {}
        self.buffer_size, self.cursor, self.size = buffer_size, 0, 0
        # the members' buffers end to end, and where each one starts: one index samples them all
        self.flat = {key: column.flatten(0, 1) for key, column in self.storage.items()}
        self.starts = torch.arange(num_seeds, **where).unsqueeze(1) * buffer_size

    def extend(self, transitions):  # the vector env's arrays: member k's envs the k-th slice
        n = sum(len(t["obs"]) for t in transitions) // len(self.starts)
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        for key, column in self.storage.items():
            rows = [per_member(t[key], len(column)) for t in transitions]
            if self.views:  # numpy's writes cost less than torch's on a CPU
                self.views[key][:, idx] = np.concatenate(rows, axis=1)  # at its dtype
            else:  # the index made on the device: a host array's copy would wait for the GPU
                rows = [torch.as_tensor(row, device=column.device) for row in rows]
                at = torch.arange(self.cursor, self.cursor + n, device=column.device)
                column[:, at % self.buffer_size] = torch.cat(rows, dim=1).to(column.dtype)
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):  # [num_seeds, batch_size, ...]
        shape = (len(self.starts), batch_size)
        idx = torch.randint(0, self.size, shape, device=self.starts.device) + self.starts
        batch = {key: value.index_select(0, idx.flatten()) for key, value in self.flat.items()}
        return {key: value.unflatten(0, idx.shape) for key, value in batch.items()}

    def state_dict(self):  # the filled part (a copy: torch.save writes a view's whole storage)
        storage = {key: value[:, : self.size].clone() for key, value in self.storage.items()}
        return dict(storage=storage, cursor=self.cursor, size=self.size)

    def load_state_dict(self, state):
        self.cursor, self.size = state["cursor"], state["size"]
        for key, value in state["storage"].items():
            self.storage[key][:, : self.size] = value


def make_learner(args, n_obs, n_act, seeds, device):
    """dqn_cpu.py's learner for every member, stacked on a leading seeds axis. Member k starts from
    the weights dqn_cpu.py draws with `--seed seeds[k]`."""
    q_networks = []
    for seed in seeds:
        with torch.random.fork_rng():  # the global generator is left as it was
            torch.manual_seed(seed)
            q_networks.append(QNetwork(n_obs, n_act, device=device))
    q_network = QNetwork(n_obs, n_act, device="meta")  # the shell that `functional_call` fills
    # the members' tensors, stacked, which Adam and update_target change in place
    params = {name: param.detach() for name, param in stack_module_state(q_networks)[0].items()}
    target_params = {name: param.clone() for name, param in params.items()}
    # each member's hyperparameters, [num_members] (a sweep's settings, each `--num-seeds` times)
    hp = member_values(args, len(seeds), device)
    optimizer = Adam(params, lr=hp["learning_rate"])
    exploration_steps = hp["exploration_fraction"] * args.total_timesteps
    # the env steps acted (by each member), which the policy advances in place
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

    def td_grads(params, target_params, data, gamma):
        target_max, _ = functional_call(q_network, target_params, (data["next_obs"],)).max(dim=1)
        td_target = data["rewards"] + gamma * target_max * (1 - data["terminations"])
        return grad_and_value(loss_fn, has_aux=True)(params, data, td_target)

    # ---- N seeds: the member functions above, vmapped over the leading seeds axis ----
    # Adam's step and update_target need no vmap: each op is elementwise, so on the stacked tensors
    # each member takes its own step (the betas' powers, one for all, count the steps they share)

    def policy(obs):
        """`act` for every member, a coin each: [num_seeds, num_envs, n_obs] in, [num_seeds,
        num_envs] out. A device tensor `global_step`: no host sync, no recompile."""
        epsilon = linear_schedule(hp["start_e"], hp["end_e"], exploration_steps, global_step)
        with torch.no_grad():
            actions = vmap(act, randomness="different")(params, obs, epsilon)
        global_step.add_(obs.shape[1])
        return actions

    def update(data):
        """One TD step as a function of the parameters: `torch.compile(fullgraph=True)` makes it
        one graph, forward pass to Adam's step (`backward` and `torch.optim` would split it)."""
        # each member's td_grads on its slice of the stacks and of the batch, [num_seeds, ...]
        grads, (loss, q_mean) = vmap(td_grads)(params, target_params, data, hp["gamma"])
        optimizer.step(grads)
        return loss, q_mean

    def update_target():
        """Moves the target a fraction `tau` of the way to the Q network (1: a copy)."""
        for name, target_param in target_params.items():
            tau = member_view(hp["tau"], target_param)
            target_param.copy_(tau * params[name] + (1 - tau) * target_param)

    return SimpleNamespace(
        policy=policy,
        global_step=global_step,
        hp=hp,
        params=params,
        target_params=target_params,
        optimizer=optimizer,
        update=update,
        update_target=update_target,
    )


def make_host_policy(params, n_act, global_step, start_e, end_e, duration):
    """The learner's policy in numpy on a CPU, as dqn_cpu.py's: a coin per member, and every
    member's Q network in one call (matmul broadcasts over the seeds axis) on views of the stacked
    weights. It restates `QNetwork.forward`, and a test holds it to it. CPU tensors in and out."""
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
    for setting in settings(args):  # each point of a sweep, as a single run's flags
        check_args(setting)
    # seeds.py: folder, seeds, sweep, threads, ...
    run = SeedsRun(args, "dqn_seeds")
    members = len(run.seeds)  # settings x seeds
    # one env first: its spaces and sizes, before N members' envs
    probe = make_envs(args.env_id, 1, args.seed)
    spaces = probe.single_observation_space, probe.single_action_space
    if not (isinstance(spaces[0], gym.spaces.Box) and isinstance(spaces[1], gym.spaces.Discrete)):
        fail(f"--env-id {args.env_id!r} has spaces {spaces}; DQN needs Box obs, Discrete actions")
    n_obs = int(np.prod(spaces[0].shape))
    n_act = int(spaces[1].n)
    probe.close()
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # 2 observations, 3 scalars, 8 bytes, on the device
    check_memory(members, args.buffer_size * (2 * n_obs + 3) * 8, "replay buffers", device)
    videos = None if args.eval_model else run.videos
    # member k's envs are the k-th slice; the tensor envs on the device
    envs = make_envs(
        args.env_id,
        args.num_envs * members,
        args.seed,
        videos,
        tensor=args.tensor_envs,
        device=device,
        compile=args.compile,
    )
    learner = make_learner(args, n_obs, n_act, run.seeds, device)
    params = learner.params

    def evaluate_greedy(member, episodes, videos):
        q_network = QNetwork(n_obs, n_act, device=device)
        q_network.load_state_dict(models[member])
        eval_envs = make_envs(args.env_id, 1, run.seeds[member], videos, episodes)
        greedy = lambda obs: q_network(obs).argmax(dim=1)  # noqa: E731
        return evaluate(greedy, eval_envs, episodes, run.seeds[member], device)

    if args.eval_model:  # the saved model as every member
        envs.close()
        models = [run.saved_model] * members
        return run.finish(device, models, evaluate_greedy)

    policy, update = learner.policy, learner.update
    if args.compile:  # one graph each; on a CPU, a C++ wrapper calls the update's kernels
        policy = torch.compile(policy, fullgraph=True)
        options = {"cpp_wrapper": device.type == "cpu"}
        update = torch.compile(update, fullgraph=True, options=options)
    if args.cudagraphs:
        # warm-up calls (compile compiles), one records, the rest replay
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)
    hp = {key: value.cpu().numpy() for key, value in learner.hp.items()}
    exploration_steps = hp["exploration_fraction"] * args.total_timesteps
    if device.type == "cpu":  # the members act in numpy: see make_host_policy
        schedule = (hp["start_e"], hp["end_e"], exploration_steps)
        policy = make_host_policy(params, n_act, learner.global_step, *schedule)

    rb = ReplayBuffer(members, args.buffer_size, n_obs, device)
    transitions, episodes = [], MemberEpisodes(members)
    # member k's env i seeded as dqn_cpu.py's with `--seed seeds[k]`: seeds[k] + i
    obs, _ = envs.reset(seed=run.env_seeds)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        if transitions:  # written now, where the next write would put them: the same buffer
            rb.extend(transitions)
            transitions.clear()
        episodes.flush(run)  # the run's curve, which the checkpoint keeps
        state = dict(
            global_step=learner.global_step,
            hp=learner.hp,
            params=learner.params,
            target_params=learner.target_params,
            optimizer=learner.optimizer,
        )
        return dict(learner=state, rb=rb, envs=(envs, obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    learning_starts = args.learning_starts // args.num_envs
    qf_loss = q_mean = torch.zeros(members)
    for iteration in run.progress(range(start, args.total_timesteps // args.num_envs)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin * args.train_frequency + 1:
            run.start_clock(global_step)  # compile and warm-up are behind

        # act
        member_obs = per_member(torch.as_tensor(obs, dtype=torch.float), members)
        actions = flat(policy(member_obs.to(device)))

        # step the envs (gymnasium's take the actions to the host)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        episodes.add(global_step, infos)  # logged with the progress: one host sync

        # store: a truncated episode bootstraps from its true last observation
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions)
        transition |= dict(rewards=rewards, terminations=terminations)
        transitions.append(transition)  # until the next write
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
            episodes.flush(run)
            epsilon = linear_schedule(hp["start_e"], hp["end_e"], exploration_steps, global_step)
            metrics = dict(td_loss=qf_loss, q_values=q_mean, epsilon=epsilon)
            run.log_progress(global_step, metrics)

        # the env steps so far; a checkpoint when due, on a signal, at the end
        run.checkpoint(iteration, training_state, global_step + args.num_envs)
        if run.stopped:  # a first Ctrl-C or SIGTERM, or no member left
            break

    episodes.flush(run)
    envs.close()
    # each member's weights as dqn_cpu.py's state dict (copies: a view would save the whole stack)
    models = [{name: p[k].clone() for name, p in params.items()} for k in range(members)]
    run.finish(device, models, evaluate_greedy)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
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
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args, args=sweep_argv(Args)))
