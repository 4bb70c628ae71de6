"""Deep Q-Network for discrete actions, the optimized twin of dqn.py (same algorithm, same defaults).

Paper: https://www.nature.com/articles/nature14236. Defaults are CleanRL's (CartPole-v1, 500k steps).

    python leanrl/dqn_torchcompile.py                             # the benchmark run, eager
    python leanrl/dqn_torchcompile.py --compile                   # the update compiled whole (and on CUDA acting)
    python leanrl/dqn_torchcompile.py --compile --cudagraphs      # and replay them as CUDA graphs (CUDA only)
    python leanrl/dqn_torchcompile.py --total-timesteps 100000    # learns CartPole

What changes from dqn.py, all for speed: epsilon-greedy acting is one function on the device (the step it reads
lives in a device tensor that the function advances in place, so the schedule moves without a host sync or a
recompile); transitions are kept as the env's numpy arrays and written to a TensorDict buffer on the device once
per `train_frequency` iterations, one conversion per field, instead of once per step; a fused Adam; the target
update is one `lerp_` over the parameters' TensorDict; on the CPU one intra-op thread. `--compile` on CUDA wraps
acting and the update in `torch.compile`; on a CPU it compiles the update written as a function of the parameters
(`torch.func` gradients, Adam written out) as one graph and acts on the host, the eager twin's coin and the Q
network in numpy, writing the buffer through numpy views (torch's batch-1 calls, compiled or not, were slower
there): `cpu_fast_path` chooses.
`--cudagraphs` wraps them in tensordict's `CudaGraphModule` (it needs a CUDA device).

Epsilon falls linearly from `start_e` to `end_e` over the first `exploration_fraction` of the run.
`total_timesteps`, `learning_starts` and the epsilon schedule count environment steps; `train_frequency` and
`target_network_frequency` count iterations (vector steps), as in CleanRL, so with `--num-envs N` one
iteration is N env steps and the updates per env step drop by N. Truncated episodes bootstrap from their true
final observation; terminated ones do not.
"""

import functools
import json
import os
import random
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from torch.func import functional_call, grad_and_value


