"""Twin Delayed DDPG (TD3) for continuous actions on a CPU, grown from
td3_continuous_action_torchcompile.py.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1802.09477. Hyperparameters are CleanRL's. The default env is
LeanRL's benchmark env, HalfCheetah-v4 (CleanRL's TD3 defaults to Hopper-v4).

    python leanrl/td3_continuous_action_cpu.py  # the benchmark run
    python leanrl/td3_continuous_action_cpu.py --env-id Pendulum-v1 \
        --total-timesteps 10000 --learning-starts 1000  # learns

The optimized twin's algorithm, defaults and loop, made fast on a CPU, which it always trains
on. Each update compiles as one graph, from the forward pass to the Adam step: it is a function
of the parameters, with `torch.func` gradients and optimizers.py's Adam, since `backward` and
an optimizer's `step` would split the graph. Acting runs in numpy on views of the actor's weights,
and the replay buffer is written through numpy views: at batch 1, numpy dispatches faster than
torch. The intra-op threads are chosen by measurement unless `--threads` fixes them
(docs/performance.md); `--bf16` computes the updates in bfloat16 on a CPU that has it.
"""

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from flags import TensorEnvFlags, fail
from optimizers import Adam
from runs import Run
from tensordict import TensorDict, from_modules
from threads import CPUFlags, step_guards
from torch.func import functional_call, grad_and_value
from vector_envs import evaluate, finished_episodes, make_envs, true_next_obs


@dataclass
class Args(TensorEnvFlags, CPUFlags):
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
    """the std of the target policy's smoothing noise, in half action ranges"""
    exploration_noise: float = 0.1
    """the std of the acting policy's noise, in half action ranges"""
    learning_starts: int = 25_000
    """environment steps of random actions before learning starts"""
    policy_frequency: int = 2
    """one actor step and one target update every this many critic steps"""
    noise_clip: float = 0.5
    """the target policy's noise is clipped to [-noise_clip, noise_clip]"""

    compile: bool = True
    """compile each update as one graph; --no-compile runs the same functions eagerly"""


def float32(layer, x):
    """`layer(x)` in float32, under --bf16's autocast too, its input upcast to the weights' dtype:
    the outputs the losses read keep their precision (in bfloat16 a Q-value of 500 would round to
    a multiple of 4)."""
    if not torch.is_autocast_enabled("cpu"):  # no autocast in the graph: AOTAutograd caches it
        return layer(x)
    with torch.autocast("cpu", enabled=False):
        return layer(x.to(layer.weight.dtype))


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
        return float32(self.fc3, x)


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
        return torch.tanh(float32(self.fc_mu, x)) * self.action_scale + self.action_bias

    def clip(self, actions):  # to the env's bounds, [bias - scale, bias + scale]
        return actions.clamp(
            self.action_bias - self.action_scale, self.action_bias + self.action_scale
        )


class ReplayBuffer:
    """A circular buffer of transitions in one TensorDict on `device`, sampled uniformly. Steps
    are written through numpy views of its tensors: a numpy write is cheaper than a torch one."""

    def __init__(self, buffer_size, n_obs, n_act, device):
        shapes = dict(obs=[n_obs], next_obs=[n_obs], actions=[n_act], rewards=[], terminations=[])
        storage = {k: torch.zeros(buffer_size, *s, device=device) for k, s in shapes.items()}
        self.storage = TensorDict(storage, batch_size=[buffer_size], device=device)
        self.views = self.storage.numpy()
        self.buffer_size, self.cursor, self.size, self.device = buffer_size, 0, 0, device

    def add(self, transition):
        """Write one vector step's transitions, a dict of numpy arrays."""
        n = len(transition["obs"])
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        for key, view in self.views.items():
            view[idx] = transition[key]
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):
        """A batch as a dict of tensors: cheaper to gather, and to hand a compiled update, than a
        TensorDict."""
        idx = torch.randint(0, self.size, (batch_size,), device=self.device)
        return {key: value.index_select(0, idx) for key, value in self.storage.items()}

    def state_dict(self):  # the filled part (a copy: torch.save writes a view's whole storage)
        storage = {key: value[: self.size].clone() for key, value in self.storage.items()}
        return dict(storage=storage, cursor=self.cursor, size=self.size)

    def load_state_dict(self, state):
        self.cursor, self.size = state["cursor"], state["size"]
        for key, value in state["storage"].items():
            self.storage[key][: self.size] = value


