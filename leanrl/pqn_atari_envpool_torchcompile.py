"""Parallel Q-Network (PQN) on Atari with envpool, optimized: the twin of pqn_atari_envpool.py.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/2407.04811. The algorithm and CleanRL's defaults: see
pqn_atari_envpool.py.

    python leanrl/pqn_atari_envpool_torchcompile.py --compile               # on a CPU
    python leanrl/pqn_atari_envpool_torchcompile.py --compile --cudagraphs  # fastest on a GPU

The eager twin's algorithm and loop, with the data flow rewritten for speed:
- frames stay uint8 from envpool to the network, copied once, into their slot of the rollout;
- a TensorDict rollout on the device, its rewards and ends copied there once a rollout;
- acting on the device without a host sync, epsilon from a step counter there;
- the Q(lambda) returns by doubling instead of a loop; a tensor learning rate;
- `--compile` compiles acting, the returns and the whole update, RAdam's step with it;
- `--cudagraphs` records acting, the returns and the update as CUDA graphs (on a CUDA device).

envpool steps the games in C++ threads with DeepMind's preprocessing and resets an env
on the step after its episode ended, so the observation stored after a last step is its true final
one: a truncated episode bootstraps from it, a terminated one from 0. As in CleanRL, the reset step
itself is learned from like any other. Losing a life ends the episode the agent learns from, not
the game it reports. Evaluation acts as training ends, epsilon-greedy at `--end-e`: a greedy agent
can stall a game that needs FIRE.

A resumed run (--resume) gets its learner back exactly (network, optimizer, learning-rate schedule,
counters, generators, curve), but envpool's envs cannot be saved: its games start fresh, seeded
with --seed plus the step it resumes from (`fresh_episodes: true` in the summary's `resumes`).
"""

from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from atari import AtariRun, VideoRecorder, evaluate_games, finished_games
from flags import CudaFlags, fail
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule


@dataclass
class Args(CudaFlags):
    env_id: str = "Breakout-v5"
    """the id of the envpool Atari task"""
    total_timesteps: int = 10_000_000
    """total environment steps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the vector steps of each rollout"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    num_minibatches: int = 4
    """the minibatches each epoch splits the rollout into"""
    update_epochs: int = 4
    """the passes over the rollout of each update"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total_timesteps` over which epsilon falls from `start_e` to `end_e`"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) returns"""

    compile: bool = False
    """compile acting, the returns and the update with `torch.compile`"""
    cudagraphs: bool = False
    """record acting, the returns and the update as CUDA graphs (needs a CUDA device)"""


def make_envs(env_id, num_envs, seed, videos=None, prefix="train"):
    """envpool's Atari games with gymnasium's step signature, episodic life and clipped rewards.
    With `videos` (a folder) env 0's games are recorded there, as `prefix`-episode-<game>.mp4.
    `check_args` has checked that `env_id` is one of envpool's Atari games."""
    render = dict(render_mode="rgb_array") if videos else {}
    envs = envpool.make_gymnasium(
        env_id, num_envs=num_envs, seed=seed, episodic_life=True, reward_clip=True, **render
    )
    return VideoRecorder(envs, videos, prefix) if videos else envs


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """The Nature DQN torso with each layer normalized (LayerNorm), what lets PQN drop the target
    network. It takes stacked frames [batch, 4, 84, 84] with pixels in 0..255."""

    def __init__(self, n_act, device=None):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4, device=device)),
            nn.LayerNorm([32, 20, 20], device=device),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2, device=device)),
            nn.LayerNorm([64, 9, 9], device=device),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1, device=device)),
            nn.LayerNorm([64, 7, 7], device=device),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512, device=device)),
            nn.LayerNorm(512, device=device),
            nn.ReLU(),
            layer_init(nn.Linear(512, n_act, device=device)),
        )

    def forward(self, x):
        return self.network(x.float() / 255.0)  # uint8 frames become floats here


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step `t` (a number or a tensor): from `start_e` down to `end_e`, then flat."""
    epsilon = start_e + (end_e - start_e) * t / duration
    return epsilon.clamp_min(end_e) if isinstance(epsilon, torch.Tensor) else max(epsilon, end_e)


def epsilon_greedy(q_values, epsilon):
    """Per env, the greedy action or, with probability `epsilon` (a coin per env, as CleanRL flips
    them), a uniform one; and the greedy action's value, max_a Q."""
    values, greedy = q_values.max(dim=1)
    random_actions = torch.randint_like(greedy, q_values.shape[1])
    explore = torch.rand_like(values) < epsilon
    return torch.where(explore, random_actions, greedy), values


