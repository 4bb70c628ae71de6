"""PPO on Atari: ppo_atari_envpool_torchcompile.py with envpool's async mode.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's: Breakout-v5, 10M steps, 8 envs
x 128 steps.

    python leanrl/ppo_atari_envpool_async.py --compile               # on a CPU
    python leanrl/ppo_atari_envpool_async.py --compile --cudagraphs  # fastest on a GPU

The twin steps all envs, then acts on all of them. Here envpool's `recv` returns the first
`--async-batch-size` envs done stepping, the policy acts on them and `send` hands their actions
back, while the other envs step in `--env-threads` threads. `collect_rollout` stores each env's
steps in order, so the rest is the twin's; with `--async-batch-size` equal to `--num-envs` it
takes the twin's steps. SUMMARY adds `async_batch_size` and `env_threads`. The design is in
docs/async-sampling.md.

A resumed run (--resume) gets its learner back exactly (network, optimizer, learning-rate schedule,
counters, generators, curve), but envpool's envs cannot be saved: its games start fresh, seeded
with --seed plus the step it resumes from (`fresh_episodes: true` in the summary's `resumes`).
"""

import os
from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import numpy as np
import torch
import torch.nn as nn
import tyro
from atari import AtariRun, VideoRecorder, evaluate_games
from flags import CudaFlags, fail
from tensordict import TensorDict, from_module
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
    async_batch_size: int | None = None
    """the envs the policy acts on at once while the others step (default: half the envs)"""
    env_threads: int | None = None
    """envpool's threads that step the games (default: all cores but one, kept for the policy)"""
    num_steps: int = 128
    """the vector steps of each rollout"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of the general advantage estimation"""
    num_minibatches: int = 4
    """the minibatches each epoch splits the rollout into"""
    update_epochs: int = 4
    """the passes over the rollout of each update"""
    norm_adv: bool = True
    """normalize the advantages of each minibatch"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """use a clipped loss for the value function, as in the paper"""
    ent_coef: float = 0.01
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value function loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """stop an update's epochs once the approximate KL exceeds this"""

    compile: bool = False
    """compile GAE, the update's loss and the acting policy with `torch.compile`"""
    cudagraphs: bool = False
    """record the acting policy and the update as CUDA graphs (needs a CUDA device)"""


def make_envs(env_id, num_envs, batch_size, seed, num_threads=0, videos=None, prefix="train"):
    """envpool's Atari games with gymnasium's step signature, episodic life and clipped rewards.
    `recv` returns `batch_size` of them, stepped by `num_threads` threads (0: envpool's choice).
    With `videos` (a folder) env 0's games are recorded there, as `prefix`-episode-<game>.mp4.
    `check_args` has checked that `env_id` is one of envpool's Atari games."""
    pool = dict(batch_size=batch_size, num_threads=num_threads)
    if videos:
        pool["render_mode"] = "rgb_array"
    envs = envpool.make_gymnasium(
        env_id, num_envs=num_envs, seed=seed, episodic_life=True, reward_clip=True, **pool
    )
    return VideoRecorder(envs, videos, prefix) if videos else envs


