"""Soft Actor-Critic for continuous actions, the eager reference (CleanRL's
sac_continuous_action.py).

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1812.05905. CleanRL's hyperparameters, on LeanRL's benchmark env
HalfCheetah-v4 for 1M steps (CleanRL's SAC defaults to Hopper-v4).

    python leanrl/sac_continuous_action.py  # the benchmark run
    python leanrl/sac_continuous_action.py --env-id Pendulum-v1 --total-timesteps 10000

Plain PyTorch, written in the shape of sac_continuous_action_torchcompile.py so that `diff` shows
only what buys speed. One gradient step per vector step, as in CleanRL.
"""

import math
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from flags import CudaFlags, TensorEnvFlags, fail
from runs import Run
from vector_envs import evaluate, finished_episodes, make_envs, true_next_obs


@dataclass
class Args(TensorEnvFlags, CudaFlags):
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
    num_updates: int = 1
    """gradient steps (critic updates) per vector step, as FastTD3's `num_updates`"""
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
        return self.fc3(x)


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
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        # from SpinUp / Denis Yarats
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        return mean, log_std

    def get_action(self, obs):
        mean, log_std = self(obs)
        std = log_std.exp()
        # no argument checks: a nan is reported by the run, not raised here
        normal = torch.distributions.Normal(mean, std, validate_args=False)
        x_t = normal.rsample()  # reparameterization trick: mean + std * N(0,1)
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        log_prob = normal.log_prob(x_t)
        # enforcing action bounds: the change of variables through tanh and the rescaling
        log_prob -= torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
        log_prob = log_prob.sum(-1, keepdim=True)
        mean = torch.tanh(mean) * self.action_scale + self.action_bias
        return action, log_prob, mean


class ReplayBuffer:
    """A circular buffer of transitions on `device`, sampled uniformly with replacement."""

    def __init__(self, buffer_size, n_obs, n_act, device):
        shapes = dict(obs=[n_obs], next_obs=[n_obs], actions=[n_act], rewards=[], terminations=[])
        self.storage = {k: torch.zeros(buffer_size, *s, device=device) for k, s in shapes.items()}
        self.buffer_size, self.cursor, self.size, self.device = buffer_size, 0, 0, device

    def add(self, transition):
        """Write one vector step: a dict of arrays, one row per env."""
        n = len(transition["obs"])
        idx = torch.arange(self.cursor, self.cursor + n, device=self.device) % self.buffer_size
        for key, value in transition.items():
            self.storage[key][idx] = torch.as_tensor(value, device=self.device, dtype=torch.float)
        self.cursor = (self.cursor + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size):
        idx = torch.randint(0, self.size, (batch_size,), device=self.device)
        return {key: value[idx] for key, value in self.storage.items()}

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
    """SAC's networks, optimizers and update steps on `device`."""
    actor = Actor(n_obs, n_act, action_low, action_high, device=device)
    qf1 = SoftQNetwork(n_obs, n_act, device=device)
    qf2 = SoftQNetwork(n_obs, n_act, device=device)
    qf1_target = SoftQNetwork(n_obs, n_act, device=device)
    qf2_target = SoftQNetwork(n_obs, n_act, device=device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_params = list(qf1.parameters()) + list(qf2.parameters())
    q_optimizer = torch.optim.Adam(q_params, lr=args.q_lr)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr)

    # automatic entropy tuning starts at alpha = 1
    target_entropy = -float(n_act)
    log_alpha = torch.tensor(
        0.0 if args.autotune else math.log(args.alpha), device=device, requires_grad=args.autotune
    )
    alpha = log_alpha.detach().exp()  # updated in place
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr)

    def update_critic(data):
        with torch.no_grad():
            next_actions, next_log_pi, _ = actor.get_action(data["next_obs"])
            qf1_next_target = qf1_target(data["next_obs"], next_actions)
            qf2_next_target = qf2_target(data["next_obs"], next_actions)
            min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_log_pi
            not_done = 1 - data["terminations"]
            next_q_value = data["rewards"] + not_done * args.gamma * min_qf_next_target.view(-1)

        qf1_a_values = qf1(data["obs"], data["actions"]).view(-1)
        qf2_a_values = qf2(data["obs"], data["actions"]).view(-1)
        qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
        qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
        qf_loss = qf1_loss + qf2_loss

        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        qf_values = torch.stack([qf1_a_values.mean(), qf2_a_values.mean()])
        return qf_stats(qf_values.detach(), torch.stack([qf1_loss, qf2_loss]).detach())

    def update_actor(data):
        pi, log_pi, _ = actor.get_action(data["obs"])
        min_qf_pi = torch.min(qf1(data["obs"], pi), qf2(data["obs"], pi))
        actor_loss = ((alpha * log_pi) - min_qf_pi).mean()

        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()

        alpha_loss = torch.zeros((), device=device)
        if args.autotune:
            with torch.no_grad():
                _, log_pi, _ = actor.get_action(data["obs"])
            alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()

            alpha_optimizer.zero_grad()
            alpha_loss.backward()
            alpha_optimizer.step()
            alpha.copy_(log_alpha.detach().exp())
        return actor_loss.detach(), alpha_loss.detach()

    def update_targets():
        for net, target in ((qf1, qf1_target), (qf2, qf2_target)):
            for param, target_param in zip(net.parameters(), target.parameters()):
                target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)

    return SimpleNamespace(
        policy=actor.get_action,
        actor=actor,
        qf1=qf1,
        qf2=qf2,
        qf1_target=qf1_target,
        qf2_target=qf2_target,
        q_optimizer=q_optimizer,
        actor_optimizer=actor_optimizer,
        alpha_optimizer=alpha_optimizer,
        log_alpha=log_alpha,
        alpha=alpha,
        update_critic=update_critic,
        update_actor=update_actor,
        update_targets=update_targets,
    )