@dataclass
class Args:
    exp_name: str = "dqn_torchcompile"
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
    """record videos of the first environment to runs/<run_name>/videos/ (and of every evaluation episode)"""
    save_model: bool = False
    """save the weights the policy needs, with the run's arguments, to runs/<run_name>/<script>.pt at the end"""
    eval_episodes: int = 0
    """after training, play this many episodes with the trained policy and report their mean return (0: none)"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes episodes instead of training"""
    measure_burnin: int = 3
    """gradient steps after `learning_starts` excluded from `sps` (they compile and warm up)"""

    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500_000
    """total environment steps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments"""
    buffer_size: int = 10_000
    """the replay memory buffer size, in transitions"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: a hard copy)"""
    target_network_frequency: int = 500
    """the frequency of updates for the target network, in iterations"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` over which epsilon goes from `start_e` to `end_e`"""
    learning_starts: int = 10_000
    """environment steps before learning starts"""
    train_frequency: int = 10
    """one gradient step every `train_frequency` iterations"""

    compile: bool = False
    """compile the update (on a CPU as one functional graph) and, on CUDA, acting"""
    cudagraphs: bool = False
    """wrap the acting and the update in CUDA graphs (tensordict's CudaGraphModule); needs a CUDA device"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    for flag in ("total_timesteps", "num_envs", "buffer_size", "batch_size", "train_frequency", "target_network_frequency"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than --num-envs {args.num_envs}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.num_envs * args.train_frequency > args.buffer_size:
        fail(f"--buffer-size {args.buffer_size} cannot hold one training interval (--num-envs x --train-frequency)")
    if args.learning_starts < 0:
        fail(f"--learning-starts must be >= 0, got {args.learning_starts}")
    if not 0 < args.exploration_fraction <= 1:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if not 0 <= args.end_e <= 1 or not 0 <= args.start_e <= 1:
        fail("--start-e and --end-e must be in [0, 1]")
    if not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail("--tau must be in (0, 1] and --gamma in [0, 1]")
    if not args.learning_rate > 0:
        fail(f"--learning-rate must be positive, got {args.learning_rate}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")
    if args.eval_episodes < 0:
        fail(f"--eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.eval_model and args.eval_episodes == 0:
        fail("--eval-model needs --eval-episodes N, N > 0")


def make_env(env_id, seed, video_dir=None, video_episodes=None):
    def thunk():
        if video_dir is None:
            env = gym.make(env_id)
        else:
            env = gym.make(env_id, render_mode="rgb_array")
            if video_episodes is None:  # training: gymnasium's schedule, episodes 0, 1, 8, 27, ..., then every 1000th
                env = gym.wrappers.RecordVideo(env, video_dir, name_prefix="train", disable_logger=True)
            else:  # evaluation: its first `video_episodes` episodes
                record = lambda episode: episode < video_episodes  # noqa: E731
                env = gym.wrappers.RecordVideo(env, video_dir, record, name_prefix="eval", disable_logger=True)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(env_id, num_envs, seed, video_dir=None, video_episodes=None):
    """A vector env in same-step autoreset mode: the step that ends an episode returns the reset obs and puts the
    true final obs in `info["final_obs"]`; with `video_dir`, the first env records videos there (the first
    `video_episodes` episodes if given). A bad id, a non-Box observation space or a non-discrete action space exits
    with status 2."""
    if env_id not in gym.registry:
        fail(f"--env-id {env_id!r} is not a registered gymnasium environment")
    try:
        videos = [video_dir] + [None] * (num_envs - 1)  # the first env alone records
        thunks = [make_env(env_id, seed + i, videos[i], video_episodes) for i in range(num_envs)]
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except gym.error.Error as e:
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    if not isinstance(envs.single_observation_space, gym.spaces.Box):
        fail(f"--env-id {env_id!r} has a {type(envs.single_observation_space).__name__} observation space; DQN needs a Box")
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        fail(f"--env-id {env_id!r} has a {type(envs.single_action_space).__name__} action space; DQN needs a Discrete one")
    envs.action_space.seed(seed)  # the random actions of exploration
    return envs


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
    """Epsilon at env step `t` (a tensor): a line from `start_e` at 0 to `end_e` at `duration`, then flat."""
    slope = (end_e - start_e) / duration
    return (slope * t + start_e).clamp_min(end_e)


class ReplayBuffer:
    """A circular buffer of transitions, preallocated on `device`; `sample` draws uniformly with replacement. With
    `host` (the CPU fast path) writes go through numpy views of the tensors (the same memory): a numpy write costs a
    fraction of a torch one."""

    def __init__(self, buffer_size, n_obs, device, host=False):
        self.storage = TensorDict(
            obs=torch.zeros(buffer_size, n_obs, device=device),
            next_obs=torch.zeros(buffer_size, n_obs, device=device),
            actions=torch.zeros(buffer_size, dtype=torch.long, device=device),
            rewards=torch.zeros(buffer_size, device=device),
            terminations=torch.zeros(buffer_size, device=device),
            batch_size=[buffer_size],
            device=device,
        )
        self.views = self.storage.numpy() if host else None
        self.buffer_size, self.cursor, self.size, self.device = buffer_size, 0, 0, device

    def extend(self, transitions):
        """Write a list of per-step transitions (dicts of host arrays) at once: one conversion and one copy per key,
        not one per step."""
        n = sum(len(t["obs"]) for t in transitions)
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        device_idx = None if self.views is not None else torch.as_tensor(idx, device=self.device)
        for key, column in self.storage.items():
            values = np.concatenate([t[key] for t in transitions])
            if self.views is not None:
                self.views[key][idx] = values
            else:
                column[device_idx] = torch.as_tensor(values, dtype=column.dtype).to(self.device, non_blocking=True)
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):
        idx = torch.randint(0, self.size, (batch_size,), device=self.device)
        return self.storage[idx]


def make_update(q_network, target_network, optimizer, gamma):
    """One gradient step of the TD loss on a batch; returns the loss and the mean Q of the taken actions."""

    def update(data):
        with torch.no_grad():
            target_max, _ = target_network(data["next_obs"]).max(dim=1)
            td_target = data["rewards"] + gamma * target_max * (1 - data["terminations"])
        old_val = q_network(data["obs"]).gather(1, data["actions"].unsqueeze(-1)).squeeze(-1)
        loss = F.mse_loss(td_target, old_val)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach(), old_val.mean().detach()

    return update


def make_update_target(q_network, target_network, tau):
    """Move the target network's parameters a fraction `tau` of the way to the online ones (tau=1: a copy)."""
    params, target_params = from_module(q_network).data, from_module(target_network).data

    def update_target():
        # one in-place lerp over all parameters: target + tau * (online - target), exactly online when tau=1
        target_params.lerp_(params, tau)

    return update_target


