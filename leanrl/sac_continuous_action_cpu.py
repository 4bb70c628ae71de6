"""Soft Actor-Critic on a CPU, grown from sac_continuous_action_torchcompile.py: `diff` them for the
CPU lesson.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1812.05905. Hyperparameters, env and budget as in the eager twin.

    python leanrl/sac_continuous_action_cpu.py  # the benchmark run
    python leanrl/sac_continuous_action_cpu.py --env-id Pendulum-v1 --total-timesteps 10000

It trains on the CPU, on the intra-op threads it measures fastest unless `--threads` fixes them
(docs/performance.md); `--bf16` computes the updates in bfloat16 on a CPU that has it.
What changes from the twin:
- each update is a function of the parameters (`torch.func.grad_and_value`, optimizers.py's
  Adam), compiled whole: autograd's `backward` and an optimizer's `step` would split the graph;
- acting runs in numpy on views of the actor's weights: at batch 1 a torch call costs more than its
  arithmetic;
- the replay buffer is written through numpy views of its tensors, cheaper than a torch write.
"""

import contextlib
import math
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
    buffer_size: int = 1_000_000
    """the replay memory buffer size, in transitions"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_starts: int = 5_000
    """environment steps of random actions before learning starts"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the Q network optimizer"""
    policy_frequency: int = 2
    """every `policy_frequency` steps, `policy_frequency` policy updates (delayed, as CleanRL)"""
    target_network_frequency: int = 1
    """the frequency of updates for the target networks, in gradient steps"""
    alpha: float = 0.2
    """the entropy coefficient without autotune (autotune starts it at 1, as CleanRL)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient"""

    compile: bool = True
    """compile each update as one graph; --no-compile runs the same functions eagerly"""


def float32(layer, x):
    """`layer(x)` in float32, under --bf16's autocast too, its input upcast to the weights' dtype:
    the outputs the losses read keep their precision. In bfloat16 a Q-value of 500 would round to
    a multiple of 4, and tanh to 1 from x = 4 on, where the log-density's log(1 - tanh(x)^2)
    would fall to log(1e-6)."""
    if not torch.is_autocast_enabled("cpu"):  # no autocast in the graph: AOTAutograd caches it
        return layer(x)
    with torch.autocast("cpu", enabled=False):
        return layer(x.to(layer.weight.dtype))


class SoftQNetwork(nn.Module):
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


LOG_STD_MAX = 2
LOG_STD_MIN = -5


class Actor(nn.Module):
    def __init__(self, n_obs, n_act, action_low, action_high, device=None):
        super().__init__()
        self.fc1 = nn.Linear(n_obs, 256, device=device)
        self.fc2 = nn.Linear(256, 256, device=device)
        self.fc_mean = nn.Linear(256, n_act, device=device)
        self.fc_logstd = nn.Linear(256, n_act, device=device)
        # action rescaling, from tanh's (-1, 1) to the env's bounds
        high = torch.as_tensor(action_high, dtype=torch.float32, device=device)
        low = torch.as_tensor(action_low, dtype=torch.float32, device=device)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs):
        x = F.relu(self.fc1(obs))
        x = F.relu(self.fc2(x))
        mean = float32(self.fc_mean, x)
        log_std = torch.tanh(float32(self.fc_logstd, x))
        # from SpinUp / Denis Yarats
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        return mean, log_std

    def get_action(self, obs):
        mean, log_std = self(obs)
        return sample_action(mean, log_std, self.action_scale, self.action_bias)


def sample_action(mean, log_std, action_scale, action_bias):
    """A squashed Gaussian action, its log-probability and the squashed mean."""
    std = log_std.exp()
    # the Gaussian written out: torch.distributions.Normal checks its arguments, a host sync
    noise = torch.randn_like(mean)
    x_t = mean + std * noise  # reparameterization trick
    y_t = torch.tanh(x_t)
    action = y_t * action_scale + action_bias
    log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    # enforcing action bounds: the change of variables through tanh and the rescaling
    log_prob -= torch.log(action_scale * (1 - y_t.pow(2)) + 1e-6)
    log_prob = log_prob.sum(-1, keepdim=True)
    mean = torch.tanh(mean) * action_scale + action_bias
    return action, log_prob, mean


