"""Recurrent PPO with linear recurrent memory (a minGRU policy) for discrete actions, optimized: the twin of
ppo_mingru.py.

Paper: https://arxiv.org/abs/1707.06347 (PPO), https://arxiv.org/abs/2410.01201 (minGRU); the agent and its update
are ppo_lstm.py's with the LSTM replaced by two minGRU layers. Defaults, as ppo_lstm.py's: CartPole-v1 with the two
velocities hidden (`--obs-indices 0 2`), 200k steps, 8 envs, 32 steps per rollout, 2 minibatches of 4 whole env
sequences, 10 epochs, learning rate 1e-3, clip 0.2, no entropy bonus.

    python leanrl/ppo_mingru_torchcompile.py --compile               # on a CPU
    python leanrl/ppo_mingru_torchcompile.py --compile --cudagraphs  # on a CUDA GPU
    python leanrl/ppo_mingru_torchcompile.py --compile --no-memory   # the same network without memory: it plateaus lower

Same algorithm, same defaults and same loop as the eager twin; what changes is the data flow:
- the update runs the recurrence over each sequence as an associative scan, resets folded into its operator
  (`linear_recurrence`): about 2 sqrt(T) vectorized steps instead of the eager twin's T-step Python loop;
- the rollout is one TensorDict preallocated on the device; a minibatch of env sequences is one indexing call;
- acting uses a copy of the agent that shares its weights but carries no autograd state;
- the categorical's sampling (Gumbel-max), log-probability and entropy are written out;
- GAE solves its backward recurrence by doubling: log2(num_steps) vectorized steps instead of a Python loop;
- a fused Adam (capturable under `--cudagraphs`) whose learning rate is a tensor annealed in place; on the CPU,
  one intra-op thread;
- `--compile` compiles acting, GAE and the whole sequence loss, forward and backward, scan included; the clip and
  the fused Adam step stay eager;
- `--cudagraphs` records the acting policy and the update as CUDA graphs (tensordict's `CudaGraphModule`)
  and replays them with one launch each; it needs a CUDA device and exits with status 2 without one.

Why memory: CartPole's observation is the cart's position and velocity and the pole's angle and angular velocity.
With all four a feedforward policy balances the pole. Keeping only the positions (entries 0 and 2) leaves a
policy that sees a snapshot: the direction the pole is falling in is not in it. An agent that remembers the last
few positions can estimate the velocities as differences, so the default run is one where memory is needed;
`--no-memory` gives the same network with its state reset at every step, a feedforward baseline.

The agent: a small MLP torso, two minGRU layers (diagonal linear recurrences h_t = a_t * h_{t-1} + b_t whose a_t
and b_t depend on the input alone; see `Agent`), each reading its input beside the previous step's (a token shift)
and followed by a tanh layer, and policy and value heads; observations are normalized by running statistics (as in
CleanRL's continuous PPO), which are saved with the model. a_t is 0 where an episode starts, and the token shift
reads zeros there, so the state is reset by the recurrence itself, with no padding and no fixed sequence length.
The recurrent state is, per layer, h and the layer's last input. Acting steps the recurrence once per env step; the
update splits the rollout by environment, so each minibatch holds whole sequences, episode starts included, and
replays them from the recurrent state (h and last inputs) the rollout started with. Each iteration collects
`num_steps` vector steps, computes advantages with GAE, then runs `update_epochs` epochs of `num_minibatches`
clipped-surrogate steps; the learning rate falls linearly to 0 over the run.

Truncation: CleanRL treats a time-limit cut like a termination, so the value of the state where the episode was
cut is taken as 0. That state is not terminal, so here a truncated step bootstraps with gamma * V(final obs), the
value of its true final observation seen with the memory of its own episode: the vector env runs in same-step
autoreset mode, which returns the reset observation for acting and the final one in `infos["final_obs"]`. A
terminated step bootstraps with 0. Either way GAE stops at the end of the episode.
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

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule


@dataclass
class Args:
    exp_name: str = "ppo_mingru_torchcompile"
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
    """evaluate this saved .pt file for --eval-episodes episodes instead of training (with the same --obs-indices and --no-memory as its training)"""
    measure_burnin: int = 3
    """iterations (rollout + update) excluded from `sps` (they compile and warm up)"""

    env_id: str = "CartPole-v1"
    """the id of the environment"""
    obs_indices: tuple[int, ...] = (0, 2)
    """the observation entries the agent sees (default: CartPole's cart position and pole angle, both velocities
    hidden); `--obs-indices` with no value keeps them all"""
    memory: bool = True
    """carry the recurrent state from step to step; `--no-memory` resets it at every step (a feedforward baseline)"""
    total_timesteps: int = 200_000
    """total environment steps of the experiment"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel environments"""
    num_steps: int = 32
    """the number of vector steps of each rollout (env steps per iteration: num_steps * num_envs)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of the general advantage estimation"""
    num_minibatches: int = 2
    """the number of minibatches each epoch splits the rollout into, by environment (whole sequences)"""
    update_epochs: int = 10
    """the number of epochs (passes over the rollout) of each update"""
    norm_adv: bool = True
    """normalize the advantages of each minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """use a clipped loss for the value function, as in the paper"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value function loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """stop an update's epochs early once the approximate KL exceeds this (off by default)"""

    compile: bool = False
    """compile acting, GAE and the update's sequence loss with `torch.compile`"""
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
    if args.num_envs % args.num_minibatches != 0:
        fail(f"--num-envs {args.num_envs} is not divisible by --num-minibatches {args.num_minibatches} (minibatches are whole env sequences)")
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