def make_policy(q_network, n_act, global_step, start_e, end_e, duration):
    """Epsilon-greedy on the device, one coin for all envs as in CleanRL. `global_step` is a device tensor the policy reads and
    advances in place (by the number of envs), so the schedule moves with no host sync and no recompile."""

    def policy(obs):
        epsilon = linear_schedule(start_e, end_e, duration, global_step)
        with torch.no_grad():
            q_values = q_network(obs)
        explore = torch.rand((), device=obs.device) < epsilon
        random_actions = torch.randint(0, n_act, (obs.shape[0],), device=obs.device)
        global_step.add_(obs.shape[0])
        return torch.where(explore, random_actions, q_values.argmax(dim=1))

    return policy


def make_host_policy(q_network, n_act, start_e, end_e, duration):
    """Epsilon-greedy on the host, for a CPU: the eager twin's Python coin, and the Q network in numpy, run only when
    the coin says exploit. At batch 1 a torch call costs more to dispatch than its arithmetic, a numpy call much
    less. The arrays are views of the network's weights, which the fast path's Adam updates in place, so the policy
    always acts with the current ones. Same schedule, one coin for all envs; the step is a Python int the policy
    advances by the number of envs. Numpy observations in, numpy actions out."""
    layers = [(layer.weight.detach().numpy(), layer.bias.detach().numpy()) for layer in q_network.network[::2]]
    step = 0

    def policy(obs):
        nonlocal step
        epsilon = max(end_e, start_e + (end_e - start_e) * step / duration)
        step += len(obs)
        if random.random() < epsilon:
            return np.random.randint(n_act, size=len(obs))
        (w1, b1), (w2, b2), (w3, b3) = layers  # Linear, ReLU, Linear, ReLU, Linear
        x = np.maximum(obs @ w1.T + b1, 0)
        x = np.maximum(x @ w2.T + b2, 0)
        return (x @ w3.T + b3).argmax(axis=1)

    return policy


class Adam:
    """torch.optim.Adam's step (no weight decay, no amsgrad) written out on a dict of tensors, in place. Called inside
    a compiled update it becomes part of that update's graph; `torch.optim.Adam.step` would break the graph."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        # beta1**t and beta2**t as running products (tensors: nothing recompiles). Inductor inlines a power of a
        # step-count tensor into the CPU update kernel, once per vector of every parameter: 2-3x slower steps
        device = next(iter(params.values())).device
        self.beta1_power, self.beta2_power = torch.ones((), device=device), torch.ones((), device=device)

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


def make_functional_update(q_network, target_network, args):
    """The update of `make_update` written as a function of the parameters, for a CPU: `torch.func` takes the
    gradients and Adam is written out, so `torch.compile(fullgraph=True)` makes the whole update, from the forward
    pass to the parameters' step, one graph (autograd's `backward` and an optimizer's `step` would split it). The
    parameters are the network's own tensors, updated in place. Returns the update and its Adam optimizer."""
    params = {name: p.data for name, p in q_network.named_parameters()}
    optimizer = Adam(params, args.learning_rate)

    def loss_fn(params, data, td_target):
        old_val = functional_call(q_network, params, (data["obs"],)).gather(1, data["actions"].unsqueeze(-1)).squeeze(-1)
        return F.mse_loss(td_target, old_val), old_val.mean()

    def update(data):
        with torch.no_grad():
            target_max, _ = target_network(data["next_obs"]).max(dim=1)
            td_target = data["rewards"] + args.gamma * target_max * (1 - data["terminations"])
        grads, (loss, q_mean) = grad_and_value(loss_fn, has_aux=True)(params, data, td_target)
        optimizer.step(grads)
        return loss, q_mean

    return update, optimizer


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