# the losses are logged every LOG_EVERY vector steps, with one host sync
LOG_EVERY = 100


def main(args):
    check_args(args)
    run = Run(args, "sac_continuous_action")  # runs.py: folder, seeds, signals, ...
    videos = None if args.eval_model else run.videos
    envs = make_envs(args.env_id, args.num_envs, args.seed, videos, tensor=args.tensor_envs)
    space = envs.single_action_space
    if not isinstance(space, gym.spaces.Box) or not space.is_bounded():
        fail(f"--env-id {args.env_id!r} has a {space} action space; SAC needs a bounded Box")
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(space.shape))
    learner = make_learner(args, n_obs, n_act, space.low, space.high, device)
    actor = learner.actor

    def evaluate_actor(episodes, videos):  # the actor's mean action, squashed
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes)
        return evaluate(
            lambda obs: actor.get_action(obs)[2], eval_envs, episodes, args.seed, device
        )

    if args.eval_model:
        actor.load_state_dict(run.saved_model)
        return run.finish(device, actor.state_dict(), evaluate_actor)

    rb = ReplayBuffer(args.buffer_size, n_obs, n_act, device)
    obs, _ = envs.reset(seed=args.seed)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(
            actor=learner.actor,
            qf1=learner.qf1,
            qf2=learner.qf2,
            qf1_target=learner.qf1_target,
            qf2_target=learner.qf2_target,
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
    actor_loss = alpha_loss = torch.zeros((), device=device)
    for iteration in run.progress(range(start, args.total_timesteps // args.num_envs)):
        global_step = iteration * args.num_envs
        if iteration == learning_starts + args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here, after compiling and warm-up

        # act
        if iteration < learning_starts:
            actions = envs.action_space.sample()
        else:
            with torch.no_grad():
                observed = torch.as_tensor(obs, device=device, dtype=torch.float)
                actions = learner.policy(observed)[0].cpu().numpy()

        # step the envs
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        run.log_episodes(global_step, finished_episodes(infos))

        # store: a truncated episode bootstraps from its true last observation
        real_next_obs = true_next_obs(next_obs, infos)
        transition = dict(obs=obs, next_obs=real_next_obs, actions=actions, rewards=rewards)
        rb.add(transition | dict(terminations=terminations))
        obs = next_obs

        # update: --num-updates gradient steps a vector step, counted over the run
        if iteration >= learning_starts:
            first = iteration * args.num_updates
            for gradient_step in range(first, first + args.num_updates):
                data = rb.sample(args.batch_size)
                critic_stats = learner.update_critic(data)
                if gradient_step % args.policy_frequency == 0:  # delayed, as in TD3
                    for _ in range(args.policy_frequency):  # on the critic's batch, as CleanRL
                        actor_loss, alpha_loss = learner.update_actor(data)
                if gradient_step % args.target_network_frequency == 0:
                    learner.update_targets()

            # log
            if iteration % LOG_EVERY == 0:
                losses = critic_stats | dict(actor_loss=actor_loss, alpha_loss=alpha_loss)
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
    for flag in (*sizes, "num_updates", "target_network_frequency", "policy_lr", "q_lr"):
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