def q_lambda_returns(rewards, values, next_value, terminations, truncations, gamma, q_lambda):
    """The Q(lambda) returns, shaped [num_steps, num_envs]. `values[t]` is max_a Q of the obs at
    step t, `next_value` [num_envs] that of the obs after the last step. envpool resets in
    next-step mode: after an episode ends at step t, `values[t + 1]` is the value of its final
    observation, which a truncated step bootstraps from."""
    dones = torch.maximum(terminations, truncations)
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)]) * (1 - terminations)
    # R_t = r_t + gamma * ((1 - lambda) * V_{t+1} + lambda * R_{t+1}), where R_{t+1} is V_{t+1}
    # after an episode's last step and after the rollout's: R_t = b_t + c_t * R_{t+1}, solved by
    # doubling (after shift s, returns[t] sums R_t's terms t .. t + 2s - 1, coefs[t] their c's)
    ends = torch.cat([dones[:-1], torch.ones_like(dones[-1:])])
    coefs = gamma * q_lambda * (1 - ends)
    returns = rewards + gamma * next_values - coefs * next_values
    shift = 1
    while shift < len(values):
        returns = torch.cat([returns[:-shift] + coefs[:-shift] * returns[shift:], returns[-shift:]])
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return returns


def make_learner(args, n_act, device):
    """The Q network and its optimizer on `device`, and the functions `main` calls."""
    q_network = QNetwork(n_act, device=device)
    if device.type == "cpu":  # oneDNN's convolutions are faster on channels-last (NHWC) weights
        q_network = q_network.to(memory_format=torch.channels_last)
    # a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # capturable: a CUDA graph can record its step (RAdam has no fused kernel)
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=lr, capturable=args.cudagraphs)
    # the env step on the device, which acting advances in place: no sync, no recompile
    global_step = torch.zeros((), dtype=torch.long, device=device)
    exploration_steps = args.exploration_fraction * args.total_timesteps

    def policy(obs):
        """Epsilon-greedy actions and the greedy actions' values, on the device."""
        global_step.add_(obs.shape[0])
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        return epsilon_greedy(q_network(obs), epsilon)

    def get_value(obs):
        """max_a Q(obs, a): what a return bootstraps from."""
        return q_network(obs).max(dim=1).values

    def loss_fn(mb):
        old_val = q_network(mb["obs"]).gather(1, mb["actions"].unsqueeze(-1)).squeeze(-1)
        return F.mse_loss(mb["returns"], old_val), old_val.mean().detach()

    def update(mb):
        """One gradient step on a minibatch; returns its loss and mean Q of the actions taken."""
        optimizer.zero_grad()
        loss, q_mean = loss_fn(mb)
        loss.backward()
        nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
        optimizer.step()
        return loss.detach(), q_mean

    return SimpleNamespace(
        q_network=q_network,
        optimizer=optimizer,
        policy=policy,
        get_value=get_value,
        update=update,
        global_step=global_step,
    )