def finished_batch_games(game_returns, infos, truncations):
    """The scores of the games that ended in this batch, over all their lives; `game_returns`
    (one per env) adds up `info["reward"]` by `info["env_id"]`, in place."""
    env_id = infos["env_id"]
    game_returns[env_id] += infos["reward"]
    game_over = env_id[infos["terminated"].astype(bool) | truncations]
    scores = game_returns[game_over].tolist()
    game_returns[game_over] = 0.0
    return scores


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature DQN torso shared by a policy head and a value head. It takes stacked frames
    [batch, 4, 84, 84] with pixels in 0..255."""

    def __init__(self, n_act, device=None):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4, device=device)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2, device=device)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1, device=device)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512, device=device)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_act, device=device), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1, device=device), std=1)

    def get_value(self, x):
        return self.critic(self.network(x.float() / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x.float() / 255.0)  # uint8 frames become floats here
        logits = self.actor(hidden)
        # Categorical's sample, log_prob and entropy, written out. Gumbel-max sampling: the argmax
        # of logits plus Gumbel noise is distributed as softmax(logits).
        log_probs = logits.log_softmax(-1)
        if action is None:
            gumbel = -torch.log(-torch.log(torch.rand_like(logits)))
            action = (log_probs + gumbel).argmax(-1)
        log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return action, log_prob, entropy, self.critic(hidden)


def gae(rewards, values, next_value, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation: (advantages, returns), each [num_steps, num_envs].
    envpool resets in next-step mode: after an episode ends at step t, `values[t + 1]` is the
    value of its final observation, which a truncated step bootstraps from."""
    dones = torch.maximum(terminations, truncations)
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)]) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1}, c_t = gamma * lambda * (1 - done_t), solved by doubling:
    # after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of A_t and
    # coefs[t] is the product of their c's: log2(num_steps) rounds, a small compiled graph.
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat(
            [advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]]
        )
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


def make_learner(args, n_act, device):
    """PPO's agent and optimizer on `device`, and the functions `main` calls."""
    agent = Agent(n_act, device=device)
    if device.type == "cpu":  # oneDNN's convolutions are faster on channels-last (NHWC) weights
        agent = agent.to(memory_format=torch.channels_last)
    # a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # fused: one kernel for all parameters; only a capturable optimizer's step can be recorded
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=args.cudagraphs
    )

    def loss_fn(mb):
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb["obs"], mb["actions"])
        logratio = newlogprob - mb["logprobs"]
        ratio = logratio.exp()
        with torch.no_grad():
            # http://joschu.net/blog/kl-approx.html
            old_approx_kl = (-logratio).mean()
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

        mb_advantages = mb["advantages"]
        if args.norm_adv:
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        newvalue = newvalue.view(-1)
        v_loss = (newvalue - mb["returns"]) ** 2
        if args.clip_vloss:
            v_clipped = mb["values"] + torch.clamp(
                newvalue - mb["values"], -args.clip_coef, args.clip_coef
            )
            v_loss = torch.max(v_loss, (v_clipped - mb["returns"]) ** 2)
        v_loss = 0.5 * v_loss.mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
        stats = [pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]
        return loss, torch.stack(stats).detach()

    if args.compile:  # the loss, forward and backward; the clip and the Adam step stay eager
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb):
        """One gradient step on a minibatch (a TensorDict); returns its statistics."""
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    # acting reads the weights through a copy that shares their memory but has no autograd state
    agent_inference = Agent(n_act, device=device)
    from_module(agent).data.to_module(agent_inference)
    return SimpleNamespace(
        agent=agent,
        optimizer=optimizer,
        policy=agent_inference.get_action_and_value,
        get_value=agent_inference.get_value,
        update=update,
    )


def make_storage(num_steps, num_envs, obs_shape, device):
    """The rollout's storage, [2 * num_steps + 2, num_envs, ...], each env's steps in its column.
    The rows past num_steps hold the next rollout's first steps, which envs take while others
    finish theirs: at most num_steps + 1."""
    shape = (2 * num_steps + 2, num_envs)
    keys = ("logprobs", "values", "rewards", "terminations", "truncations")
    storage = TensorDict(
        {key: torch.zeros(shape, device=device) for key in keys}, batch_size=shape, device=device
    )
    storage["obs"] = torch.zeros(*shape, *obs_shape, dtype=torch.uint8, device=device)
    storage["actions"] = torch.zeros(shape, dtype=torch.long, device=device)
    return storage


class RolloutState:
    """What one rollout hands the next."""

    def __init__(self, num_envs):
        self.step = np.zeros(num_envs, dtype=np.int64)  # the row of each env's next action
        self.game_returns = np.zeros(num_envs)  # each env's game in play
        self.held = []  # batches (frames, env ids) waiting for the updated policy
        self.pending = []  # actions (actions, env ids) chosen, not sent
        self.global_step = 0  # env steps sent


