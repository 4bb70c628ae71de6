"""Recurrent PPO with a minGRU policy for discrete actions, optimized: the twin of ppo_mingru.py.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Papers: https://arxiv.org/abs/1707.06347 (PPO), https://arxiv.org/abs/2410.01201 (minGRU).
Same algorithm, defaults and loop as ppo_mingru.py; what changes is the data flow.

    python leanrl/ppo_mingru_torchcompile.py --compile  # on a CPU
    python leanrl/ppo_mingru_torchcompile.py --compile --cudagraphs  # on a CUDA GPU
    # POPGym's recall task
    python leanrl/ppo_mingru_torchcompile.py --compile --env-id popgym:popgym-RepeatFirstEasy-v0

- The recurrence is a chunked associative scan: about 2 sqrt(T) steps, not T.
- The rollout is one TensorDict on the device; a minibatch is one index.
- Acting uses a copy of the agent sharing its weights, without autograd.
- The categorical is written out, and GAE is solved by doubling.
- Adam is fused, capturable under `--cudagraphs`, its learning rate a tensor.
- `--compile` compiles acting, GAE and the sequence loss; `--cudagraphs`
  records acting and the update as CUDA graphs.
"""

from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from flags import CudaFlags, TensorEnvFlags, fail
from runs import Run
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from vector_envs import (
    episode_starts,
    evaluate_recurrent,
    finished_episodes,
    make_envs,
    obs_rms_of,
    observation_wrap,
    true_next_obs,
)


@dataclass
class Args(TensorEnvFlags, CudaFlags):
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    obs_indices: tuple[int, ...] | None = None
    """the observation entries the agent sees; by default (0 2) on CartPole-v1, all
    elsewhere; `--obs-indices` with no value keeps them all"""
    memory: bool = True
    """carry the state from step to step; `--no-memory` resets it at every step"""
    total_timesteps: int = 200_000
    """total environment steps of the experiment"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel environments"""
    num_steps: int = 32
    """the number of vector steps of each rollout"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of the general advantage estimation"""
    num_minibatches: int = 2
    """the number of minibatches of each epoch, split by env (whole sequences)"""
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
    """stop an update's epochs once the approximate KL exceeds this"""

    compile: bool = False
    """compile acting, GAE and the sequence loss with `torch.compile`"""
    cudagraphs: bool = False
    """record acting and the update as CUDA graphs (needs a CUDA device)"""


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """A tanh torso, `num_layers` minGRU layers, each followed by a tanh layer that reads
    the layer's input beside its state, and policy and value heads. Time-major:
    observations [T, B, n_obs], done flags [T, B], the state [num_layers, B, hidden_size].

    minGRU's gate z_t and candidate h~_t read the input alone, never h_{t-1}, so
    h_t = (1 - z_t) * h_{t-1} + z_t * h~_t is a diagonal linear recurrence."""

    def __init__(
        self, n_obs, n_act, hidden_size=128, num_layers=2, width=128, horizon=64, device=None
    ):
        super().__init__()
        self.hidden_size, self.num_layers, self.width = hidden_size, num_layers, width
        self.state_size = hidden_size
        self.network = nn.Sequential(layer_init(nn.Linear(n_obs, width, device=device)), nn.Tanh())
        # each layer's W_z and W_h, stacked in one matmul over the layer's input u_t
        self.mingru = nn.ModuleList(
            layer_init(nn.Linear(width, 2 * hidden_size, device=device), std=1.0)
            for _ in range(num_layers)
        )
        # the chrono initialization (Tallec and Ollivier 2018): W_z's bias is -log(u), u
        # spread over [1, horizon - 1], so the units remember over 2 to `horizon` steps
        timescales = torch.linspace(1, horizon - 1, hidden_size, device=device)
        for mingru in self.mingru:
            with torch.no_grad():
                mingru.bias[:hidden_size] = -timescales.log()
        self.post = nn.ModuleList(
            nn.Sequential(
                layer_init(nn.Linear(width + hidden_size, width, device=device)), nn.Tanh()
            )
            for _ in range(num_layers)
        )
        self.actor = layer_init(nn.Linear(width, n_act, device=device), std=0.01)
        self.critic = layer_init(nn.Linear(width, 1, device=device), std=1)

    def zero_state(self, batch, device=None):
        """The state of `batch` envs at their first step."""
        return torch.zeros(self.num_layers, batch, self.state_size, device=device)

    def get_states(self, x, rnn_state, done):
        """The features [T, B, width] the heads read over `x`, and the last state."""
        features, last_states = self.network(x), []
        carry = (1 - done).unsqueeze(-1)  # 0 where step t starts an episode
        for mingru, post, h0 in zip(self.mingru, self.post, rnn_state):
            gate, candidate = mingru(features).chunk(2, -1)
            z = gate.sigmoid()
            # a_t = 0 where an episode starts: h_t = b_t, and no episode leaks into the next
            h = linear_recurrence((1 - z) * carry, z * candidate, h0)
            last_states.append(h[-1])
            features = post(torch.cat([features, h], -1))
        return features, torch.stack(last_states)

    def get_value(self, x, rnn_state, done):
        hidden, _ = self.get_states(x, rnn_state, done)
        return self.critic(hidden)

    def get_action_and_value(self, x, rnn_state, done, action=None):
        hidden, rnn_state = self.get_states(x, rnn_state, done)
        logits = self.actor(hidden)
        # Gumbel-max: argmax(logits + Gumbel noise) ~ softmax(logits)
        log_probs = logits.log_softmax(-1)
        if action is None:
            gumbel = -torch.log(-torch.log(torch.rand_like(logits)))
            action = (log_probs + gumbel).argmax(-1)
        log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return action, log_prob, entropy, self.critic(hidden), rnn_state


