"""Proximal Policy Optimization on Atari with envpool, optimized: the twin of ppo_atari_envpool.py.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (Breakout-v5, 10M steps, 8 envs x 128 steps).

    python leanrl/ppo_atari_envpool_torchcompile.py --compile               # on a CPU
    python leanrl/ppo_atari_envpool_torchcompile.py --compile --cudagraphs  # fastest on a CUDA GPU

Same algorithm, same defaults and same loop as the eager twin; what changes is the data flow:
- observations stay uint8 (4x smaller than float32) from envpool to the network, which converts them; envpool
  returns a fresh array each step, which is copied once, into its slot of the rollout, and acting reads that slot;
- the rollout is one TensorDict preallocated on the device: flattening it and cutting minibatches are one call;
- acting uses a copy of the agent that shares its weights but carries no autograd state;
- the categorical's sampling, log-probability and entropy are written out (torch.distributions validates and
  builds objects on every call);
- GAE solves its backward recurrence by doubling: log2(num_steps) vectorized steps instead of a Python loop;
- a fused Adam (capturable under `--cudagraphs`) whose learning rate is a tensor annealed in place;
- `--compile` compiles GAE and the loss (forward and backward) of the update, and the acting policy;
- `--cudagraphs` records the acting policy and the update as CUDA graphs (tensordict's `CudaGraphModule`)
  and replays them with one launch each; it needs a CUDA device and exits with status 2 without one.

envpool (1.2.5, `env_type="gymnasium"`) steps the games in C++ threads and does DeepMind's preprocessing: 4 frames
skipped per step, 30 no-op resets, grayscale 84x84 frames stacked by 4, rewards clipped to their sign, and
episodic life (losing a life ends the episode the agent learns from). Its info has no episode statistics, so
`EpisodeStats` sums `info["reward"]` (the unclipped score) over a whole game, across its lives, and logs each
game when it ends (`info["terminated"]`: no life left, or the step limit).

envpool resets in next-step mode: the step that ends an episode returns its true final observation, and the
next step ignores the action and returns the first observation of the next episode with reward 0. So a
truncated step bootstraps from the value of the observation after it, which is its true final observation (a
terminated one bootstraps with 0), and the reset step stays in the rollout as CleanRL keeps it.
"""