def collect_rollout(envs, policy, get_value, rollout, state, num_steps, log_episodes):
    """Fill rows 0..num_steps-1 of `rollout` with each env's next `num_steps` steps, in order,
    and row `num_steps` of its values with its bootstrap value. `envs` runs envpool's async API,
    started by `async_reset()`; `log_episodes(global_step, scores)` gets the games that end."""
    complete = np.zeros(len(state.step), dtype=bool)  # the envs that have their steps
    device = rollout.device

    def cells(rows, env_id):
        return tuple(torch.as_tensor(np.stack([rows, env_id]), device=device))

    def act(obs, env_id, send):
        """Act on one batch; the envs in `send` (a mask) step, the others' actions wait."""
        with torch.no_grad():
            action, logprob, _, value = policy(obs)
        actions = action.cpu().numpy()
        envs.send(actions[send], env_id[send])
        if not send.all():
            state.pending.append((actions[~send], env_id[~send]))
        for row, env, frame in zip(state.step[env_id].tolist(), env_id.tolist(), obs):
            # a copy per frame: on a CPU an indexed write of whole frames is much slower
            rollout["obs"][row, env] = frame
        index = cells(state.step[env_id], env_id)
        rollout["actions"][index] = action
        rollout["logprobs"][index] = logprob
        rollout["values"][index] = value.flatten()
        state.step[env_id] += 1
        state.global_step += int(send.sum())

    def dispatch(batches, in_flight):
        """Act on `batches` with `in_flight` envs stepping; returns the envs in flight after.
        Envs that lag step on. While any lags, a few that have their steps step too, to fill
        the batch that `recv` waits for. The rest wait for the next rollout."""
        env_ids = np.concatenate([env_id for _, env_id in batches])
        send = state.step[env_ids] < num_steps  # the laggards
        complete[env_ids[~send]] = True
        if not complete.all():
            fill = max(0, len(batches[0][1]) - in_flight - send.sum())
            send[np.flatnonzero(~send)[:fill]] = True
        for (obs, env_id), sends in zip(batches, np.split(send, len(batches))):
            if sends.any():
                act(obs, env_id, sends)
            else:  # the batch waits for the updated policy, and its value bootstraps
                with torch.no_grad():
                    value = get_value(obs).flatten()
                rollout["values"][cells(state.step[env_id], env_id)] = value
                state.held.append((obs, env_id))
        return in_flight + int(send.sum())

    # the steps envs took past the last rollout are this rollout's first
    if state.step.min() >= num_steps:
        lead = state.step.max() - num_steps
        # clone: the two overlap when lead > num_steps
        rollout[:lead] = rollout[num_steps : num_steps + lead].clone()
        state.step -= num_steps
    pending, state.pending, held, state.held = state.pending, [], state.held, []
    # chosen before the update, as a carried step was: its stored logprob says so
    for actions, env_id in pending:
        envs.send(actions, env_id)
        state.global_step += len(env_id)
    in_flight = len(state.step) - sum(len(env_id) for _, env_id in held)
    if held:  # held at the end of the last rollout, they act with the updated policy
        in_flight = dispatch(held, in_flight)
    while not complete.all():
        obs, reward, terminations, truncations, infos = envs.recv()
        env_id = infos["env_id"]
        in_flight -= len(env_id)
        # each env's last outcome goes one row above its new frame (the reset's zeros to row 0)
        index = cells(np.maximum(state.step[env_id] - 1, 0), env_id)
        outcome = dict(rewards=reward, terminations=terminations, truncations=truncations)
        for key, array in outcome.items():
            rollout[key][index] = torch.as_tensor(array, device=device, dtype=torch.float)
        scores = finished_batch_games(state.game_returns, infos, truncations)
        log_episodes(state.global_step, scores)
        obs = torch.from_numpy(obs).to(device)  # on a CPU, a view of envpool's array
        in_flight = dispatch([(obs, env_id)], in_flight)


