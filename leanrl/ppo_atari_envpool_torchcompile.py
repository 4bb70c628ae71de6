"""PPO on Atari with envpool, optimized: the twin of ppo_atari_envpool.py.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's: Breakout-v5, 10M steps, 8 envs
x 128 steps.

    python leanrl/ppo_atari_envpool_torchcompile.py --compile               # on a CPU
    python leanrl/ppo_atari_envpool_torchcompile.py --compile --cudagraphs  # fastest on a GPU

The same algorithm and loop as the eager twin, with the data flow rewritten for speed:
- frames stay uint8 from envpool to the network, copied once, into their slot of the rollout;
- the rollout is one TensorDict on the device, flattened and cut into minibatches in one call;
- acting uses a copy of the agent that shares its weights but has no autograd state;
- the categorical is written out, as torch.distributions checks its arguments with a host sync;
- GAE is solved by doubling instead of a loop over the steps;
- Adam is fused, its learning rate a tensor annealed in place;
- `--compile` compiles acting, GAE and the loss with its backward (the clip and Adam stay eager);
- `--cudagraphs` records acting and the update as CUDA graphs; it needs a CUDA device.

A resumed run (--resume) gets its learner back exactly (network, optimizer, learning-rate schedule,
counters, generators, curve), but envpool's envs cannot be saved: its games start fresh, seeded
with --seed plus the step it resumes from (`fresh_episodes: true` in the summary's `resumes`).
"""

import json
import os
import random
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import numpy as np
import torch
import torch.nn as nn
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule


@dataclass
class Args:
    exp_name: str = "ppo_atari_envpool_torchcompile"
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use a CUDA device when there is one, else the CPU"""
    track: bool = False
    """log to Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of the first env and of every evaluation episode to runs/<run_name>/videos/"""
    save_model: bool = False
    """save the policy's weights and the run's arguments to runs/<run_name>/<script>.pt"""
    eval_episodes: int = 0
    """after training, play this many games with the trained policy (0: none)"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes games instead of training"""
    measure_burnin: int = 3
    """the first iterations, which compile and warm up, left out of `sps`"""
    checkpoint_minutes: float = 10.0
    """save the training state to runs/<run_name>/checkpoint.pt this often, and always on a first
    Ctrl-C or SIGTERM and at the end (0: only then)"""
    resume: str | None = None
    """continue the run of this checkpoint or run folder (`auto`: of runs/<run_name>, if any)"""
    run_name: str | None = None
    """the run folder's name under runs/ (default: <env_id>__<exp_name>__<seed>__<unix time>)"""

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


def finished_games(game_returns, infos, truncations):
    """The scores of the games that ended on this step, over all their lives. envpool's info
    has no episode statistics, so `game_returns` (one per env) adds up `info["reward"]` in place."""
    game_returns += infos["reward"]
    game_over = infos["terminated"].astype(bool) | truncations
    scores = game_returns[game_over].tolist()
    game_returns[game_over] = 0.0
    return scores


class VideoRecorder:
    """envpool's `envs`, recording the games of env 0 from `render()` to
    `<folder>/<prefix>-episode-<game>.mp4`: every game for "eval", gymnasium's schedule (games 0, 1,
    8, 27, ...) for "train". A game is a whole game, all its lives; `close()` saves one unfinished.
    The envs must be made with `render_mode="rgb_array"`."""

    def __init__(self, envs, folder, prefix):
        from gymnasium.utils.save_video import capped_cubic_video_schedule, save_video

        self.envs, self.folder, self.prefix, self.save_video = envs, folder, prefix, save_video
        self.schedule = capped_cubic_video_schedule if prefix == "train" else lambda game: True
        self.fps = 60 / envs.spec.config.frame_skip  # the console draws 60 frames a second
        self.game, self.frames = 0, []

    def __getattr__(self, name):  # the rest is envpool's
        return getattr(self.envs, name)

    def reset(self):
        obs, infos = self.envs.reset()
        self.record(infos, np.zeros(len(obs), dtype=bool))  # no game ends at a reset
        return obs, infos

    def step(self, actions):
        outcome = self.envs.step(actions)
        self.record(outcome[4], outcome[3])
        return outcome

    def recv(self):
        outcome = self.envs.recv()
        self.record(outcome[4], outcome[3])
        return outcome

    def record(self, infos, truncations):
        """env 0's frame, if it is in this batch; its video when its game ends."""
        for i in np.flatnonzero(infos["env_id"] == 0):  # async: env 0 is in some batches only
            if self.schedule(self.game):
                self.frames.append(self.envs.render(env_ids=[0])[0])
            if infos["terminated"][i] or truncations[i]:
                self.save()
                self.game += 1

    def save(self):
        if self.frames:
            self.save_video(
                self.frames,
                self.folder,
                episode_trigger=lambda game: True,  # self.frames holds only scheduled games
                name_prefix=self.prefix,
                episode_index=self.game,
                fps=self.fps,
            )
        self.frames = []

    def close(self):
        self.save()
        self.envs.close()


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
    # coefs[t] is the product of their c's. log2(num_steps) rounds of vector ops replace the
    # loop over the steps, and the compiled graph stays small.
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
    run = Run(args, "ppo_atari_envpool_torchcompile")  # seeds, run folder, wandb, signals
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
        return evaluate(lambda obs: agent.get_action_and_value(obs)[0], eval_envs, episodes, device)

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
        return dict(learner=learner)

    iterations = run.resume(training_state(), range(1, num_iterations + 1))
    global_step = run.steps
    pbar = tqdm.tqdm(iterations)
    for iteration in pbar:
        if iteration == args.measure_burnin + 1:
            run.start_clock(global_step)  # sps counts from here, past compile and warm-up
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
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
        run.log_progress(pbar, global_step, metrics)
        run.steps = global_step
        run.checkpoint(iteration, training_state)  # when due, on a signal, at the end
        if run.stop_signal or run.diverged:  # a first Ctrl-C or SIGTERM, or divergence
            break

    envs.close()
    run.finish(device, agent.state_dict(), evaluate_agent)