def qf_stats(qf_values, qf_losses):
    """CleanRL's critic charts from each Q-network's mean value and loss (the networks on the last
    axis): those, and the mean of the two losses."""
    stats = dict(qf1_values=qf_values[..., 0], qf2_values=qf_values[..., 1])
    stats |= dict(qf1_loss=qf_losses[..., 0], qf2_loss=qf_losses[..., 1])
    return stats | dict(qf_loss=qf_losses.mean(-1))


def make_learner(args, n_obs, n_act, action_low, action_high, device):
    """TD3's networks, optimizers and steps, by name."""
    actor = Actor(n_obs, n_act, action_low, action_high, device=device)
    actor_target = Actor(n_obs, n_act, action_low, action_high, device=device)
    actor_target.load_state_dict(actor.state_dict())
    qf1 = QNetwork(n_obs, n_act, device=device)
    qf2 = QNetwork(n_obs, n_act, device=device)
    # both Q-networks' parameters stacked in one TensorDict, the targets a copy
    qnet_params = from_modules(qf1, qf2, as_module=True)
    qnet_target = qnet_params.data.clone()
    # Adam steps the networks' own tensors in place: the stack and the numpy policy see each step
    q_params = {name: p.data for name, p in qnet_params.flatten_keys(".").items()}
    q_optimizer = Adam(q_params, args.learning_rate)
    actor_params = {name: p.data for name, p in actor.named_parameters()}
    actor_optimizer = Adam(actor_params, args.learning_rate)
    q_target = dict(qnet_target.flatten_keys(".").items())
    actor_target_params = {name: p.data for name, p in actor_target.named_parameters()}
    # a weightless shell called on the parameters it is given, and vmapped over the stack
    qnet = QNetwork(n_obs, n_act, device="meta")

    def qf(params, obs, actions):
        return functional_call(qnet, params, (obs, actions))

    ensemble_qf = torch.vmap(qf, (0, None, None))
    # acting in numpy, on views of the actor's weights
    w = {name: p.detach().numpy() for name, p in actor.named_parameters()}
    action_scale, action_bias = actor.action_scale.numpy(), actor.action_bias.numpy()
    rng = np.random.default_rng(args.seed)

    def policy(obs):
        """The actor's action plus Gaussian noise, clipped to the bounds."""
        # `Actor.forward`, restated: a test holds the two to the same actions
        x = np.maximum(obs @ w["fc1.weight"].T + w["fc1.bias"], 0)
        x = np.maximum(x @ w["fc2.weight"].T + w["fc2.bias"], 0)
        actions = np.tanh(x @ w["fc_mu.weight"].T + w["fc_mu.bias"]) * action_scale + action_bias
        noise = rng.standard_normal(actions.shape, dtype=np.float32)
        actions += noise * action_scale * args.exploration_noise
        return np.clip(actions, action_bias - action_scale, action_bias + action_scale)

    # the gradients, functions of all they read (the seeds script vmaps them)
    def critic_grads(q_params, actor_target_params, q_target, data):
        with torch.no_grad():
            # target policy smoothing: clipped noise on the target action, in half action ranges
            noise = torch.randn_like(data["actions"]) * args.policy_noise
            noise = noise.clamp(-args.noise_clip, args.noise_clip)
            next_actions = functional_call(actor, actor_target_params, (data["next_obs"],))
            next_actions = actor.clip(next_actions + noise * actor.action_scale)
            qf_next_target = ensemble_qf(q_target, data["next_obs"], next_actions)
            min_qf_next_target = qf_next_target.min(0).values
            not_done = 1 - data["terminations"]
            next_q_value = data["rewards"] + not_done * args.gamma * min_qf_next_target.view(-1)

        def qf_loss_fn(q_params):
            qf_a_values = ensemble_qf(q_params, data["obs"], data["actions"]).view(2, -1)
            # qf1's and qf2's mean squared errors, and their sum
            qf_losses = (qf_a_values - next_q_value).pow(2).mean(1)
            return qf_losses.sum(), (qf_a_values.mean(1), qf_losses)

        return grad_and_value(qf_loss_fn, has_aux=True)(q_params)

    def actor_grads(actor_params, q_params, obs):
        def actor_loss_fn(actor_params):
            # the actor climbs the first Q-network only
            qf1_params = {name: p[0] for name, p in q_params.items()}
            return -qf(qf1_params, obs, functional_call(actor, actor_params, (obs,))).mean()

        return grad_and_value(actor_loss_fn)(actor_params)

    # --bf16: the hidden layers in bfloat16 (the outputs in `float32`), the parameters, gradients
    # and Adam's moments in float32
    autocast = torch.autocast("cpu", torch.bfloat16) if args.bf16 else contextlib.nullcontext()

    def update_critic(data):
        with autocast:
            grads, (_, (qf_values, qf_losses)) = critic_grads(
                q_params, actor_target_params, q_target, data
            )
        q_optimizer.step(grads)
        return qf_stats(qf_values, qf_losses)

    def update_actor(data):
        with autocast:
            grads, actor_loss = actor_grads(actor_params, q_params, data["obs"])
        actor_optimizer.step(grads)
        return actor_loss

    def update_targets():
        # soft update, in place: target + tau * (params - target)
        for targets, params in ((actor_target_params, actor_params), (q_target, q_params)):
            for name, target in targets.items():
                target.lerp_(params[name], args.tau)

    def update(data, policy_step):
        """A step's updates: the critic's; on a policy step (delayed) the actor's, on the critic's
        batch, and the targets'. `main` compiles it as one graph for each value of `policy_step`:
        one call a step (each call of compiled code costs its guard checks and its wrapper)."""
        losses = update_critic(data)
        if policy_step:
            losses["actor_loss"] = update_actor(data)
            update_targets()
        return losses

    return SimpleNamespace(
        policy=policy,
        rng=rng,
        actor=actor,
        actor_target=actor_target,
        qnet_params=qnet_params,
        qnet_target=qnet_target,
        q_optimizer=q_optimizer,
        actor_optimizer=actor_optimizer,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
        update=update,
    )