def linear_recurrence(a, b, h0):
    """h_t = a_t * h_{t-1} + b_t for t = 1..T from h0 [B, H]; `a`, `b` and the
    states returned are [T, B, H]. A chunked associative scan: (a1, b1) then (a2, b2)
    compose into (a1 * a2, a2 * b1 + b2), and an episode start (a_t = 0) drops all
    before it. docs/memory.md says why this scan."""
    steps = a.shape[0]
    # chunks of c steps take c + ceil(T / c) sequential steps, the fewest at
    # c = ceil(sqrt(T)); a divisor of T as good needs no padding, else identity
    # steps (a = 1, b = 0) pad T to whole chunks
    root = min(c for c in range(1, steps + 1) if c * c >= steps)
    fewest = root + -(-steps // root)
    chunk = next(
        (c for c in range(root, fewest) if steps % c == 0 and c + steps // c == fewest), root
    )
    if pad := -steps % chunk:
        a, b = (
            torch.cat([a, a.new_ones(pad, *a.shape[1:])]),
            torch.cat([b, b.new_zeros(pad, *b.shape[1:])]),
        )
    a_chunks, b_chunks = a.unflatten(0, (-1, chunk)), b.unflatten(0, (-1, chunk))
    # (1) all chunks at once, from a zero state: h their states, decay their a's product
    h, decay = torch.zeros_like(b_chunks[:, 0]), torch.ones_like(a_chunks[:, 0])
    chunk_states, decays = [], []
    # unbind: its backward is one stack, an index's would zero-fill a whole copy
    for a_i, b_i in zip(a_chunks.unbind(1), b_chunks.unbind(1)):
        h, decay = a_i * h + b_i, a_i * decay
        chunk_states.append(h)
        decays.append(decay)
    # (2) the state entering each chunk, one step per chunk
    entering, entering_states = h0, []
    for decay_j, h_j in zip(decay.unbind(0), h.unbind(0)):
        entering_states.append(entering)
        entering = decay_j * entering + h_j
    # (3) every h_t at once; no slice without padding: its backward copies the gradient
    states = (
        torch.stack(chunk_states, 1)
        + torch.stack(decays, 1) * torch.stack(entering_states)[:, None]
    )
    return states.flatten(0, 1)[:steps] if pad else states.flatten(0, 1)


def observed_indices(env_id, obs_indices):
    """`obs_indices` if given, else (0 2) on CartPole-v1 and all entries (`()`) elsewhere."""
    if obs_indices is not None:
        return tuple(obs_indices)
    return (0, 2) if env_id == "CartPole-v1" else ()


def gae(rewards, values, next_value, final_values, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation: (advantages, returns), [num_steps, num_envs]
    like the inputs but `next_value` [num_envs]. `final_values[t]`: the value of the
    true final observation of an episode truncated at step t."""
    dones = torch.maximum(terminations, truncations)
    # the value after step t: the next step's, the true final observation's if the
    # episode was cut off there, 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1}, c_t = gamma * lambda * (1 - done_t), by doubling:
    # after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of
    # A_t and coefs[t] is the product of their c's (the loop's sums, in another order)
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat(
            [advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]]
        )
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


def make_learner(args, n_obs, n_act, device):
    """The agent, its optimizer and the steps `main` runs, on `device`."""
    agent = Agent(n_obs, n_act, device=device)
    # a tensor learning rate, annealed in place: a captured graph reads its memory
    lr = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=args.cudagraphs
    )

    def loss_fn(mb, state):
        _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
            mb["obs"], state, mb["dones"], mb["actions"]
        )
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

        # policy loss
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        # value loss
        newvalue = newvalue.squeeze(-1)
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - mb["returns"]) ** 2
            v_clipped = mb["values"] + torch.clamp(
                newvalue - mb["values"], -args.clip_coef, args.clip_coef
            )
            v_loss_clipped = (v_clipped - mb["returns"]) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        else:
            v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
        stats = [pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]
        return loss, torch.stack(stats).detach()

    if args.compile:
        # the loss forward and backward; the clip and the Adam step stay eager
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb, state):
        """One gradient step on the sequences `mb` [num_steps, envs], replayed
        from `state`, the state their rollout started with."""
        optimizer.zero_grad()
        loss, stats = loss_fn(mb, state)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    agent_inference = Agent(n_obs, n_act, device=device)
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
    args.obs_indices = observed_indices(args.env_id, args.obs_indices)
    policy_flags = ("env_id", "obs_indices", "memory")
    run = Run(args, "ppo_mingru_torchcompile", policy_flags=policy_flags)
    # evaluating a saved model records no training episode
    videos = None if args.eval_model else run.videos
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    wrap = observation_wrap(args.obs_indices)
    envs = make_envs(
        args.env_id,
        args.num_envs,
        args.seed,
        videos,
        wrap=wrap,
        tensor=args.tensor_envs,
        device=device,
        compile=args.compile,
    )
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        space = type(envs.single_action_space).__name__
        fail(f"--env-id {args.env_id!r} has a {space} action space; this PPO needs a Discrete one")
    if device.type == "cpu":
        # every op is tiny: a second thread costs more than it saves
        torch.set_num_threads(1)
    n_obs = int(np.prod(envs.single_observation_space.shape))
    learner = make_learner(args, n_obs, int(envs.single_action_space.n), device)
    agent, optimizer = learner.agent, learner.optimizer

    def finish(obs_rms):
        def evaluate_agent(episodes, videos):  # the most likely action
            wrap = observation_wrap(args.obs_indices, obs_rms)
            eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes, wrap)
            zeros = agent.zero_state(1, device)
            return evaluate_recurrent(
                agent, eval_envs, episodes, args.seed, zeros, args.memory, device
            )

        model = {"agent": agent.state_dict(), "obs_rms": obs_rms}
        run.finish(device, model, evaluate_agent, obs_indices=list(args.obs_indices))

    if args.eval_model:
        agent.load_state_dict(run.saved_model["agent"])
        envs.close()
        return finish(run.saved_model["obs_rms"])

    compute_gae = torch.compile(gae, fullgraph=True) if args.compile else gae
    if args.compile:
        learner.policy = torch.compile(learner.policy)
    if args.cudagraphs:
        # warm-up calls (Adam creates its state, compile compiles), one records, the rest replay
        warmup = 3 if args.compile else 2
        learner.policy = CudaGraphModule(learner.policy, warmup=warmup)
        learner.update = CudaGraphModule(learner.update, warmup=warmup)

    def as_tensor(x):
        return torch.as_tensor(x, device=device, dtype=torch.float)

    # the rollout, [num_steps, num_envs, ...]
    shape = (args.num_steps, args.num_envs)
    keys = ("logprobs", "values", "rewards", "dones", "terminations", "truncations", "final_values")
    rollout = {key: torch.zeros(shape, device=device) for key in keys}
    rollout["obs"] = torch.zeros(*shape, n_obs, device=device)
    rollout["actions"] = torch.zeros(shape, dtype=torch.long, device=device)
    rollout = TensorDict(rollout, batch_size=shape, device=device)  # one TensorDict

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = as_tensor(next_obs)
    # dones[t] = 1: obs[t] starts an episode, and the state is zeroed before it
    next_done = torch.full((args.num_envs,), 0.0 if args.memory else 1.0, device=device)
    next_state = agent.zero_state(args.num_envs, device)
    # a true final observation continues its episode: no reset before it
    final_done = torch.full((1, args.num_envs), 0.0 if args.memory else 1.0, device=device)
    envs_per_batch = args.num_envs // args.num_minibatches
    num_iterations = args.total_timesteps // (args.num_envs * args.num_steps)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(agent=learner.agent, optimizer=learner.optimizer)
        return dict(learner=state, envs=(envs, next_obs, next_done, next_state))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    global_step = run.steps  # 0, or where the resumed run stopped
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(global_step)  # compile and warm-up are behind
        # the update replays each env's sequence from this state
        initial_state = next_state.clone()
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)  # no recompile

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs
            rollout["obs"][step] = next_obs
            rollout["dones"][step] = next_done

            # act: a sequence of one step
            with torch.no_grad():
                action, logprob, _, value, next_state = learner.policy(
                    next_obs[None], next_state, next_done[None]
                )
            rollout["values"][step] = value.flatten()
            rollout["actions"][step] = action[0]
            rollout["logprobs"][step] = logprob[0]

            # step the envs
            next_obs, reward, terminations, truncations, infos = envs.step(action[0].cpu().numpy())
            run.log_episodes(global_step, finished_episodes(infos))
            rollout["rewards"][step] = as_tensor(reward)
            rollout["terminations"][step] = as_tensor(terminations)
            rollout["truncations"][step] = as_tensor(truncations)
            if truncations.any():
                # the value where each truncated episode was cut, seen with its memory
                final_obs = as_tensor(true_next_obs(next_obs, infos))
                with torch.no_grad():
                    rollout["final_values"][step] = learner.get_value(
                        final_obs[None], next_state, final_done
                    ).flatten()
            next_obs = as_tensor(next_obs)
            next_done = as_tensor(episode_starts(terminations, truncations, args.memory))

        # advantages
        with torch.no_grad():
            next_value = learner.get_value(next_obs[None], next_state, next_done[None]).flatten()
        ends = (rollout["final_values"], rollout["terminations"], rollout["truncations"])
        advantages, returns = compute_gae(
            rollout["rewards"], rollout["values"], next_value, *ends, args.gamma, args.gae_lambda
        )
        # the batch stays [num_steps, num_envs]: a minibatch is the sequences of some envs
        b = rollout.select("obs", "actions", "logprobs", "values", "dones")
        b["advantages"], b["returns"] = advantages, returns

        # update
        for _ in range(args.update_epochs):
            for mb_envs in torch.randperm(args.num_envs, device=device).split(envs_per_batch):
                mb = b[:, mb_envs]
                mb_state = initial_state[:, mb_envs]
                stats = learner.update(mb, mb_state)
            # host sync, once per epoch
            if args.target_kl is not None and stats[4] > args.target_kl:
                break

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        lr = optimizer.param_groups[0]["lr"]
        metrics = dict(zip(names, stats), explained_variance=explained_var, learning_rate=lr)
        run.log_progress(global_step, metrics)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        if run.stopped:  # a first Ctrl-C or SIGTERM, or divergence
            break

    # the normalization the agent was trained with
    obs_rms = obs_rms_of(envs)
    envs.close()
    finish(obs_rms)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"]
    for name in positive + ["learning_rate", "clip_coef", "max_grad_norm", "target_kl"]:
        value = getattr(args, name)
        if value is not None and value <= 0:  # --target-kl None: off
            fail(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.total_timesteps < args.num_steps * args.num_envs:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one rollout (--num-steps x "
            "--num-envs)"
        )
    if args.num_envs % args.num_minibatches != 0:
        fail(
            f"--num-envs {args.num_envs} is not divisible by --num-minibatches "
            f"{args.num_minibatches}"
        )
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device, and there is none (or --no-cuda was given)")


if __name__ == "__main__":
    main(tyro.cli(Args))