class ReplayBuffer:
    """A circular buffer of transitions in one TensorDict, sampled uniformly with replacement. Each
    step is written through numpy views of its tensors (the same memory)."""

    def __init__(self, buffer_size, n_obs, n_act):
        shapes = dict(obs=[n_obs], next_obs=[n_obs], actions=[n_act], rewards=[], terminations=[])
        storage = {k: torch.zeros(buffer_size, *s) for k, s in shapes.items()}
        self.storage = TensorDict(storage, batch_size=[buffer_size])
        self.views = self.storage.numpy()
        self.buffer_size, self.cursor, self.size = buffer_size, 0, 0

    def add(self, transition):
        """Write one vector step: a dict of arrays, one row per env."""
        n = len(transition["obs"])
        idx = np.arange(self.cursor, self.cursor + n) % self.buffer_size
        for key, view in self.views.items():
            view[idx] = transition[key]
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):
        """A batch as a dict of tensors: cheaper to gather, and to hand a compiled update, than a
        TensorDict."""
        idx = torch.randint(0, self.size, (batch_size,))
        return {key: value.index_select(0, idx) for key, value in self.storage.items()}

    def state_dict(self):  # the filled part (a copy: torch.save writes a view's whole storage)
        storage = {key: value[: self.size].clone() for key, value in self.storage.items()}
        return dict(storage=storage, cursor=self.cursor, size=self.size)

    def load_state_dict(self, state):
        self.cursor, self.size = state["cursor"], state["size"]
        for key, value in state["storage"].items():
            self.storage[key][: self.size] = value


def make_ensemble_qf(n_obs, n_act):
    """`ensemble_qf(params, obs, actions)`: the Q-values [2, batch, 1] of the networks stacked in
    `params`, by vmap."""
    qnet = SoftQNetwork(n_obs, n_act, device="meta")  # a shell: `params` are swapped in

    def qf(params, obs, actions):
        return functional_call(qnet, params, (obs, actions))

    return torch.vmap(qf, (0, None, None))


def make_host_policy(actor, rng):
    """`actor.get_action` in numpy for batch-1 acting, on views of the actor's weights (Adam updates
    them in place), with noise from `rng`, a numpy Generator. A test holds it to the actor."""
    w = {name: p.detach().numpy() for name, p in actor.named_parameters()}
    action_scale, action_bias = actor.action_scale.numpy(), actor.action_bias.numpy()

    def get_action(obs):
        x = np.maximum(obs @ w["fc1.weight"].T + w["fc1.bias"], 0)
        x = np.maximum(x @ w["fc2.weight"].T + w["fc2.bias"], 0)
        mean = x @ w["fc_mean.weight"].T + w["fc_mean.bias"]
        log_std = np.tanh(x @ w["fc_logstd.weight"].T + w["fc_logstd.bias"])
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        noise = rng.standard_normal(mean.shape, dtype=np.float32)  # then `sample_action`, in numpy
        y_t = np.tanh(mean + np.exp(log_std) * noise)
        log_prob = -0.5 * noise**2 - log_std - 0.5 * math.log(2 * math.pi)
        log_prob -= np.log(action_scale * (1 - y_t**2) + 1e-6)
        action, mean = y_t * action_scale + action_bias, np.tanh(mean) * action_scale + action_bias
        return action, log_prob.sum(-1, keepdims=True), mean

    return get_action


def qf_stats(qf_values, qf_losses):
    """CleanRL's critic charts from each Q-network's mean value and loss (the networks on the last
    axis): those, and the mean of the two losses."""
    stats = dict(qf1_values=qf_values[..., 0], qf2_values=qf_values[..., 1])
    stats |= dict(qf1_loss=qf_losses[..., 0], qf2_loss=qf_losses[..., 1])
    return stats | dict(qf_loss=qf_losses.mean(-1))