# ==================================================================================================
# Run plumbing, the same in every Atari script: flag errors, the run folder and summary,
# wandb, Ctrl-C and SIGTERM, divergence, checkpoints, save, load, evaluation. `check_args` is this
# script's own.


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


def check_args(args):
    """Flag values that make no sense: one line naming the flag and exit status 2."""
    for flag, value in vars(args).items():
        # nan fails every comparison; past 1e30 float32 overflows
        if isinstance(value, float) and not abs(value) <= 1e30:
            name = "--" + flag.replace("_", "-")
            fail(f"{name} must be a finite number, at most 1e30 in size, got {value}")
    env_id = args.env_id
    if (
        env_id not in envpool.list_all_envs()
        or type(envpool.make_spec(env_id)).__name__ != "AtariEnvSpec"
    ):
        fail(f"--env-id {env_id!r} is not one of envpool's Atari games (e.g. Breakout-v5)")
    if not 0 <= args.seed < 2**31:  # numpy's seeds are below 2**32, envpool's below 2**31
        fail(f"--seed must be in [0, 2**31), got {args.seed}")
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
        fail(
            "--cudagraphs needs a CUDA device and none is available (run without it, or with "
            "--compile)"
        )


class Run:
    """Everything around training: seeds, `runs/<run_name>/`, wandb, signals, checkpoints, the
    progress bar, the summary. A first Ctrl-C or SIGTERM sets `stop_signal` and a non-finite loss
    sets `diverged`: the loop stops after its step."""

    VARIANTS = r"_(torchcompile|cpu|distributed|ray|async|seeds)$"  # one algorithm, many scripts
    # flags that a resumed run may change: they do not change what is trained
    FREE_FLAGS = ("total_timesteps", "track", "wandb_project_name", "wandb_entity", "cuda")
    FREE_FLAGS += ("capture_video", "save_model", "eval_episodes", "measure_burnin")
    FREE_FLAGS += ("checkpoint_minutes", "resume", "run_name", "env_threads")

    def __init__(self, args, script):
        if args.eval_episodes < 0 or (args.eval_model and args.eval_episodes == 0):
            n = args.eval_episodes
            fail(f"--eval-episodes must be >= 0, and > 0 with --eval-model, got {n}")
        if args.checkpoint_minutes < 0 or (args.resume and args.eval_model):
            fail("--checkpoint-minutes must be >= 0, and --resume cannot go with --eval-model")
        folder = args.run_name
        if folder is not None and (os.sep in folder or folder in ("", ".", "..")):
            fail(f"--run-name must name one folder under runs/, got {folder!r}")
        self.args, self.script = args, script
        self.saved_model = self.load_model(args.eval_model) if args.eval_model else None
        self.name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.name = (args.run_name or self.name).replace(":", "_")
        self.dir = os.path.join("runs", self.name)
        self.saved = self.load_checkpoint()  # None unless resumed; its folder becomes the run's
        # envpool's envs cannot be saved: a resumed run's games start fresh, seeded by its step
        # (envpool's seeds are below 2**31)
        self.env_seed = (args.seed + (self.saved["step"] if self.saved else 0)) % 2**31
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
        self.returns = deque(maxlen=20)  # the last 20 episodic returns
        self.curve = []  # [step, seconds, return] of every episode
        self.start_time, self.measure_start, self.measure_step = time.time(), None, 0
        self.steps, self.stop_signal, self.diverged = 0, 0, None
        self.resumes = []
        self.next_checkpoint = time.time() + 60 * (args.checkpoint_minutes or float("inf"))
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
        """Copy the checkpoint's training state into `state` (in place) and its counters, curve and
        generators into the run; returns the part of `iterations` left to run."""
        saved, self.saved, self.iterations = self.saved, None, iterations  # the buffer once
        if saved is None:
            return iterations
        self.restore(state, saved["state"])
        python, numpy, cpu, cuda = saved["generators"]
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if len(cuda) == torch.cuda.device_count() > 0:  # on as many GPUs
            torch.cuda.set_rng_state_all(cuda)
        self.steps, self.curve = saved["step"], saved["curve"]
        self.returns.extend(saved["returns"])
        self.start_time = time.time() - saved["wall_s"]
        self.resumes = saved["resumes"] + [dict(step=self.steps, fresh_episodes=True)]
        self.start_clock(self.steps)
        return range(saved["iteration"], iterations.stop)

    def checkpoint(self, iteration, state):
        """After `iteration`, when due, on a first signal and at the end: `state()`, the counters
        and the generators to checkpoint.pt, written to a temporary file and renamed."""
        final = iteration + 1 == self.iterations.stop
        if self.diverged or not (final or self.stop_signal or time.time() > self.next_checkpoint):
            return
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        generators = (random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)
        saved = dict(script=self.script, args=vars(self.args), iteration=iteration + 1)
        saved |= dict(step=self.steps, final=final, curve=self.curve, returns=list(self.returns))
        saved |= dict(wall_s=time.time() - self.start_time, resumes=self.resumes)
        saved |= dict(wandb_id=self.wandb and self.wandb.run.id, generators=generators)
        path = os.path.join(self.dir, "checkpoint.pt")
        torch.save(saved | dict(state=self.state_of(state())), path + ".tmp")
        os.replace(path + ".tmp", path)
        self.next_checkpoint = time.time() + 60 * (self.args.checkpoint_minutes or float("inf"))

    def state_of(self, obj):
        """What `restore` puts back: state dicts and tensors (not the envs, which envpool cannot
        save)."""
        if hasattr(obj, "state_dict"):
            return obj.state_dict()
        if isinstance(obj, SimpleNamespace):
            obj = vars(obj)
        if isinstance(obj, dict):  # what has a state: no functions
            kept = {k: v for k, v in obj.items() if hasattr(v, "state_dict") or not callable(v)}
            return {k: self.state_of(v) for k, v in kept.items()}
        return obj.clone()

    def restore(self, obj, saved):
        """`saved` into `obj`, in place."""
        if isinstance(obj, torch.optim.Optimizer):  # a tensor lr in place: a CUDA graph reads it
            rates = [group["lr"] for group in obj.param_groups]
            obj.load_state_dict(saved)
            for group, rate in zip(obj.param_groups, rates):
                if isinstance(rate, torch.Tensor):
                    group["lr"] = rate.copy_(group["lr"])
        elif hasattr(obj, "load_state_dict"):
            obj.load_state_dict(saved)
        elif isinstance(obj, (dict, SimpleNamespace)):
            items = obj.items() if isinstance(obj, dict) else vars(obj).items()
            for key, value in items:
                if key in saved:
                    self.restore(value, saved[key])
        else:
            with torch.no_grad():
                obj.copy_(torch.as_tensor(saved))

    def video_folder(self):
        """runs/<run_name>/videos, once we know that this machine can record envpool's frames."""
        try:
            __import__("gymnasium.utils.save_video")  # the writer, moviepy's
            envs = envpool.make_gymnasium(self.args.env_id, num_envs=1, render_mode="rgb_array")
            envs.reset()
            assert isinstance(envs.render(env_ids=[0]), np.ndarray), "no frame"
            envs.close()
        except Exception as e:
            fail(f"--capture-video: {self.args.env_id} cannot record video here ({e!r})")
        videos = os.path.join(self.dir, "videos")
        # a resumed run's recorder counts episodes from 0 again: a folder of its own keeps the first
        return os.path.join(videos, f"resumed-{self.saved['step']}") if self.saved else videos

    def start_clock(self, global_step):
        self.measure_start, self.measure_step = time.time(), global_step

    def sps(self, global_step, now=None):
        if self.measure_start:  # None before the clock starts
            seconds = (now or time.time()) - self.measure_start
            return (global_step - self.measure_step) / seconds

    def log_episodes(self, global_step, returns):
        for episodic_return in returns:
            self.returns.append(episodic_return)
            self.curve.append([global_step, time.time() - self.start_time, episodic_return])
            if self.wandb:
                self.wandb.log({"charts/episodic_return": episodic_return}, step=global_step)

    def log_progress(self, pbar, global_step, metrics):
        """Show sps and the mean return; log `metrics` to wandb. A loss or `weight_norm` that is not
        finite diverges the run."""
        tensors = {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)}
        values = torch.stack([*tensors.values()]).tolist() if tensors else []  # host sync
        metrics = metrics | dict(zip(tensors, values))
        sps = self.sps(global_step) or 0.0
        return_mean = np.mean(self.returns) if self.returns else float("nan")
        pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
        if self.wandb:
            losses = {f"losses/{k}": float(v) for k, v in metrics.items()}
            self.wandb.log(losses | {"charts/SPS": sps}, step=global_step)
        for name, value in metrics.items():
            if ("loss" in name or name == "weight_norm") and not np.isfinite(value):
                self.diverge(global_step, name, value)

    def diverge(self, step, metric, value):
        if self.diverged:
            return
        rates = [(k, v) for k, v in vars(self.args).items() if k.endswith(("lr", "learning_rate"))]
        rates = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in rates if isinstance(v, float))
        line = f"error: diverged at step {step}: {metric} is {value}; maybe too large: {rates}"
        tqdm.tqdm.write(line, file=sys.stderr)
        self.diverged = dict(step=step, metric=metric, value=str(value))

    def finish(self, device, model, evaluate, **extra):
        """Save `model` (--save-model), write summary.json, play --eval-episodes with
        `evaluate(episodes, videos)`, print the SUMMARY line. A diverged run saves and plays
        nothing and exits 3; a stopped one exits as a shell reports a signal (130 or 143)."""
        args, end_time = self.args, time.time()
        weights = [w for v in model.values() for w in (v.values() if isinstance(v, dict) else [v])]
        weight_sum = float(sum(w.double().sum() for w in weights))  # host sync, once
        if not np.isfinite(weight_sum):
            self.diverge(self.steps, "weight_sum", weight_sum)
        if self.returns and not np.isfinite(np.mean(self.returns)):
            self.diverge(self.steps, "return_mean", np.mean(self.returns))
        model_file = None
        if args.save_model and not self.diverged:  # torch.load(model_file, weights_only=True)
            model_file = os.path.abspath(os.path.join(self.dir, f"{self.script}.pt"))
            saved = {"script": self.script, "args": vars(args), "model": model}
            torch.save(saved, model_file + ".tmp")
            os.replace(model_file + ".tmp", model_file)
        wall_s = end_time - self.start_time
        summary = dict(
            script=self.script,
            env_id=args.env_id,
            seed=args.seed,
            device=str(device),
            compile=getattr(args, "compile", False),
            cudagraphs=getattr(args, "cudagraphs", False),
            num_envs=args.num_envs,
            total_timesteps=self.steps,
            sps=self.sps(self.steps, end_time),
            sps_wall=self.steps / wall_s,
            wall_s=wall_s,
            torch_version=torch.__version__,
            episodes=len(self.curve),
            return_mean=float(np.mean(self.returns)) if self.returns else None,
            interrupted=self.stop_signal > 0,
            resumes=self.resumes,
            model_file=model_file,
            eval_returns=[],
            eval_return_mean=None,
        )
        summary |= extra  # a script's own fields, which may override the ones above
        if args.eval_episodes and not self.diverged:
            self.write_summary(summary)  # kept if a second signal kills the evaluation
            returns = evaluate(args.eval_episodes, self.videos)
            summary |= dict(eval_returns=returns, eval_return_mean=float(np.mean(returns)))
        print("SUMMARY " + json.dumps(self.write_summary(summary)), flush=True)
        if self.wandb:
            self.wandb.finish()
        if self.diverged or self.stop_signal:
            sys.exit(3 if self.diverged else 128 + self.stop_signal)

    def write_summary(self, summary):
        """summary.json, written atomically, non-finite numbers as strings; returns what the SUMMARY
        line prints."""
        text = json.dumps(summary | {"diverged": self.diverged, "curve": self.curve})
        summary = json.loads(text, parse_constant=lambda c: str(float(c)))
        curve, path = summary.pop("curve"), os.path.join(self.dir, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary | {"curve": curve}, f)
        os.replace(path + ".tmp", path)
        return summary | {"summary_file": os.path.abspath(path)}


def evaluate(act, envs, games, device):
    """The scores of `games` whole games played on `envs` (one env, closed after) with `act(obs) ->
    actions`."""
    obs, _ = envs.reset()
    game_returns, scores = np.zeros(1), []
    while len(scores) < games:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device))
        obs, _, _, truncations, infos = envs.step(actions.cpu().numpy())
        scores += finished_games(game_returns, infos, truncations)
    envs.close()
    return scores[:games]


if __name__ == "__main__":
    main(tyro.cli(Args))