def cpu_fast_path(args, device):
    """The one choice made per device (README, "Where the time goes"). On a CPU, `--compile` compiles the functional
    update as one graph (with a C++ wrapper: fewer Python calls per kernel) and acts on the host in numpy with the
    eager twin's coin: a compiled module update and torch acting, compiled or not, ran slower there. On CUDA (and under
    `--cudagraphs`), the module update and the device-side policy, which CUDA graphs replay."""
    return args.compile and not args.cudagraphs and device.type == "cpu"


def make_learner(args, n_obs, n_act, device):
    """DQN's networks, optimizer and step functions on `device`, as `main` runs them (tests build them here too).
    Returns the Q network, the optimizer and the functions (policy, update, update_target)."""
    q_network = QNetwork(n_obs, n_act, device=device)
    target_network = QNetwork(n_obs, n_act, device=device)
    target_network.load_state_dict(q_network.state_dict())
    exploration_steps = args.exploration_fraction * args.total_timesteps
    if cpu_fast_path(args, device):
        update, optimizer = make_functional_update(q_network, target_network, args)
        policy = make_host_policy(q_network, n_act, args.start_e, args.end_e, exploration_steps)
    else:
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, **adam_options(args.cudagraphs))
        update = make_update(q_network, target_network, optimizer, args.gamma)
        global_step = torch.zeros((), dtype=torch.long, device=device)
        policy = make_policy(q_network, n_act, global_step, args.start_e, args.end_e, exploration_steps)
    update_target = make_update_target(q_network, target_network, args.tau)
    return q_network, optimizer, (policy, update, update_target)


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


def evaluate(act, envs, episodes, seed, device):
    """The returns of `episodes` episodes played on `envs` (one env) with `act(obs) -> actions`, in order."""
    obs, _ = envs.reset(seed=seed)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device, dtype=torch.float))
        obs, _, _, _, infos = envs.step(actions.cpu().numpy())
        returns += finished_episodes(infos)
    return returns[:episodes]


