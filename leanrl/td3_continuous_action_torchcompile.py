"""Twin Delayed DDPG (TD3) for continuous actions, optimized: the twin of td3_continuous_action.py.

Paper: https://arxiv.org/abs/1802.09477. Hyperparameters are CleanRL's (1M steps, 25k random steps); the default env is
LeanRL's benchmark env, HalfCheetah-v4 (CleanRL's TD3 defaults to Hopper-v4).

    python leanrl/td3_continuous_action_torchcompile.py --compile               # fastest on a CPU
    python leanrl/td3_continuous_action_torchcompile.py --compile --cudagraphs  # fastest on a CUDA GPU
    python leanrl/td3_continuous_action_torchcompile.py --env-id Pendulum-v1 --total-timesteps 10000 --learning-starts 1000

Same algorithm, defaults and loop as the eager twin, data flow rewritten for speed: a TensorDict replay buffer on
the device, the twin critics as one vmapped ensemble, `lerp_` target updates, a fused Adam (capturable under
`--cudagraphs`). `--compile` on CUDA wraps acting and both updates in `torch.compile`; on a CPU it compiles each
update whole, forward pass to Adam step, as one graph: written as functions of the parameters (`torch.func`
gradients, Adam written out), since autograd's backward and an optimizer's step would split the graph; acting moves
to the host there, the actor in numpy on views of its weights and the replay buffer written through numpy views
(torch's batch-1 calls, compiled or not, were slower); `cpu_fast_path` chooses. `--cudagraphs` wraps them in tensordict's
`CudaGraphModule` (CUDA only). As in the eager twin, exploration noise is
drawn on the device, inside the acting policy. One critic step per vector step and one actor step (plus the target
updates) every `policy_frequency` vector steps, as in CleanRL, so with `--num-envs N` the updates per env step drop
by N. Pendulum-v1 learns in 10k steps. Truncated episodes bootstrap from their true final observation; terminated
ones do not."""

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
from tensordict import TensorDict, from_module, from_modules
from tensordict.nn import CudaGraphModule
from torch.func import functional_call, grad_and_value


@dataclass
class Args:
    exp_name: str = "td3_continuous_action"
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

    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total environment steps of the experiment"""
    num_envs: int = 1
    """the number of parallel environments"""
    learning_rate: float = 3e-4
    """the learning rate of both optimizers"""
    buffer_size: int = 1_000_000
    """the replay memory buffer size, in transitions"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    policy_noise: float = 0.2
    """the std of the noise on the target policy's actions (target policy smoothing), in half action ranges"""
    exploration_noise: float = 0.1
    """the std of the exploration noise on the acting policy's actions, in half action ranges"""
    learning_starts: int = 25_000
    """environment steps of random actions before learning starts"""
    policy_frequency: int = 2
    """the frequency of training policy (delayed): one actor step and one target update every this many critic steps"""
    noise_clip: float = 0.5
    """the target policy's noise is clipped to [-noise_clip, noise_clip], in half action ranges"""

    compile: bool = False
    """compile the updates (on a CPU as whole functional graphs) and, on CUDA, the policy"""
    cudagraphs: bool = False
    """record the policy and the update functions as CUDA graphs (needs a CUDA device)"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    for flag in ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency", "learning_rate"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    for flag in ("learning_starts", "policy_noise", "exploration_noise", "noise_clip"):
        if getattr(args, flag) < 0:
            fail(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail("--tau must be in (0, 1] and --gamma in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and none is available (run without it, or with --compile)")
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
    `video_episodes` episodes if given). A bad id or an action space that is not a bounded Box exits with status 2."""
    if env_id not in gym.registry:
        fail(f"--env-id {env_id!r} is not a registered gymnasium environment")
    try:
        videos = [video_dir] + [None] * (num_envs - 1)  # the first env alone records
        thunks = [make_env(env_id, seed + i, videos[i], video_episodes) for i in range(num_envs)]
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except gym.error.Error as e:
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        fail(f"--env-id {env_id!r} has a {type(envs.single_action_space).__name__} action space; TD3 needs a Box")
    if not envs.single_action_space.is_bounded():
        fail(f"--env-id {env_id!r} has an unbounded action space; TD3 needs finite bounds")
    envs.action_space.seed(seed)  # the random actions of the first `learning_starts` steps
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
        self.fc1 = nn.Linear(n_obs + n_act, 256, device=device)
        self.fc2 = nn.Linear(256, 256, device=device)
        self.fc3 = nn.Linear(256, 1, device=device)

    def forward(self, obs, actions):
        x = torch.cat([obs, actions], -1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Actor(nn.Module):
    def __init__(self, n_obs, n_act, action_low, action_high, device=None):
        super().__init__()
        self.fc1 = nn.Linear(n_obs, 256, device=device)
        self.fc2 = nn.Linear(256, 256, device=device)
        self.fc_mu = nn.Linear(256, n_act, device=device)
        # action rescaling, from tanh's (-1, 1) to the env's bounds
        high = torch.as_tensor(action_high, dtype=torch.float32, device=device)
        low = torch.as_tensor(action_low, dtype=torch.float32, device=device)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs):
        x = F.relu(self.fc1(obs))
        x = F.relu(self.fc2(x))
        return torch.tanh(self.fc_mu(x)) * self.action_scale + self.action_bias

    def clip(self, actions):
        """`actions` clipped to the env's bounds, [bias - scale, bias + scale]."""
        return actions.clamp(self.action_bias - self.action_scale, self.action_bias + self.action_scale)