def make_env(env_id, seed, obs_indices, video_dir=None, video_episodes=None):
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
        if not isinstance(env.action_space, gym.spaces.Discrete):
            fail(f"--env-id {env_id!r} has a {type(env.action_space).__name__} action space; this PPO needs a Discrete one")
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        if obs_indices:
            env = hide_observations(env, obs_indices)
        # the hidden task's inputs are small (a pole angle within 0.21 rad): normalized, as in CleanRL's
        # continuous PPO, the policy picks them up; unnormalized, 150k steps learned nothing here
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env.action_space.seed(seed)
        return env

    return thunk


def hide_observations(env, obs_indices):
    """`env` whose observations keep only the entries `obs_indices` (e.g. CartPole's positions, not its velocities)."""
    space = env.observation_space
    if not all(-space.shape[0] <= i < space.shape[0] for i in obs_indices):
        fail(f"--obs-indices {' '.join(map(str, obs_indices))}: the observation has {space.shape[0]} entries")
    keep = list(obs_indices)
    visible = gym.spaces.Box(space.low[keep], space.high[keep], dtype=space.dtype)
    return gym.wrappers.TransformObservation(env, lambda obs: obs[keep], visible)


def make_envs(env_id, num_envs, seed, obs_indices, video_dir=None, video_episodes=None):
    """A vector env in same-step autoreset mode: the step that ends an episode returns the reset obs and puts the
    true final obs in `info["final_obs"]`; with `video_dir`, the first env records videos there (the first
    `video_episodes` episodes if given). A bad id, a non- Discrete action space or an index outside the
    observation exits with status 2."""
    if env_id not in gym.registry:
        fail(f"--env-id {env_id!r} is not a registered gymnasium environment")
    try:
        videos = [video_dir] + [None] * (num_envs - 1)  # the first env alone records
        thunks = [make_env(env_id, seed + i, obs_indices, videos[i], video_episodes) for i in range(num_envs)]
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except gym.error.Error as e:
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    return envs


def obs_normalizations(envs):
    """The NormalizeObservation wrapper of each env of `envs` (each env normalizes with statistics of its own)."""
    wrappers = []
    for env in envs.envs:
        while not isinstance(env, gym.wrappers.NormalizeObservation):
            env = env.env
        wrappers.append(env)
    return wrappers


def obs_rms_of(envs):
    """The first env's observation normalization statistics, as tensors (what a saved model needs to act)."""
    rms = obs_normalizations(envs)[0].obs_rms
    return {"mean": torch.as_tensor(rms.mean), "var": torch.as_tensor(rms.var), "count": torch.tensor(float(rms.count))}