def make_learner(args, n_obs, n_act, action_low, action_high):
    """SAC's networks, optimizers and update steps, each update a function of the parameters."""
    actor = Actor(n_obs, n_act, action_low, action_high)
    qf1 = SoftQNetwork(n_obs, n_act)
    qf2 = SoftQNetwork(n_obs, n_act)
    # both networks' parameters, stacked leaf by leaf
    qnet_params = from_modules(qf1, qf2, as_module=True)
    qnet_target = qnet_params.data.clone()
    ensemble_qf = make_ensemble_qf(n_obs, n_act)
    # the modules' own tensors, which Adam updates in place
    actor_params = {name: p.data for name, p in actor.named_parameters()}
    q_params = {name: p.data for name, p in qnet_params.flatten_keys(".").items()}
    q_target = dict(qnet_target.flatten_keys(".").items())
    q_optimizer = Adam(q_params, args.q_lr)
    actor_optimizer = Adam(actor_params, args.policy_lr)

    # automatic entropy tuning starts at alpha = 1
    target_entropy = -float(n_act)
    log_alpha = torch.tensor(0.0 if args.autotune else math.log(args.alpha))
    alpha = log_alpha.exp()  # updated in place
    alpha_params = {"log_alpha": log_alpha}
    alpha_optimizer = Adam(alpha_params, args.q_lr)

    def get_action(actor_params, obs):  # the actor as a function of its parameters
        mean, log_std = functional_call(actor, actor_params, (obs,))
        return sample_action(mean, log_std, actor.action_scale, actor.action_bias)

    # the gradients, functions of all they read (the seeds script vmaps them)
    def critic_grads(q_params, actor_params, q_target, alpha, data):
        with torch.no_grad():
            next_actions, next_log_pi, _ = get_action(actor_params, data["next_obs"])
            qf_next_target = ensemble_qf(q_target, data["next_obs"], next_actions)
            min_qf_next_target = qf_next_target.min(0).values - alpha * next_log_pi
            not_done = 1 - data["terminations"]
            next_q_value = data["rewards"] + not_done * args.gamma * min_qf_next_target.view(-1)

        def qf_loss_fn(q_params):
            qf_a_values = ensemble_qf(q_params, data["obs"], data["actions"]).view(2, -1)
            # each network's mean squared error, and their sum, as in the eager twin
            qf_losses = (qf_a_values - next_q_value).pow(2).mean(1)
            return qf_losses.sum(), (qf_a_values.mean(1), qf_losses)

        return grad_and_value(qf_loss_fn, has_aux=True)(q_params)

    def actor_grads(actor_params, q_params, alpha, data):
        def actor_loss_fn(actor_params):
            pi, log_pi, _ = get_action(actor_params, data["obs"])
            min_qf_pi = ensemble_qf(q_params, data["obs"], pi).min(0).values
            return ((alpha * log_pi) - min_qf_pi).mean()

        return grad_and_value(actor_loss_fn)(actor_params)

    def alpha_grads(alpha_params, actor_params, data):
        with torch.no_grad():
            _, log_pi, _ = get_action(actor_params, data["obs"])

        def alpha_loss_fn(alpha_params):
            return (-alpha_params["log_alpha"].exp() * (log_pi + target_entropy)).mean()

        return grad_and_value(alpha_loss_fn)(alpha_params)

    # --bf16: the hidden layers in bfloat16 (the outputs in `float32`), the parameters, gradients
    # and Adam's moments in float32
    autocast = torch.autocast("cpu", torch.bfloat16) if args.bf16 else contextlib.nullcontext()

    def update_critic(data):
        with autocast:
            grads, (_, (qf_values, qf_losses)) = critic_grads(
                q_params, actor_params, q_target, alpha, data
            )
        q_optimizer.step(grads)
        return qf_stats(qf_values, qf_losses)

    def update_actor(data):
        with autocast:
            grads, actor_loss = actor_grads(actor_params, q_params, alpha, data)
        actor_optimizer.step(grads)
        alpha_loss = torch.zeros_like(alpha)
        if args.autotune:
            with autocast:
                grads, alpha_loss = alpha_grads(alpha_params, actor_params, data)
            alpha_optimizer.step(grads)
            alpha.copy_(log_alpha.exp())
        return actor_loss, alpha_loss

    def update_targets():
        # target + tau * (params - target), i.e. tau * params + (1 - tau) * target, on all leaves
        for name, target in q_target.items():
            target.lerp_(q_params[name], args.tau)

    def update(data, policy_step, target_step):
        """A step's updates, as CleanRL orders them: the critic; on a policy step (delayed, as in
        TD3) `policy_frequency` actor updates on the critic's batch; on a target step, the
        targets. `main` compiles it as one graph for each value of the two flags: one call a step
        (each call of compiled code costs its guard checks and its wrapper)."""
        losses = update_critic(data)
        if policy_step:
            for _ in range(args.policy_frequency):
                losses["actor_loss"], losses["alpha_loss"] = update_actor(data)
        if target_step:
            update_targets()
        return losses

    rng = np.random.default_rng(args.seed)  # the acting noise's generator
    return SimpleNamespace(
        policy=make_host_policy(actor, rng),
        rng=rng,
        actor=actor,
        actor_params=actor_params,
        qnet_params=qnet_params,
        qnet_target=qnet_target,
        q_optimizer=q_optimizer,
        actor_optimizer=actor_optimizer,
        alpha_optimizer=alpha_optimizer,
        log_alpha=log_alpha,
        alpha=alpha,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
        update=update,
    )