import json
import os
import random
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

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
    """iterations (rollout + update) excluded from `sps` (they compile and warm up)"""

    env_id: str = "Breakout-v5"
    """the id of the envpool Atari task"""
    total_timesteps: int = 10_000_000
    """total environment steps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of vector steps of each rollout (env steps per iteration: num_steps * num_envs)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of the general advantage estimation"""
    num_minibatches: int = 4
    """the number of minibatches each epoch splits the rollout into"""
    update_epochs: int = 4
    """the number of epochs (passes over the rollout) of each update"""
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
    """stop an update's epochs early once the approximate KL exceeds this (off by default)"""

    compile: bool = False
    """compile GAE, the update's loss and the acting policy with `torch.compile`"""
    cudagraphs: bool = False
    """record the acting policy and the update as CUDA graphs (needs a CUDA device)"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    for flag in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.total_timesteps < args.num_steps * args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout (--num-steps x --num-envs)")
    if (args.num_steps * args.num_envs) % args.num_minibatches != 0:
        fail(f"--num-steps x --num-envs ({args.num_steps * args.num_envs}) is not divisible by --num-minibatches {args.num_minibatches}")
    if args.num_steps * args.num_envs < 2 * args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} leaves minibatches of one sample (--num-steps x --num-envs too small)")
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.clip_coef <= 0 or args.max_grad_norm <= 0 or args.measure_burnin < 0:
        fail("--clip-coef and --max-grad-norm must be positive and --measure-burnin >= 0")
    if args.target_kl is not None and args.target_kl <= 0:
        fail(f"--target-kl must be positive, got {args.target_kl}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and none is available (run without it, or with --compile)")
    if args.eval_episodes < 0:
        fail(f"--eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.eval_model and args.eval_episodes == 0:
        fail("--eval-model needs --eval-episodes N, N > 0")
    if args.capture_video:
        fail("--capture-video: envpool 1.2.5 renders no frames, so the Atari scripts cannot record videos")


def make_envs(env_id, num_envs, seed):
    """envpool's Atari games with DeepMind's preprocessing, stepped in C++ threads, gymnasium's step signature.
    An unknown task or one that is not an Atari game exits with status 2."""
    if env_id not in envpool.list_all_envs():
        fail(f"--env-id {env_id!r} is not an envpool task (see envpool.list_all_envs())")
    if type(envpool.make_spec(env_id)).__name__ != "AtariEnvSpec":
        fail(f"--env-id {env_id!r} is not an Atari game; this PPO needs one of envpool's Atari tasks (e.g. Breakout-v5)")
    return envpool.make(
        env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, episodic_life=True, reward_clip=True,
        noop_max=30, frame_skip=4, stack_num=4, img_height=84, img_width=84,
    )


def finished_games(game_returns, infos, truncations):
    """Add this step's unclipped rewards to `game_returns` (one per env, in place); return the scores and lengths
    (agent steps) of the games that ended on this step: no life left (`info["terminated"]`) or cut off at
    envpool's step limit. Several envs can finish on the same step."""
    game_returns += infos["reward"]
    game_over = infos["terminated"].astype(bool) | truncations
    finished = game_returns[game_over].tolist(), infos["elapsed_step"][game_over].tolist()
    game_returns[game_over] = 0.0
    return finished


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature DQN torso (3 convolutions, 512 units) shared by a policy head and a value head; takes the
    stacked frames [batch, 4, 84, 84] with pixels in 0..255."""

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
        hidden = self.network(x.float() / 255.0)  # uint8 frames become floats here, in the network
        logits = self.actor(hidden)
        # Categorical(logits=logits).sample(), .log_prob(action) and .entropy(), written out; sampling by the
        # Gumbel-max trick: the argmax of logits plus Gumbel noise is distributed as softmax(logits)
        log_probs = logits.log_softmax(-1)
        if action is None:
            gumbel = -torch.log(-torch.log(torch.rand_like(logits)))
            action = (log_probs + gumbel).argmax(-1)
        log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return action, log_prob, entropy, self.critic(hidden)


def make_agent(n_act, device):
    """The agent; on a CPU with channels-last (NHWC) weights, on which oneDNN's convolutions are faster (README)."""
    agent = Agent(n_act, device=device)
    return agent.to(memory_format=torch.channels_last) if device.type == "cpu" else agent