def obs_rms_to(envs, stats, update=True):
    """Every env of `envs` normalizes with the statistics `stats`; `update=False` freezes them there."""
    for wrapper in obs_normalizations(envs):
        wrapper.obs_rms.mean = stats["mean"].numpy().copy()
        wrapper.obs_rms.var = stats["var"].numpy().copy()
        wrapper.obs_rms.count = float(stats["count"])
        wrapper.update_running_mean = update


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


def episode_starts(terminations, truncations, memory):
    """The recurrent state's reset flags for the next observations: 1 where an episode ended, so the next one starts afresh;
    1 everywhere without `memory` (the state is then zeroed at every step: a feedforward policy)."""
    dones = np.logical_or(terminations, truncations)
    return dones if memory else np.ones_like(dones)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def linear_recurrence(a, b, h0):
    """h_t = a_t * h_{t-1} + b_t for t = 1..T from the state h0 [B, H]; `a` and `b` are [T, B, H], the states
    [T, B, H] come back. An associative scan instead of the eager twin's T-step loop.

    A step is the pair (a_t, b_t), the map h -> a_t * h + b_t. Two steps compose into one, (a1, b1) o (a2, b2) =
    (a1 * a2, a2 * b1 + b2), and the composition is associative, so the steps can be grouped in any order. An
    episode start has a_t = 0: the composition through it drops everything before, so resets need nothing more.
    The grouping here is a chunked scan: the sequence is cut into chunks of about sqrt(T) steps; (1) each chunk is
    composed from a zero state, all chunks at once, giving its states from a zero start and the products of its
    a's; (2) the chunks are composed in order, giving the state entering each chunk; (3) h_t = chunk state +
    product of a's * entering state, for all t at once. About 2 sqrt(T) vectorized steps instead of T, and about
    2T work (a log-depth scan does T log T). The choice, measured by `benchmarks/memory.py --candidates` on a CPU
    (the only device measured): the one scan ahead of the loop, eager at batch 8 and compiled at batch 8 and 64,
    where Hillis-Steele, torch's prototype associative_scan and the log-space cumsums all lost."""
    steps = a.shape[0]
    chunk = min(c for c in range(1, steps + 1) if steps % c == 0 and c * c >= steps)  # a divisor: no padding
    a_chunks, b_chunks = a.unflatten(0, (steps // chunk, chunk)), b.unflatten(0, (steps // chunk, chunk))
    # (1) [num_chunks, B, H] at a time: h is each chunk's state from a zero start, decay the product of its a's
    h, decay = torch.zeros_like(b_chunks[:, 0]), torch.ones_like(a_chunks[:, 0])
    chunk_states, decays = [], []
    # unbind, not indexing: its backward is one stack, where each index's backward would zero-fill a whole copy
    for a_i, b_i in zip(a_chunks.unbind(1), b_chunks.unbind(1)):
        h, decay = a_i * h + b_i, a_i * decay
        chunk_states.append(h)
        decays.append(decay)
    # (2) the state entering each chunk: the same recurrence, one step per chunk
    entering, entering_states = h0, []
    for decay_j, h_j in zip(decay.unbind(0), h.unbind(0)):
        entering_states.append(entering)
        entering = decay_j * entering + h_j
    # (3) every state at once
    states = torch.stack(chunk_states, 1) + torch.stack(decays, 1) * torch.stack(entering_states)[:, None]
    return states.flatten(0, 1)


def token_shift(x, last_input, done):
    """The input of the step before each step of `x` [T, B, W]: `last_input` [B, W] before the first step, and zeros
    where `done[t]` is 1 (step t starts an episode), so the shift never reads across a reset."""
    return torch.cat([last_input[None], x[:-1]]) * (1 - done).unsqueeze(-1)


def mingru_coefficients(gates, done):
    """a_t and b_t [T, B, H] of a minGRU layer from its gates' pre-activations [T, B, 2H] (the update gate's, then the
    candidate's). `done[t]` is 1 where step t is the first of an episode: a_t is 0 there, so h_t = b_t and nothing of
    the previous episode leaks into the new one."""
    gate, candidate = gates.chunk(2, -1)
    z = gate.sigmoid()
    return (1 - z) * (1 - done).unsqueeze(-1), z * candidate


class Agent(nn.Module):
    """A `width`-unit torso, `num_layers` minGRU layers of `hidden_size` units, each reading its input beside the
    previous step's (a token shift), each followed by a `width`-unit tanh layer that reads the layer's shifted input
    beside its state (a skip connection), and policy and value heads. Sequences are time-major: observations
    [T, B, n_obs], done flags [T, B], the recurrent state [num_layers, B, hidden_size + width]: each layer's h, then
    its last input (the next step's token shift).

    minGRU (Feng et al. 2024, "Were RNNs All We Needed?", https://arxiv.org/abs/2410.01201): the update gate
    z_t = sigmoid(W_z x_t) and the candidate state h~_t = W_h x_t read the input alone, never h_{t-1}, so the state
    follows the diagonal linear recurrence h_t = (1 - z_t) * h_{t-1} + z_t * h~_t = a_t * h_{t-1} + b_t. Chosen over
    the LRU (Orvieto et al. 2023): its a_t depends on the input, so each step can keep or forget, and it is real,
    where the LRU's fixed complex diagonal would need complex tensors through the scan and its backward. Two layers,
    stacked as in the paper.

    Token shift (RWKV, Peng et al. 2023, https://arxiv.org/abs/2305.13048; Mamba's short causal convolution before
    its recurrence, Gu and Dao 2023, https://arxiv.org/abs/2312.00752): x_t here is [u_t, u_{t-1}], the layer's input
    beside the previous step's, zero before an episode's first step, so W_z and W_h are a width-2 causal convolution
    over time. On velocity-hidden CartPole it hands the gates and the skip connection the difference of consecutive
    positions, the missing velocity, in one step instead of through the recurrence. Measured on that task (61,440
    steps, seeds 1-5, mean return of the episodes that ended in the second half; the LSTM pair: 84.1): 64-unit layers
    without the shift 67.1, with it 81.0; 128-unit layers without it 107.5, with it 134.6: the defaults (231k
    parameters; with the LSTM pair's count, ~100k: 96-unit layers, 64-unit minGRUs, 104.4)."""

    def __init__(self, n_obs, n_act, hidden_size=128, num_layers=2, width=128, device=None):
        super().__init__()
        self.hidden_size, self.num_layers, self.width = hidden_size, num_layers, width
        self.state_size = hidden_size + width
        self.network = nn.Sequential(layer_init(nn.Linear(n_obs, width, device=device)), nn.Tanh())
        # each layer's W_z and W_h, stacked in one matmul, over the shifted input [u_t, u_{t-1}]
        self.mingru = nn.ModuleList(
            layer_init(nn.Linear(2 * width, 2 * hidden_size, device=device), std=1.0) for _ in range(num_layers)
        )
        self.post = nn.ModuleList(
            nn.Sequential(layer_init(nn.Linear(2 * width + hidden_size, width, device=device)), nn.Tanh())
            for _ in range(num_layers)
        )
        self.actor = layer_init(nn.Linear(width, n_act, device=device), std=0.01)
        self.critic = layer_init(nn.Linear(width, 1, device=device), std=1)

    def get_states(self, x, rnn_state, done):
        """The features [T, B, width] the heads read over the sequence `x`, and the recurrent state after its last
        step."""
        features, last_states = self.network(x), []
        for mingru, post, state in zip(self.mingru, self.post, rnn_state):
            h0, last_input = state.split([self.hidden_size, self.width], -1)
            shifted = torch.cat([features, token_shift(features, last_input, done)], -1)
            a, b = mingru_coefficients(mingru(shifted), done)
            h = linear_recurrence(a, b, h0)
            last_states.append(torch.cat([h[-1], features[-1]], -1))
            features = post(torch.cat([shifted, h], -1))
        return features, torch.stack(last_states)

    def get_value(self, x, rnn_state, done):
        hidden, _ = self.get_states(x, rnn_state, done)
        return self.critic(hidden)

    def get_action_and_value(self, x, rnn_state, done, action=None):
        hidden, rnn_state = self.get_states(x, rnn_state, done)
        logits = self.actor(hidden)
        # Categorical(logits=logits).sample(), .log_prob(action) and .entropy(), written out; sampling by the
        # Gumbel-max trick: the argmax of logits plus Gumbel noise is distributed as softmax(logits)
        log_probs = logits.log_softmax(-1)
        if action is None:
            gumbel = -torch.log(-torch.log(torch.rand_like(logits)))
            action = (log_probs + gumbel).argmax(-1)
        log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return action, log_prob, entropy, self.critic(hidden), rnn_state


def gae(rewards, values, next_value, final_values, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation; returns (advantages, returns), both [num_steps, num_envs].

    Every input is [num_steps, num_envs] but `next_value` [num_envs], the value of the observation after the
    last step. `terminations[t]` / `truncations[t]` (0 or 1) say the episode ended at step t by reaching a
    terminal state / by being cut off; `final_values[t]` is the value of the true final observation of a
    truncated episode (read only where `truncations[t]` is 1 and `terminations[t]` is 0)."""
    dones = torch.maximum(terminations, truncations)
    # the value of the state after step t: the next step's value inside an episode; at an episode's end, the
    # value of its true final observation if it was cut off and 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1} with c_t = gamma * lambda * (1 - done_t), stopped at the end of an episode.
    # Solved by doubling: after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of A_t and
    # coefs[t] is the product of their c's, so ceil(log2(num_steps)) rounds of a few vectorized ops replace the
    # num_steps-long loop. The same sums, added in another order.
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat([advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]])
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


def make_update(agent, optimizer, args, compile_loss=False):
    """One clipped-surrogate gradient step on a minibatch of whole sequences (a TensorDict [num_steps, envs])
    replayed from the recurrent state `rnn_state` the rollout started with; returns its statistics.
    `compile_loss`: compile the forward and backward of the sequence loss; the clip and the Adam step stay eager."""

    def loss_fn(mb, rnn_state):
        _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(mb["obs"], rnn_state, mb["dones"], mb["actions"])
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
        newvalue = newvalue.squeeze(-1)
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

    def update(mb, rnn_state):
        optimizer.zero_grad()
        loss, stats = loss_fn(mb, rnn_state)
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


def make_learner(args, n_obs, n_act, device):
    """PPO's agent, optimizer and step functions on `device`, as `main` runs them (tests build them here too).
    Returns the agent, the optimizer and the functions (policy, get_value, update)."""
    agent = Agent(n_obs, n_act, device=device)
    # the learning rate is a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, **adam_options(args.cudagraphs))
    update = make_update(agent, optimizer, args, compile_loss=args.compile)
    # acting reads the agent's weights through a copy that shares their memory but has no autograd state
    agent_inference = Agent(n_obs, n_act, device=device)
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


def evaluate(agent, envs, episodes, seed, memory, device):
    """The returns of `episodes` episodes played on `envs` (one env) by `agent`'s most likely action, its recurrent state
    carried from step to step and zeroed when an episode starts (at every step without `memory`), in order."""
    obs, _ = envs.reset(seed=seed)
    rnn_state = torch.zeros(agent.num_layers, 1, agent.state_size, device=device)
    done = torch.full((1, 1), 0.0 if memory else 1.0, device=device)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            hidden, rnn_state = agent.get_states(torch.as_tensor(obs, device=device, dtype=torch.float)[None], rnn_state, done)
            actions = agent.actor(hidden[0]).argmax(-1)
        obs, _, terminations, truncations, infos = envs.step(actions.cpu().numpy())
        done = torch.as_tensor(episode_starts(terminations, truncations, memory), device=device, dtype=torch.float)[None]
        returns += finished_episodes(infos)
    return returns[:episodes]


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


def load_model(path, script, args):
    """The `model` that `script` saved at `path`; a missing file, another script's file, or one trained on another
    env, with other `--obs-indices` or with(out) `--no-memory` exits with status 2 naming the flag to add."""
    if not os.path.isfile(path):
        fail(f"--eval-model {path}: no such file")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        fail(f"--eval-model {path} is not a saved model ({type(e).__name__})")
    saved_by = saved.get("script") if isinstance(saved, dict) else None
    if saved_by != script:
        fail(f"--eval-model {path} was saved by {saved_by}, not by {script}")
    trained = saved["args"]
    if trained["env_id"] != args.env_id:
        fail(f"--eval-model {path} was trained on {trained['env_id']}: add --env-id {trained['env_id']}")
    if tuple(trained["obs_indices"]) != tuple(args.obs_indices):
        indices = " ".join(map(str, trained["obs_indices"]))
        fail(f"--eval-model {path} was trained on observation entries ({indices or 'all'}): add --obs-indices {indices}".rstrip())
    if trained["memory"] != args.memory:
        fail(f"--eval-model {path} was trained {'with' if trained['memory'] else 'without'} memory: "
             f"{'drop' if trained['memory'] else 'add'} --no-memory")
    return saved["model"]


def main(args):
    check_args(args)
    saved_model = load_model(args.eval_model, "ppo_mingru_torchcompile", args) if args.eval_model else None
    envs_per_batch = args.num_envs // args.num_minibatches
    num_iterations = 0 if args.eval_model else args.total_timesteps // (args.num_envs * args.num_steps)
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join("runs", run_name)  # summary.json, the model and the videos go here
    stop = stop_on_ctrl_c()
    os.makedirs(run_dir, exist_ok=True)
    videos = os.path.join(run_dir, "videos") if args.capture_video else None
    if args.capture_video:
        check_rendering(args.env_id)
    envs = make_envs(args.env_id, args.num_envs, args.seed, args.obs_indices, None if args.eval_model else videos)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=run_name, save_code=True)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if device.type == "cpu":
        # every op here is tiny (8-env acting, 2-env sequences in the update): waking a second thread costs more
        # than it saves, and on a shared CPU an oversubscribed thread pool can stall a step for milliseconds
        torch.set_num_threads(1)

    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(envs.single_action_space.n)
    agent, optimizer, (policy, get_value, update) = make_learner(args, n_obs, n_act, device)
    if saved_model is not None:
        agent.load_state_dict(saved_model["agent"])
        obs_rms_to(envs, saved_model["obs_rms"], update=False)  # the normalization it was trained with
    compute_gae = gae
    if args.compile:
        # GAE is one small graph per rollout; `make_update` compiles the sequence loss (the Adam step stays eager)
        compute_gae = torch.compile(gae, fullgraph=True)
        policy = torch.compile(policy)
    if args.cudagraphs:
        policy = cuda_graph(policy, args.compile)
        update = cuda_graph(update, args.compile)

    # ALGO Logic: Storage setup, [num_steps, num_envs, ...], one TensorDict
    rollout = TensorDict(
        obs=torch.zeros(args.num_steps, args.num_envs, n_obs, device=device),
        actions=torch.zeros(args.num_steps, args.num_envs, dtype=torch.long, device=device),
        logprobs=torch.zeros(args.num_steps, args.num_envs, device=device),
        values=torch.zeros(args.num_steps, args.num_envs, device=device),
        rewards=torch.zeros(args.num_steps, args.num_envs, device=device),
        dones=torch.zeros(args.num_steps, args.num_envs, device=device),
        terminations=torch.zeros(args.num_steps, args.num_envs, device=device),
        truncations=torch.zeros(args.num_steps, args.num_envs, device=device),
        final_values=torch.zeros(args.num_steps, args.num_envs, device=device),
        batch_size=[args.num_steps, args.num_envs],
        device=device,
    )

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, device=device, dtype=torch.float)
    # dones[t] = 1: obs[t] starts an episode, the recurrent state is zeroed before it (always, under --no-memory)
    next_done = torch.full((args.num_envs,), 0.0 if args.memory else 1.0, device=device)
    next_rnn_state = torch.zeros(agent.num_layers, args.num_envs, agent.state_size, device=device)
    # a true final observation continues its episode: no reset before it (but always one under --no-memory)
    final_done = torch.full((1, args.num_envs), 0.0 if args.memory else 1.0, device=device)
    episode_returns = deque(maxlen=20)
    curve = []  # [global_step, seconds since start, return] of every finished episode
    global_step = 0
    start_time = time.time()
    measure_start, measure_step = None, 0
    pbar = tqdm.tqdm(range(1, num_iterations + 1))
    for iteration in pbar:
        if iteration == args.measure_burnin + 1:
            measure_start, measure_step = time.time(), global_step
        # the update replays each env's sequence from the recurrent state this rollout starts with
        initial_rnn_state = next_rnn_state.clone()
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # in place: no recompile

        for step in range(args.num_steps):
            global_step += args.num_envs
            rollout["obs"][step] = next_obs
            rollout["dones"][step] = next_done

            # ALGO LOGIC: action logic, a sequence of one step
            with torch.no_grad():
                action, logprob, _, value, next_rnn_state = policy(next_obs[None], next_rnn_state, next_done[None])
            rollout["values"][step] = value.flatten()
            rollout["actions"][step] = action[0]
            rollout["logprobs"][step] = logprob[0]

            next_obs, reward, terminations, truncations, infos = envs.step(action[0].cpu().numpy())
            rollout["rewards"][step] = torch.as_tensor(reward, device=device, dtype=torch.float)
            rollout["terminations"][step] = torch.as_tensor(terminations, device=device, dtype=torch.float)
            rollout["truncations"][step] = torch.as_tensor(truncations, device=device, dtype=torch.float)
            if truncations.any():
                # the value of the state each truncated episode was cut at, seen with that episode's memory
                final_obs = torch.as_tensor(true_next_obs(next_obs, infos), device=device, dtype=torch.float)
                with torch.no_grad():
                    rollout["final_values"][step] = get_value(final_obs[None], next_rnn_state, final_done).flatten()
            next_obs = torch.as_tensor(next_obs, device=device, dtype=torch.float)
            next_done = torch.as_tensor(episode_starts(terminations, truncations, args.memory), device=device, dtype=torch.float)

            for episodic_return in finished_episodes(infos):
                episode_returns.append(episodic_return)
                curve.append([global_step, time.time() - start_time, episodic_return])
                if args.track:
                    wandb.log({"charts/episodic_return": episodic_return}, step=global_step)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = get_value(next_obs[None], next_rnn_state, next_done[None]).flatten()
        advantages, returns = compute_gae(
            rollout["rewards"], rollout["values"], next_value, rollout["final_values"],
            rollout["terminations"], rollout["truncations"], args.gamma, args.gae_lambda,
        )

        # the batch stays [num_steps, num_envs]: a minibatch is the whole sequences of some envs
        b = rollout.select("obs", "actions", "logprobs", "values", "dones")
        b["advantages"], b["returns"] = advantages, returns

        # Optimizing the policy and value network
        for epoch in range(args.update_epochs):
            b_envs = torch.randperm(args.num_envs, device=device).split(envs_per_batch)
            for mb_envs in b_envs:
                mb_rnn_state = initial_rnn_state[:, mb_envs]
                stats = update(b[:, mb_envs], mb_rnn_state)
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
    model_file = os.path.join(run_dir, "ppo_mingru_torchcompile.pt")
    if args.save_model:
        save_model(model_file, "ppo_mingru_torchcompile", args, {"agent": agent.state_dict(), "obs_rms": obs_rms_of(envs)})
    eval_returns = []
    if args.eval_episodes:  # the most likely action, with memory
        eval_envs = make_envs(args.env_id, 1, args.seed, args.obs_indices, videos, args.eval_episodes)
        obs_rms_to(eval_envs, obs_rms_of(envs), update=False)  # frozen: evaluation must not move it
        eval_returns = evaluate(agent, eval_envs, args.eval_episodes, args.seed, args.memory, device)
        eval_envs.close()
    steps = global_step
    summary = {
        "script": "ppo_mingru_torchcompile",
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