def main(args):
    check_args(args)
    run = Run(args, "sac_continuous_action_cpu")  # runs.py: folder, seeds, threads, ...
    videos = None if args.eval_model else run.videos
    envs = make_envs(
        args.env_id, args.num_envs, args.seed, videos, tensor=args.tensor_envs, compile=args.compile
    )
    space = envs.single_action_space
    if not isinstance(space, gym.spaces.Box) or not space.is_bounded():
        fail(f"--env-id {args.env_id!r} has a {space} action space; SAC needs a bounded Box")
    device = torch.device("cpu")
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(space.shape))
    learner = make_learner(args, n_obs, n_act, space.low, space.high)
    actor = learner.actor

    def evaluate_actor(episodes, videos):  # the actor's mean action, squashed
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes)
        return evaluate(
            lambda obs: actor.get_action(obs)[2], eval_envs, episodes, args.seed, device
        )

    if args.eval_model:
        actor.load_state_dict(run.saved_model)
        return run.finish(device, actor.state_dict(), evaluate_actor)
    if args.compile:  # one graph per kind of step, whose C++ wrapper calls its kernels
        options = {"cpp_wrapper": True, "guard_filter_fn": step_guards}
        learner.update = torch.compile(learner.update, fullgraph=True, options=options)

    rb = ReplayBuffer(args.buffer_size, n_obs, n_act)
    obs, _ = envs.reset(seed=args.seed)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(
            rng=learner.rng,
            actor=learner.actor,
            actor_params=learner.actor_params,
            qnet_params=learner.qnet_params,
            qnet_target=learner.qnet_target,
            q_optimizer=learner.q_optimizer,
            actor_optimizer=learner.actor_optimizer,
            alpha_optimizer=learner.alpha_optimizer,
            log_alpha=learner.log_alpha,
            alpha=learner.alpha,
        )
        return dict(learner=state, rb=rb, envs=(envs, obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    learning_starts = args.learning_starts // args.num_envs  # in vector steps
    # logged before the first delayed policy update
    losses = dict(actor_loss=torch.zeros(()), alpha_loss=torch.zeros(()))
    for iteration in run.progress(range(start, args.total_timesteps // args.num_envs)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here, after compiling and warm-up

        # act
        if iteration < learning_starts:
            actions = envs.action_space.sample()
        else:
            actions = learner.policy(np.asarray(obs, dtype=np.float32))[0]  # numpy in and out

        # step the envs
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        run.log_episodes(global_step, finished_episodes(infos))

        # store: a truncated episode bootstraps from its true last observation
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions, rewards=rewards)
        rb.add(transition | dict(terminations=terminations))
        obs = next_obs

        # update
        if iteration >= learning_starts:
            data = rb.sample(args.batch_size)
            policy_step = iteration % args.policy_frequency == 0
            target_step = iteration % args.target_network_frequency == 0
            losses |= learner.update(data, policy_step, target_step)

            # log
            if iteration % 100 == 0:
                run.log_progress(global_step, losses | dict(alpha=learner.alpha))

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
    for flag in (*sizes, "target_network_frequency", "policy_lr", "q_lr"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.learning_starts < 0 or not 0 < args.tau <= 1 or not 0 <= args.gamma <= 1:
        fail("--learning-starts must be >= 0, --tau in (0, 1] and --gamma in [0, 1]")
    if not args.autotune and args.alpha <= 0:
        fail(f"--alpha must be positive, got {args.alpha}")


if __name__ == "__main__":
    main(tyro.cli(Args))