def main(args):
    check_args(args)
    run = Run(args, "td3_continuous_action_cpu")  # runs.py: folder, seeds, threads, ...
    videos = None if args.eval_model else run.videos
    envs = make_envs(
        args.env_id, args.num_envs, args.seed, videos, tensor=args.tensor_envs, compile=args.compile
    )
    space = envs.single_action_space
    if not isinstance(space, gym.spaces.Box) or not space.is_bounded():
        fail(f"--env-id {args.env_id!r} has a {space} action space; TD3 needs a bounded Box")
    device = torch.device("cpu")  # whatever the machine has
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(space.shape))
    learner = make_learner(args, n_obs, n_act, space.low, space.high, device)
    actor = learner.actor

    def evaluate_actor(episodes, videos):  # the actor's action, no noise
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes)
        return evaluate(actor, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        actor.load_state_dict(run.saved_model)
        return run.finish(device, actor.state_dict(), evaluate_actor)

    if args.compile:  # one graph per kind of step, whose C++ wrapper calls its kernels
        options = {"cpp_wrapper": True, "guard_filter_fn": step_guards}
        learner.update = torch.compile(learner.update, fullgraph=True, options=options)

    rb = ReplayBuffer(args.buffer_size, n_obs, n_act, device)
    obs, _ = envs.reset(seed=args.seed)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(
            rng=learner.rng,
            actor=learner.actor,
            actor_target=learner.actor_target,
            qnet_params=learner.qnet_params,
            qnet_target=learner.qnet_target,
            q_optimizer=learner.q_optimizer,
            actor_optimizer=learner.actor_optimizer,
        )
        return dict(learner=state, rb=rb, envs=(envs, obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    learning_starts = args.learning_starts // args.num_envs
    losses = dict(actor_loss=torch.zeros(()))  # logged before the first delayed actor update
    for iteration in run.progress(range(start, args.total_timesteps // args.num_envs)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here, after compile and warm-up

        # act
        if iteration < learning_starts:
            actions = envs.action_space.sample()
        else:
            actions = learner.policy(np.asarray(obs, dtype=np.float32))  # numpy in, numpy out

        # step the envs
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        run.log_episodes(global_step, finished_episodes(infos))

        # store: a truncated episode bootstraps from its true last observation
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions, rewards=rewards)
        rb.add(transition | dict(terminations=terminations))
        obs = next_obs

        # update: the actor and the targets are delayed, and use the critic's batch
        if iteration >= learning_starts:
            data = rb.sample(args.batch_size)
            losses |= learner.update(data, iteration % args.policy_frequency == 0)

            # log
            if iteration % 100 == 0:
                run.log_progress(global_step, losses)

        # the env steps so far; a checkpoint when due, on a signal, at the end
        run.checkpoint(iteration, training_state, global_step + args.num_envs)
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, actor.state_dict(), evaluate_actor)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    sizes = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency")
    for flag in (*sizes, "learning_rate"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    for flag in ("learning_starts", "policy_noise", "exploration_noise", "noise_clip"):
        if getattr(args, flag) < 0:
            fail(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail(f"--tau must be in (0, 1] and --gamma in [0, 1]; got {args.tau} and {args.gamma}")


if __name__ == "__main__":
    main(tyro.cli(Args))