def main(args):
    if args.async_batch_size is None:  # half the envs, at least one
        args.async_batch_size = max(1, args.num_envs // 2)
    # on a CPU, envs and policy on the same cores would take turns, not overlap
    if args.env_threads is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        args.env_threads = max(1, cores - 1)
    check_args(args)
    # runs.py: folder, seeds, signals, ...; --env-threads may change on resume
    run = AtariRun(args, "ppo_atari_envpool_async", free_flags=("env_threads",))
    videos = None if args.eval_model else run.videos
    envs = make_envs(  # fresh games on resume
        args.env_id, args.num_envs, args.async_batch_size, run.env_seed, args.env_threads, videos
    )
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    learner = make_learner(args, envs.single_action_space.n, device)
    agent, optimizer = learner.agent, learner.optimizer
    policy, get_value, update = learner.policy, learner.get_value, learner.update
    compute_gae = gae

    # actions sampled, as CleanRL evaluates: a greedy agent can stall a game
    def evaluate_agent(episodes, videos):
        eval_envs = make_envs(args.env_id, 1, 1, args.seed, 0, videos, "eval")
        play = agent.get_action_and_value
        return evaluate_games(lambda obs: play(obs)[0], eval_envs, episodes, device)

    extra = dict(async_batch_size=args.async_batch_size, env_threads=args.env_threads)
    if args.eval_model:
        agent.load_state_dict(run.saved_model)
        envs.close()
        return run.finish(device, agent.state_dict(), evaluate_agent, **extra)
    if args.compile:
        compute_gae = torch.compile(gae, fullgraph=True)
        policy = torch.compile(policy, fullgraph=True)
    if args.cudagraphs:
        # the first `warmup - 1` calls run as they are (the optimizer makes its state), the next
        # records the graph, later calls replay it; compiled, one more call compiles for that state
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    obs_shape = envs.single_observation_space.shape
    storage = make_storage(args.num_steps, args.num_envs, obs_shape, device)
    rollout = storage[: args.num_steps]  # a view: what the update learns from
    state = RolloutState(args.num_envs)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(agent=learner.agent, optimizer=learner.optimizer)
        return dict(learner=state)

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    state.global_step = run.steps
    envs.async_reset()  # every env resets in envpool's threads; recv returns them by batches
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(state.global_step)  # sps counts from here, past compile and warm-up
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # no recompile

        # rollout
        collect_rollout(envs, policy, get_value, storage, state, args.num_steps, run.log_episodes)

        # advantages
        next_value = storage["values"][args.num_steps]  # each env's, after its num_steps steps
        advantages, returns = compute_gae(
            rollout["rewards"],
            rollout["values"],
            next_value,
            rollout["terminations"],
            rollout["truncations"],
            args.gamma,
            args.gae_lambda,
        )
        b = rollout.select("obs", "actions", "logprobs", "values").flatten(0, 1)
        b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()

        # update
        for _ in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                stats = update(b[mb_inds])
            # host sync, once per epoch
            if args.target_kl is not None and stats[4] > args.target_kl:
                break

        # log
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        metrics = dict(zip(names, stats), learning_rate=optimizer.param_groups[0]["lr"])
        explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
        metrics["explained_variance"] = explained_var
        run.log_progress(state.global_step, metrics)
        # the env steps so far; a checkpoint when due, on a signal, at the end
        run.checkpoint(iteration, training_state, state.global_step)
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, agent.state_dict(), evaluate_agent, **extra)


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
    flags += ("learning_rate", "env_threads", "clip_coef", "max_grad_norm", "target_kl")
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value <= 0:  # --target-kl None: off
            fail(f"--{flag.replace('_', '-')} must be positive, got {value}")
    batch_size = args.num_steps * args.num_envs
    if args.total_timesteps < batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one rollout (--num-steps x "
            "--num-envs)"
        )
    if batch_size % args.num_minibatches != 0 or batch_size < 2 * args.num_minibatches:
        fail(
            f"--num-steps x --num-envs ({batch_size}) must be divisible by --num-minibatches into "
            "minibatches of 2+"
        )
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    n = args.async_batch_size
    if n <= 0 or args.num_envs % n != 0:
        fail(f"--async-batch-size ({n}; default: half of --num-envs) must divide --num-envs")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device, and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args))