class ReplayBuffer:
    """A circular buffer of transitions, preallocated on `device`; `sample` draws uniformly with replacement.
    One TensorDict holds every field, so adding or sampling a batch is one indexing call for all of them. With
    `host` (the CPU fast path) each step is written through numpy views of the tensors instead (the same memory):
    a numpy write costs a fraction of a torch one."""

    def __init__(self, buffer_size, n_obs, n_act, device, host=False):
        self.storage = TensorDict(
            obs=torch.zeros(buffer_size, n_obs, device=device),
            next_obs=torch.zeros(buffer_size, n_obs, device=device),
            actions=torch.zeros(buffer_size, n_act, device=device),
            rewards=torch.zeros(buffer_size, device=device),
            terminations=torch.zeros(buffer_size, device=device),
            batch_size=[buffer_size],
            device=device,
        )
        self.views = self.storage.numpy() if host else None
        self.buffer_size, self.cursor, self.size = buffer_size, 0, 0
        self.device = device

    def add(self, transition):
        """Write one vector step's transitions, a dict of arrays (the env's, and the actions)."""
        n = len(transition["obs"])
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        if self.views is not None:
            for key, view in self.views.items():
                view[idx] = transition[key]
        else:
            transition = {k: torch.as_tensor(v, device=self.device, dtype=torch.float) for k, v in transition.items()}
            self.storage[torch.as_tensor(idx, device=self.device)] = TensorDict(transition, [n])
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):
        idx = torch.randint(0, self.size, (batch_size,), device=self.device)
        return self.storage[idx]


def make_ensemble_qf(n_obs, n_act):
    """A function that runs a stack of Q-networks at once: `ensemble_qf(params, obs, actions)`, with `params` the
    stacked parameters of shape [k] (from `from_modules`), gives Q-values of shape [k, batch, 1]. `torch.vmap`
    maps over the stack, so each layer of both networks is one batched matmul."""
    # a weightless shell: the parameters are swapped in from `params` at each call
    qnet = QNetwork(n_obs, n_act, device="meta")

    def qf(params, obs, actions):
        with params.to_module(qnet):
            return qnet(obs, actions)

    return torch.vmap(qf, (0, None, None))


def make_policy(actor, exploration_noise):
    """The acting policy: the actor's action plus Gaussian noise of std `exploration_noise` half action ranges,
    drawn on the device, one draw per env and action dimension, clipped to the env's bounds."""

    def policy(obs):
        actions = actor(obs)
        actions = actions + torch.randn_like(actions) * actor.action_scale * exploration_noise
        return actor.clip(actions)

    return policy


@torch.no_grad()
def td_target(data, target_actor, ensemble_qf_target, qnet_target, args):
    """TD3's critic target: the smaller target Q-value of the smoothed target action, discounted, plus the reward."""
    # target policy smoothing: clipped noise on the target action, in half action ranges
    noise = (torch.randn_like(data["actions"]) * args.policy_noise).clamp(-args.noise_clip, args.noise_clip)
    next_actions = target_actor.clip(target_actor(data["next_obs"]) + noise * target_actor.action_scale)
    qf_next_target = ensemble_qf_target(qnet_target, data["next_obs"], next_actions)
    min_qf_next_target = qf_next_target.min(0).values
    return data["rewards"] + (1 - data["terminations"]) * args.gamma * min_qf_next_target.view(-1)