def stop_on_ctrl_c():
    """The first Ctrl-C asks the training loop to stop after the current step: the run then evaluates, saves and
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
    saved_model = load_model(args.eval_model, "dqn_torchcompile", args.env_id) if args.eval_model else None
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)  # summary.json, the model and the videos go here
    stop = stop_on_ctrl_c()
    os.makedirs(run_dir, exist_ok=True)
    videos = os.path.join(run_dir, "videos") if args.capture_video else None
    if args.capture_video:
        check_rendering(args.env_id)
    envs = make_envs(args.env_id, args.num_envs, args.seed, None if args.eval_model else videos)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=run_name, save_code=True)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if device.type == "cpu":
        # every op here is tiny (batch 1 acting, batch 128 update): waking a second thread costs more than it
        # saves, and on a shared CPU an oversubscribed thread pool can stall a step for milliseconds
        torch.set_num_threads(1)

    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(envs.single_action_space.n)
    q_network, _, (policy, update, update_target) = make_learner(args, n_obs, n_act, device)
    if saved_model is not None:
        q_network.load_state_dict(saved_model)
    if cpu_fast_path(args, device):
        update = torch.compile(update, fullgraph=True, options={"cpp_wrapper": True})
    elif args.compile:
        policy = torch.compile(policy, fullgraph=True)
        update = torch.compile(update)
    if args.cudagraphs:
        policy = cuda_graph(policy, args.compile)
        update = cuda_graph(update, args.compile)

    rb = ReplayBuffer(args.buffer_size, n_obs, device, host=cpu_fast_path(args, device))
    if cpu_fast_path(args, device):  # the host policy takes and gives numpy arrays
        as_policy_obs, as_env_action = functools.partial(np.asarray, dtype=np.float32), np.asarray
    else:
        as_policy_obs = functools.partial(torch.as_tensor, device=device, dtype=torch.float)
        as_env_action = lambda actions: actions.cpu().numpy()  # noqa: E731
    obs, _ = envs.reset(seed=args.seed)
    episode_returns = deque(maxlen=20)
    curve = []  # [global_step, seconds since start, return] of every finished episode
    num_iterations = 0 if args.eval_model else args.total_timesteps // args.num_envs
    learning_starts = args.learning_starts // args.num_envs
    transitions = []
    qf_loss = q_mean = torch.zeros((), device=device)
    start_time = time.time()
    measure_start, measure_step = None, 0
    steps = 0  # environment steps done
    pbar = tqdm.tqdm(range(num_iterations), mininterval=1.0)
    for iteration in pbar:
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin * args.train_frequency + 1:
            measure_start, measure_step = time.time(), global_step

        # ALGO LOGIC: put action logic here
        actions = as_env_action(policy(as_policy_obs(obs)))

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        for episodic_return in finished_episodes(infos):
            episode_returns.append(episodic_return)
            curve.append([global_step, time.time() - start_time, episodic_return])
            if args.track:
                wandb.log({"charts/episodic_return": episodic_return}, step=global_step)

        transition = {
            "obs": obs,
            "next_obs": true_next_obs(next_obs, infos),
            "actions": actions,
            "rewards": rewards,
            "terminations": terminations,
        }
        transitions.append(transition)  # numpy arrays until the next write

        # CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if iteration % args.train_frequency == 0:
            rb.extend(transitions)
            transitions.clear()
        if iteration > learning_starts:
            if iteration % args.train_frequency == 0:
                data = rb.sample(args.batch_size)
                qf_loss, q_mean = update(data)

            if iteration % args.target_network_frequency == 0:
                update_target()

        if iteration % 100 == 0:
            sps = (global_step - measure_step) / (time.time() - measure_start) if measure_start else 0.0
            return_mean = np.mean(episode_returns) if episode_returns else float("nan")
            pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
            if args.track:
                exploration_steps = args.exploration_fraction * args.total_timesteps
                epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, torch.tensor(global_step))
                logs = torch.stack([qf_loss, q_mean]).tolist() + [epsilon.item()]  # host sync
                names = ("losses/td_loss", "losses/q_values", "charts/epsilon")
                wandb.log(dict(zip(names, logs)) | {"charts/SPS": sps}, step=global_step)

        steps = global_step + args.num_envs
        if stop.is_set():  # Ctrl-C: stop after this step
            break

    end_time = time.time()
    model_file = os.path.join(run_dir, "dqn_torchcompile.pt")
    if args.save_model:
        save_model(model_file, "dqn_torchcompile", args, q_network.state_dict())
    eval_returns = []
    if args.eval_episodes:  # greedy
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, args.eval_episodes)
        eval_returns = evaluate(lambda obs: q_network(obs).argmax(dim=1), eval_envs, args.eval_episodes, args.seed, device)
        eval_envs.close()
    summary = {
        "script": "dqn_torchcompile",
        "env_id": args.env_id,
        "seed": args.seed,
        "device": str(device),
        "compile": args.compile,
        "cudagraphs": args.cudagraphs,
        "num_envs": args.num_envs,
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
    envs.close()
    if args.track:
        wandb.finish()
    if stop.is_set():
        sys.exit(130)  # what a shell reports for a Ctrl-C


if __name__ == "__main__":
    main(tyro.cli(Args))