def gae(rewards, values, next_value, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation; returns (advantages, returns), both [num_steps, num_envs].

    Every input is [num_steps, num_envs] but `next_value` [num_envs], the value of the observation after the
    last step. `terminations[t]` / `truncations[t]` (0 or 1) say the episode ended at step t by reaching a
    terminal state (or losing a life) / by being cut off. envpool returns the true final observation after the
    step that ends an episode, so `values[t + 1]` is its value: a truncated step bootstraps from it, a terminated
    one with 0."""
    dones = torch.maximum(terminations, truncations)
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)]) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1} with c_t = gamma * lambda * (1 - done_t), stopped at the end of an episode.
    # Solved by doubling: after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of A_t and
    # coefs[t] is the product of their c's, so ceil(log2(num_steps)) rounds of a few vectorized ops replace the
    # num_steps-long loop, and the compiled graph stays small. The same sums, added in another order.
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat([advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]])
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


def make_update(agent, optimizer, args, compile_loss=False):
    """One clipped-surrogate gradient step on a minibatch (a TensorDict); returns its statistics.
    `compile_loss`: compile the forward and backward of the loss; the clip and the Adam step stay eager."""

    def loss_fn(mb):
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb["obs"], mb["actions"])
        logratio = newlogprob - mb["logprobs"]
        ratio = logratio.exp()

        with torch.no_grad():
            # calculate approx_kl http://joschu.net/blog/kl-approx.html
            old_approx_kl = (-logratio).mean()
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

        mb_advantages = mb["advantages"]
        if args.norm_adv:
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

        # Policy loss
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        # Value loss
        newvalue = newvalue.view(-1)
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - mb["returns"]) ** 2
            v_clipped = mb["values"] + torch.clamp(newvalue - mb["values"], -args.clip_coef, args.clip_coef)
            v_loss_clipped = (v_clipped - mb["returns"]) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        else:
            v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
        return loss, torch.stack([pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]).detach()

    if compile_loss:
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb):
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    return update


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


def make_learner(args, n_act, device):
    """PPO's agent, optimizer and step functions on `device`, as `main` runs them (tests build them here too).
    Returns the agent, the optimizer and the functions (policy, get_value, update)."""
    agent = make_agent(n_act, device)
    # the learning rate is a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, **adam_options(args.cudagraphs))
    update = make_update(agent, optimizer, args, compile_loss=args.compile)
    # acting reads the agent's weights through a copy that shares their memory but has no autograd state
    agent_inference = Agent(n_act, device=device)
    from_module(agent).data.to_module(agent_inference)
    policy = agent_inference.get_action_and_value
    get_value = agent_inference.get_value
    return agent, optimizer, (policy, get_value, update)


def write_summary(summary, run_dir):
    """Write the whole summary, learning curve included, to `run_dir/summary.json` (a temporary file, then renamed:
    a reader never sees half of it) and print it as one `SUMMARY` line without the curve, naming that file."""
    path = os.path.join(run_dir, "summary.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f)
    os.replace(path + ".tmp", path)
    line = {key: value for key, value in summary.items() if key != "curve"} | {"summary_file": os.path.abspath(path)}
    print("SUMMARY " + json.dumps(line), flush=True)


def evaluate(act, envs, games, device):
    """The scores of `games` whole games (all their lives) played on `envs` (one env) with `act(obs) -> actions`."""
    obs, _ = envs.reset()
    game_returns, scores = np.zeros(1), []
    while len(scores) < games:
        with torch.no_grad():
            action = act(torch.as_tensor(obs, device=device))
        obs, _, _, truncations, infos = envs.step(action.cpu().numpy())
        scores += finished_games(game_returns, infos, truncations)[0]
    return scores[:games]


def stop_on_ctrl_c():
    """The first Ctrl-C asks the training loop to stop after the current iteration (rollout and update): the run then evaluates, saves and
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
    saved_model = load_model(args.eval_model, "ppo_atari_envpool_torchcompile", args.env_id) if args.eval_model else None
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = 0 if args.eval_model else args.total_timesteps // batch_size
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)  # summary.json, the model and the videos go here
    stop = stop_on_ctrl_c()
    os.makedirs(run_dir, exist_ok=True)
    envs = make_envs(args.env_id, args.num_envs, args.seed)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=run_name, save_code=True)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    obs_shape = envs.single_observation_space.shape
    n_act = envs.single_action_space.n
    agent, optimizer, (policy, get_value, update) = make_learner(args, n_act, device)
    if saved_model is not None:
        agent.load_state_dict(saved_model)
    compute_gae = gae
    if args.compile:
        compute_gae = torch.compile(gae, fullgraph=True)
        policy = torch.compile(policy, fullgraph=True)
    if args.cudagraphs:
        policy = cuda_graph(policy, args.compile)
        update = cuda_graph(update, args.compile)

    # ALGO Logic: Storage setup, [num_steps, num_envs, ...], one TensorDict; frames stay uint8
    rollout = TensorDict(
        obs=torch.zeros(args.num_steps, args.num_envs, *obs_shape, dtype=torch.uint8, device=device),
        actions=torch.zeros(args.num_steps, args.num_envs, dtype=torch.long, device=device),
        logprobs=torch.zeros(args.num_steps, args.num_envs, device=device),
        values=torch.zeros(args.num_steps, args.num_envs, device=device),
        rewards=torch.zeros(args.num_steps, args.num_envs, device=device),
        terminations=torch.zeros(args.num_steps, args.num_envs, device=device),
        truncations=torch.zeros(args.num_steps, args.num_envs, device=device),
        batch_size=[args.num_steps, args.num_envs],
        device=device,
    )

    next_obs, _ = envs.reset()
    next_obs = torch.from_numpy(next_obs)
    game_returns = np.zeros(args.num_envs)
    episode_returns = deque(maxlen=20)
    curve = []
    global_step = 0
    start_time = time.time()
    measure_start, measure_step = None, 0
    pbar = tqdm.tqdm(range(1, num_iterations + 1))
    for iteration in pbar:
        if iteration == args.measure_burnin + 1:
            measure_start, measure_step = time.time(), global_step
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # in place: no recompile

        for step in range(args.num_steps):
            global_step += args.num_envs
            obs = rollout["obs"][step]
            obs.copy_(next_obs, non_blocking=True)  # the one copy of the frames: into the rollout, read from there

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = policy(obs)
            rollout["values"][step] = value.flatten()
            rollout["actions"][step] = action
            rollout["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            rollout["rewards"][step] = torch.as_tensor(reward, device=device, dtype=torch.float)
            rollout["terminations"][step] = torch.as_tensor(terminations, device=device, dtype=torch.float)
            rollout["truncations"][step] = torch.as_tensor(truncations, device=device, dtype=torch.float)
            next_obs = torch.from_numpy(next_obs)  # a view of envpool's array, no copy

            for episodic_return, episodic_length in zip(*finished_games(game_returns, infos, truncations)):
                episode_returns.append(episodic_return)
                curve.append([global_step, time.time() - start_time, episodic_return])
                if args.track:
                    wandb.log({"charts/episodic_return": episodic_return, "charts/episodic_length": episodic_length}, step=global_step)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = get_value(next_obs.to(device)).flatten()
        advantages, returns = compute_gae(
            rollout["rewards"], rollout["values"], next_value,
            rollout["terminations"], rollout["truncations"], args.gamma, args.gae_lambda,
        )

        # flatten the batch
        b = rollout.select("obs", "actions", "logprobs", "values").flatten(0, 1)
        b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()

        # Optimizing the policy and value network
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                stats = update(b[mb_inds])
            if args.target_kl is not None and stats[4] > args.target_kl:  # host sync, once per epoch
                break

        sps = (global_step - measure_step) / (time.time() - measure_start) if measure_start else 0.0
        return_mean = np.mean(episode_returns) if episode_returns else float("nan")
        pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
        if args.track:
            y_pred, y_true = b["values"], b["returns"]
            explained_var = 1 - (y_true - y_pred).var() / y_true.var()
            logs = torch.cat([stats, explained_var.reshape(1)]).tolist()  # host sync, once per iteration
            names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "explained_variance")
            lr = float(optimizer.param_groups[0]["lr"])
            wandb.log({f"losses/{k}": v for k, v in zip(names, logs)} | {"charts/learning_rate": lr, "charts/SPS": sps}, step=global_step)

        if stop.is_set():  # Ctrl-C: stop after this iteration
            break

    end_time = time.time()
    model_file = os.path.join(run_dir, "ppo_atari_envpool_torchcompile.pt")
    if args.save_model:
        save_model(model_file, "ppo_atari_envpool_torchcompile", args, agent.state_dict())
    eval_returns = []
    if args.eval_episodes:  # actions sampled from the policy, as CleanRL evaluates: a greedy agent can stall a game
        eval_envs = make_envs(args.env_id, 1, args.seed)
        eval_returns = evaluate(lambda obs: agent.get_action_and_value(obs)[0], eval_envs, args.eval_episodes, device)
        eval_envs.close()
    steps = global_step
    summary = {
        "script": "ppo_atari_envpool_torchcompile",
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