def make_updates(actor, target_actor, ensemble_qf, ensemble_qf_target, qnet_params, qnet_target, optimizers, args):
    """The critic step, the (delayed) actor step and the soft update of the three target networks of TD3.
    `optimizers` is (q, actor)."""
    q_optimizer, actor_optimizer = optimizers
    actor_params, target_actor_params = from_module(actor).data, from_module(target_actor).data

    def update_critic(data):
        next_q_value = td_target(data, target_actor, ensemble_qf_target, qnet_target, args)

        qf_a_values = ensemble_qf(qnet_params, data["obs"], data["actions"]).view(2, -1)
        qf_loss = (qf_a_values - next_q_value).pow(2).mean(1).sum()  # qf1's plus qf2's mean squared error

        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        return qf_loss.detach()

    def update_actor(data):
        # the actor climbs the first Q-network only
        actor_loss = -ensemble_qf(qnet_params.data[:1], data["obs"], actor(data["obs"])).mean()  # .data: no Q grads

        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        return actor_loss.detach()

    def update_targets():
        # soft update: tau * params + (1 - tau) * target
        # as one in-place lerp over all leaves of each TensorDict: target + tau * (params - target)
        target_actor_params.lerp_(actor_params, args.tau)
        qnet_target.lerp_(qnet_params.data, args.tau)

    return update_critic, update_actor, update_targets


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


def make_functional_updates(actor, target_actor, qnet_params, qnet_target, args):
    """The updates of `make_updates` written as functions of the parameters, for a CPU: `torch.func` takes the
    gradients and Adam is written out, so `torch.compile(fullgraph=True)` makes each update, from the forward pass to
    the parameters' step, one graph (autograd's `backward` and an optimizer's `step` would split it). The parameters
    are the modules' own tensors, updated in place. Returns the update functions and their Adam optimizers."""
    actor_params = {name: p.data for name, p in actor.named_parameters()}
    q_params = {name: p.data for name, p in qnet_params.flatten_keys(".").items()}
    q_target = dict(qnet_target.flatten_keys(".").items())
    optimizers = (Adam(q_params, args.learning_rate), Adam(actor_params, args.learning_rate))
    q_optimizer, actor_optimizer = optimizers
    # one Q-network as a function of its parameters, mapped over the stack of both networks' parameters
    qnet = QNetwork(actor.fc1.in_features, actor.fc_mu.out_features, device="meta")
    ensemble_qf = torch.vmap(lambda params, obs, actions: functional_call(qnet, params, (obs, actions)), (0, None, None))

    def qf_loss_fn(q_params, data, next_q_value):
        qf_a_values = ensemble_qf(q_params, data["obs"], data["actions"]).view(2, -1)
        return (qf_a_values - next_q_value).pow(2).mean(1).sum()  # qf1's plus qf2's mean squared error

    def actor_loss_fn(actor_params, obs):
        # the actor climbs the first Q-network only
        qf1_params = {name: p[0] for name, p in q_params.items()}
        return -functional_call(qnet, qf1_params, (obs, functional_call(actor, actor_params, (obs,)))).mean()

    def update_critic(data):
        next_q_value = td_target(data, target_actor, ensemble_qf, q_target, args)
        grads, qf_loss = grad_and_value(qf_loss_fn)(q_params, data, next_q_value)
        q_optimizer.step(grads)
        return qf_loss

    def update_actor(data):
        grads, actor_loss = grad_and_value(actor_loss_fn)(actor_params, data["obs"])
        actor_optimizer.step(grads)
        return actor_loss

    return update_critic, update_actor, optimizers


