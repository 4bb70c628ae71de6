"""PPO on Atari with envpool, optimized: the twin of ppo_atari_envpool.py.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's: Breakout-v5, 10M steps, 8 envs
x 128 steps.

    python leanrl/ppo_atari_envpool_torchcompile.py --compile               # on a CPU
    python leanrl/ppo_atari_envpool_torchcompile.py --compile --cudagraphs  # fastest on a GPU

The eager twin's algorithm and loop, with the data flow rewritten for speed:
- frames stay uint8 from envpool to the network, copied once, into their slot of the rollout;
- the rollout is one TensorDict on the device, flattened and cut into minibatches in one call;
- acting uses a copy of the agent that shares its weights but has no autograd state;
- the categorical is written out, as torch.distributions checks its arguments with a host sync;
- GAE is solved by doubling instead of a loop over the steps;
- Adam is fused, its learning rate a tensor annealed in place;
- `--compile` compiles acting, GAE and the loss with its backward (the clip and Adam stay eager);
- `--cudagraphs` records acting and the update as CUDA graphs (on a CUDA device).

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
import tyro
from atari import AtariRun, VideoRecorder, evaluate_games, finished_games
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


def main(args):
    check_args(args)
    run = AtariRun(args, "ppo_atari_envpool_torchcompile")  # atari.py: folder, seeds, signals, ...
    videos = None if args.eval_model else run.videos
    envs = make_envs(args.env_id, args.num_envs, run.env_seed, videos)  # fresh games on resume
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    learner = make_learner(args, envs.single_action_space.n, device)
    agent, optimizer = learner.agent, learner.optimizer
    policy, get_value, update = learner.policy, learner.get_value, learner.update
    compute_gae = gae

    # actions sampled, as CleanRL evaluates: a greedy agent can stall a game
    def evaluate_agent(episodes, videos):
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, "eval")
        play = agent.get_action_and_value
        return evaluate_games(lambda obs: play(obs)[0], eval_envs, episodes, device)

    if args.eval_model:
        agent.load_state_dict(run.saved_model)
        envs.close()
        return run.finish(device, agent.state_dict(), evaluate_agent)
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
    shape = (args.num_steps, args.num_envs)
    keys = ("logprobs", "values", "rewards", "terminations", "truncations")
    rollout = TensorDict(
        {key: torch.zeros(shape, device=device) for key in keys}, batch_size=shape, device=device
    )
    obs_shape = envs.single_observation_space.shape
    rollout["obs"] = torch.zeros(*shape, *obs_shape, dtype=torch.uint8, device=device)
    rollout["actions"] = torch.zeros(shape, dtype=torch.long, device=device)

    next_obs, _ = envs.reset()
    next_obs = torch.from_numpy(next_obs)
    game_returns = np.zeros(args.num_envs)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(agent=learner.agent, optimizer=learner.optimizer)
        return dict(learner=state)

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
                action, logprob, _, value = policy(obs)
            rollout["values"][step] = value.flatten()
            rollout["actions"][step] = action
            rollout["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            outcome = dict(rewards=reward, terminations=terminations, truncations=truncations)
            for key, array in outcome.items():
                rollout[key][step] = torch.as_tensor(array, device=device, dtype=torch.float)
            next_obs = torch.from_numpy(next_obs)  # a view of envpool's array, no copy
            run.log_episodes(global_step, finished_games(game_returns, infos, truncations))

        # advantages
        with torch.no_grad():
            next_value = get_value(next_obs.to(device)).flatten()
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
        run.log_progress(global_step, metrics)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, agent.state_dict(), evaluate_agent)


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
    flags += ("learning_rate", "clip_coef", "max_grad_norm", "target_kl")
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
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device, and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args))