def main(args):
    check_args(args)
    run = AtariRun(args, "pqn_atari_envpool_torchcompile")  # atari.py: folder, seeds, signals, ...
    videos = None if args.eval_model else run.videos
    envs = make_envs(args.env_id, args.num_envs, run.env_seed, videos)  # fresh games on resume
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    learner = make_learner(args, envs.single_action_space.n, device)
    q_network, optimizer = learner.q_network, learner.optimizer
    policy, get_value, update = learner.policy, learner.get_value, learner.update
    compute_returns = q_lambda_returns
    if args.compile:
        policy = torch.compile(policy, fullgraph=True)
        compute_returns = torch.compile(q_lambda_returns, fullgraph=True)
        update = torch.compile(update)
    if args.cudagraphs:
        # warm-up calls run as they are (RAdam makes its state), one records, the rest replay
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        compute_returns = CudaGraphModule(compute_returns, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    def evaluate_agent(episodes, videos):
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, "eval")
        act = lambda obs: epsilon_greedy(q_network(obs), args.end_e)[0]  # noqa: E731
        return evaluate_games(act, eval_envs, episodes, device)

    if args.eval_model:
        q_network.load_state_dict(run.saved_model)
        envs.close()
        return run.finish(device, q_network.state_dict(), evaluate_agent)

    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    exploration_steps = args.exploration_fraction * args.total_timesteps
    shape = (args.num_steps, args.num_envs)
    keys = ("values", "rewards", "terminations", "truncations")
    rollout = TensorDict(
        {key: torch.zeros(shape, device=device) for key in keys}, batch_size=shape, device=device
    )
    obs_shape = envs.single_observation_space.shape
    rollout["obs"] = torch.zeros(*shape, *obs_shape, dtype=torch.uint8, device=device)
    rollout["actions"] = torch.zeros(shape, dtype=torch.long, device=device)
    # rewards and ends in numpy until the rollout ends: one copy to the device each, not one a step
    outcomes = {key: np.zeros(shape, np.float32) for key in keys[1:]}

    next_obs, _ = envs.reset()
    next_obs = torch.from_numpy(next_obs)
    game_returns = np.zeros(args.num_envs)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(q_network=learner.q_network, optimizer=learner.optimizer)
        return dict(learner=state | dict(global_step=learner.global_step))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    global_step = run.steps
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here, past compile and warm-up
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # no recompile

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs = rollout["obs"][step]
            # the one copy of the frames: into the rollout, read from there
            obs.copy_(next_obs, non_blocking=True)
            with torch.no_grad():
                action, value = policy(obs)
            rollout["actions"][step] = action
            rollout["values"][step] = value

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            outcome = dict(rewards=reward, terminations=terminations, truncations=truncations)
            for key, array in outcome.items():
                outcomes[key][step] = array
            next_obs = torch.from_numpy(next_obs)  # a view of envpool's array, no copy
            run.log_episodes(global_step, finished_games(game_returns, infos, truncations))

        # returns
        for key, array in outcomes.items():
            rollout[key].copy_(torch.from_numpy(array))
        with torch.no_grad():
            next_value = get_value(next_obs.to(device))
            returns = compute_returns(
                rollout["rewards"],
                rollout["values"],
                next_value,
                rollout["terminations"],
                rollout["truncations"],
                args.gamma,
                args.q_lambda,
            )
        b = rollout.select("obs", "actions").flatten(0, 1)
        b["returns"] = returns.flatten()

        # update
        for _ in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                td_loss, q_mean = update(b[mb_inds])

        # log
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, learner.global_step)
        metrics = dict(td_loss=td_loss, q_values=q_mean, epsilon=epsilon)
        metrics["learning_rate"] = optimizer.param_groups[0]["lr"]
        run.log_progress(global_step, metrics)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, q_network.state_dict(), evaluate_agent)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    env_id = args.env_id
    if (
        env_id not in envpool.list_all_envs()
        or type(envpool.make_spec(env_id)).__name__ != "AtariEnvSpec"
    ):
        fail(f"--env-id {env_id!r} is not one of envpool's Atari games (e.g. Breakout-v5)")
    flags = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    for flag in (*flags, "learning_rate", "max_grad_norm"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    batch_size = args.num_steps * args.num_envs
    if args.total_timesteps < batch_size:
        rollout = "one rollout (--num-steps x --num-envs)"
        fail(f"--total-timesteps {args.total_timesteps} is less than {rollout}")
    if batch_size % args.num_minibatches:
        rollout = f"--num-steps x --num-envs ({batch_size})"
        fail(f"--num-minibatches must split {rollout} into equal parts")
    if not 0 <= args.gamma <= 1 or not 0 <= args.q_lambda <= 1:
        fail("--gamma and --q-lambda must be in [0, 1]")
    epsilons = (args.start_e, args.end_e)
    if not 0 < args.exploration_fraction <= 1 or not all(0 <= e <= 1 for e in epsilons):
        fail("--exploration-fraction must be in (0, 1], --start-e and --end-e in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device, and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args))