def make_host_policy(actor, exploration_noise, seed):
    """`make_policy` in numpy, for batch-1 acting on a CPU (the fast path): at batch 1 a torch call costs more to
    dispatch than its arithmetic, a numpy call much less. The arrays are views of the actor's weights, which the
    fast path's Adam updates in place, so the policy always acts with the current ones. Numpy observations in,
    numpy actions out; the Gaussian noise comes from numpy's generator, seeded with `seed`."""
    w = {name: p.detach().numpy() for name, p in actor.named_parameters()}
    action_scale, action_bias = actor.action_scale.numpy(), actor.action_bias.numpy()
    rng = np.random.default_rng(seed)

    def policy(obs):
        x = np.maximum(obs @ w["fc1.weight"].T + w["fc1.bias"], 0)
        x = np.maximum(x @ w["fc2.weight"].T + w["fc2.bias"], 0)
        actions = np.tanh(x @ w["fc_mu.weight"].T + w["fc_mu.bias"]) * action_scale + action_bias
        actions += rng.standard_normal(actions.shape, dtype=np.float32) * action_scale * exploration_noise
        return np.clip(actions, action_bias - action_scale, action_bias + action_scale)

    return policy


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
    updates, one graph each, and acts on the host in numpy, writing the replay buffer through numpy views: compiled
    module updates ran slower there than eager ones, and at batch 1 torch's dispatch, compiled or not, cost more than
    the arithmetic. On CUDA (and under `--cudagraphs`), the module updates and the device-side policy, which CUDA
    graphs replay."""
    return args.compile and not args.cudagraphs and device.type == "cpu"


def make_learner(args, n_obs, n_act, action_low, action_high, device):
    """TD3's networks, optimizers and step functions on `device`, as `main` runs them (tests build them here too).
    Returns the actor, the optimizers (q, actor) and the functions (policy, update_critic, update_actor,
    update_targets)."""
    actor = Actor(n_obs, n_act, action_low, action_high, device=device)
    target_actor = Actor(n_obs, n_act, action_low, action_high, device=device)
    target_actor.load_state_dict(actor.state_dict())
    qf1 = QNetwork(n_obs, n_act, device=device)
    qf2 = QNetwork(n_obs, n_act, device=device)
    qnet_params = from_modules(qf1, qf2, as_module=True)
    qnet_target = qnet_params.data.clone()
    # one shell for each parameter set: torch 2.13's compiler fails on two swaps into one shell in a graph
    ensemble_qf, ensemble_qf_target = make_ensemble_qf(n_obs, n_act), make_ensemble_qf(n_obs, n_act)
    q_optimizer = torch.optim.Adam(qnet_params.values(True, True), lr=args.learning_rate, **adam_options(args.cudagraphs))
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, **adam_options(args.cudagraphs))

    optimizers = (q_optimizer, actor_optimizer)
    update_critic, update_actor, update_targets = make_updates(
        actor, target_actor, ensemble_qf, ensemble_qf_target, qnet_params, qnet_target, optimizers, args
    )
    if cpu_fast_path(args, device):
        update_critic, update_actor, optimizers = make_functional_updates(actor, target_actor, qnet_params, qnet_target, args)
    if cpu_fast_path(args, device):
        policy = make_host_policy(actor, args.exploration_noise, args.seed)
    else:
        # acting reads the actor's weights through a copy that shares their memory but has no autograd state
        actor_detach = Actor(n_obs, n_act, action_low, action_high, device=device)
        from_module(actor).data.to_module(actor_detach)
        policy = make_policy(actor_detach, args.exploration_noise)
    return actor, optimizers, (policy, update_critic, update_actor, update_targets)


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
    saved_model = load_model(args.eval_model, "td3_continuous_action_torchcompile", args.env_id) if args.eval_model else None
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

    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(envs.single_action_space.shape))
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    actor, _, (policy, update_critic, update_actor, update_targets) = make_learner(args, n_obs, n_act, action_low, action_high, device)
    if saved_model is not None:
        actor.load_state_dict(saved_model)
    if cpu_fast_path(args, device):
        update_critic = torch.compile(update_critic, fullgraph=True)
        update_actor = torch.compile(update_actor, fullgraph=True)
    elif args.compile:
        policy = torch.compile(policy)
        update_critic = torch.compile(update_critic)
        update_actor = torch.compile(update_actor)
    if args.cudagraphs:
        policy = cuda_graph(policy, args.compile)
        update_critic = cuda_graph(update_critic, args.compile)
        update_actor = cuda_graph(update_actor, args.compile)

    rb = ReplayBuffer(args.buffer_size, n_obs, n_act, device, host=cpu_fast_path(args, device))
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
    qf_loss = actor_loss = torch.zeros((), device=device)
    start_time = time.time()
    measure_start, measure_step = None, 0
    steps = 0  # environment steps done
    pbar = tqdm.tqdm(range(num_iterations), mininterval=1.0)
    for iteration in pbar:
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin:
            measure_start, measure_step = time.time(), global_step

        # ALGO LOGIC: put action logic here
        if iteration < learning_starts:
            actions = envs.action_space.sample()
        else:
            with torch.no_grad():
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
        rb.add(transition)

        # CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if iteration >= learning_starts:
            data = rb.sample(args.batch_size)
            qf_loss = update_critic(data)

            if iteration % args.policy_frequency == 0:  # delayed policy updates, on the critic's batch
                actor_loss = update_actor(data)
                update_targets()

            if iteration % 100 == 0:
                sps = (global_step - measure_step) / (time.time() - measure_start) if measure_start else 0.0
                return_mean = np.mean(episode_returns) if episode_returns else float("nan")
                pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
                if args.track:
                    losses = torch.stack([qf_loss, actor_loss]).tolist()  # host sync
                    names = ("qf_loss", "actor_loss")
                    wandb.log({f"losses/{k}": v for k, v in zip(names, losses)} | {"charts/SPS": sps}, step=global_step)

        steps = global_step + args.num_envs
        if stop.is_set():  # Ctrl-C: stop after this step
            break

    end_time = time.time()
    model_file = os.path.join(run_dir, "td3_continuous_action_torchcompile.pt")
    if args.save_model:
        save_model(model_file, "td3_continuous_action_torchcompile", args, actor.state_dict())
    eval_returns = []
    if args.eval_episodes:  # the actor's action, no noise
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, args.eval_episodes)
        eval_returns = evaluate(actor, eval_envs, args.eval_episodes, args.seed, device)
        eval_envs.close()
    summary = {
        "script": "td3_continuous_action_torchcompile",
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
