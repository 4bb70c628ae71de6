"""PPO for continuous actions, data-parallel over N processes with torch.distributed: grown from
the optimized twin ppo_continuous_action_torchcompile.py, so `diff` against it shows the scaling.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps).

    torchrun --standalone --nproc_per_node 2 leanrl/ppo_continuous_action_distributed.py --compile

Each rank is the twin seeded `seed + RANK * num_envs`. The ranks start from rank 0's weights and
average each minibatch's gradients, so N ranks train as one process with N x num_envs envs. Rank 0
alone keeps the run folder, wandb and the SUMMARY; its checkpoint holds every rank's generators and
envs, and a run resumed with as many ranks goes on exactly. A collective waits at most
`--dist-timeout` seconds (docs/scaling-torchrun.md: more machines).
"""

import functools
import math
import os
import sys
from dataclasses import dataclass, replace
from datetime import timedelta
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from flags import CudaFlags, fail
from ranks import RankRun, collective
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from vector_envs import evaluate, finished_episodes, make_envs, true_next_obs


@dataclass
class Args(CudaFlags):
    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total environment steps of the experiment, all ranks together"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments of each rank"""
    num_steps: int = 2048
    """the number of vector steps of each rollout (of each rank)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of the general advantage estimation"""
    num_minibatches: int = 32
    """the number of minibatches each epoch splits the rollout into"""
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
    """stop an update's epochs once the approximate KL exceeds this (off by default)"""

    compile: bool = False
    """compile GAE, acting and the update's loss"""
    cudagraphs: bool = False
    """record acting and the update as CUDA graphs (needs a CUDA device; one process)"""
    dist_backend: str | None = None
    """the torch.distributed backend, nccl or gloo (default: nccl on CUDA, else gloo)"""
    dist_timeout: float = 120.0
    """seconds a collective may wait for the other ranks"""


def wrap(env, gamma, obs_rms=None):
    """CleanRL's wrappers of one env, after its episode statistics (raw returns): flattened
    observations, clipped actions, observations and rewards normalized and clipped; `obs_rms`, a
    trained policy's statistics, frozen. Partials, not lambdas: checkpoints pickle the wrappers."""
    if not isinstance(env.action_space, gym.spaces.Box):
        return env  # refused in main
    space = env.observation_space
    flatten = functools.partial(gym.spaces.flatten, space)
    env = gym.wrappers.TransformObservation(env, flatten, gym.spaces.flatten_space(space))
    space = env.action_space
    clip_action = functools.partial(np.clip, a_min=space.low, a_max=space.high)
    unbounded = gym.spaces.Box(-np.inf, np.inf, space.shape, space.dtype)
    env = gym.wrappers.TransformAction(env, clip_action, unbounded)
    env = gym.wrappers.NormalizeObservation(env)
    if obs_rms is not None:
        env.obs_rms.mean, env.obs_rms.var = obs_rms["mean"].numpy(), obs_rms["var"].numpy()
        env.obs_rms.count, env.update_running_mean = float(obs_rms["count"]), False
    clip = functools.partial(np.clip, a_min=-10, a_max=10)
    env = gym.wrappers.TransformObservation(env, clip, env.observation_space)
    env = gym.wrappers.NormalizeReward(env, gamma=gamma)
    return gym.wrappers.TransformReward(env, clip)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, n_obs, n_act, device=None):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64, device=device)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64, device=device)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1, device=device), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64, device=device)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64, device=device)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_act, device=device), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, n_act, device=device))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        if action is None:
            action = action_mean + action_std * torch.randn_like(action_mean)
        # Normal(action_mean, action_std).log_prob(action) and .entropy(), written out
        log_prob = (
            -((action - action_mean) ** 2) / (2 * action_std**2)
            - action_logstd
            - 0.5 * math.log(2 * math.pi)
        )
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + action_logstd
        return action, log_prob.sum(1), entropy.sum(1), self.critic(x)


def gae(rewards, values, next_value, final_values, terminations, truncations, gamma, gae_lambda):
    """Generalized advantage estimation: (advantages, returns), shaped [num_steps, num_envs].

    `next_value` [num_envs] is the value of the obs after the last step. `final_values[t]` is the
    value of the true final obs of an episode truncated at step t (read only there).
    """
    dones = torch.maximum(terminations, truncations)
    # after an episode's last step: its final obs' value if it was cut off, 0 if it terminated
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values) * (1 - terminations)
    deltas = rewards + gamma * next_values - values
    # A_t = delta_t + c_t * A_{t+1} with c_t = gamma * lambda * (1 - done_t), solved by doubling:
    # after the round with shift s, advantages[t] sums the terms t .. t + 2s - 1 of A_t and
    # coefs[t] is the product of their c's. A loop, unrolled, would take minutes to compile.
    advantages, coefs = deltas, gamma * gae_lambda * (1 - dones)
    shift = 1
    while shift < len(values):
        advantages = torch.cat(
            [advantages[:-shift] + coefs[:-shift] * advantages[shift:], advantages[-shift:]]
        )
        coefs = torch.cat([coefs[:-shift] * coefs[shift:], coefs[-shift:]])
        shift *= 2
    return advantages, advantages + values


# What scaling out adds: where a rank runs, and collectives that give up after a timeout


def process_layout(environ):
    """(rank, local_rank, world_size) from torchrun's variables; (0, 0, 1) without torchrun."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    if not any(name in environ for name in names):
        return 0, 0, 1
    try:
        rank, local_rank, world_size = (int(environ[name]) for name in names)
    except (KeyError, ValueError):
        values = [environ.get(name) for name in names]
        fail(f"RANK, LOCAL_RANK and WORLD_SIZE must all be integers (got {values}): use torchrun")
    if not (0 <= rank < world_size and 0 <= local_rank <= rank):
        fail(f"RANK {rank}, LOCAL_RANK {local_rank} and WORLD_SIZE {world_size} do not fit")
    return rank, local_rank, world_size


def rank_device(cuda, local_rank):
    """The GPU of this machine's rank `local_rank` if `cuda` and there is one, else the CPU."""
    if not (cuda and torch.cuda.is_available()):
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        gpus = torch.cuda.device_count()
        fail(
            f"LOCAL_RANK {local_rank} has no GPU: this machine has {gpus} (lower --nproc_per_node)"
        )
    # nccl's own work (barriers, its streams) goes to this rank's GPU, not GPU 0
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def dist_backend(args, device):
    """--dist-backend, or the device's default: nccl on CUDA, gloo on the CPU."""
    backend = args.dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend not in ("nccl", "gloo") or not dist.is_backend_available(backend):
        fail(f"--dist-backend {backend!r} is not available here (nccl needs CUDA, gloo does not)")
    if backend == "nccl" and device.type != "cuda":
        fail(f"--dist-backend nccl needs a CUDA device and this rank runs on {device} (use gloo)")
    return backend


def start_process_group(backend, timeout):
    """Join the other ranks. `timeout` seconds bounds a gloo collective, and how long NCCL's
    watchdog lets an nccl one wait before it aborts the process."""
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    except dist.DistError as e:
        cause = str(e).strip().splitlines()[0]
        sys.exit(f"error: the ranks did not meet within {timeout} s ({cause})")


def all_reduce_gradients(grads, world_size):
    """Average the tensors `grads` over the ranks, in place, with one all-reduce of one flat
    buffer. Not DistributedDataParallel: it syncs only what runs through forward(), which PPO's
    loss does not call, and these small networks leave it nothing to overlap."""
    flat = torch.cat([grad.flatten() for grad in grads])
    collective(dist.all_reduce, flat)  # the sum over the ranks
    flat /= world_size
    for grad, averaged in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(averaged.view_as(grad))


def mean_over_ranks(values, world_size):
    """The mean of the tensor `values` over the ranks, the same on every rank."""
    if world_size == 1:
        return values
    total = values.clone()
    collective(dist.all_reduce, total)
    return total / world_size


def max_over_ranks(value, world_size, device):
    """The largest of the ranks' ints `value`, on every rank."""
    if world_size == 1:
        return value
    values = torch.tensor(value, device=device)
    collective(dist.all_reduce, values, op=dist.ReduceOp.MAX)
    return int(values)  # host sync, once per iteration


def parameter_spread(module, world_size):
    """The largest difference between two ranks' values of a parameter of `module`: 0.0 while
    the ranks stay in lockstep, as they must."""
    if world_size == 1:
        return 0.0
    flat = torch.cat([parameter.detach().flatten() for parameter in module.parameters()])
    highest, lowest = flat.clone(), flat.clone()
    collective(dist.all_reduce, highest, op=dist.ReduceOp.MAX)
    collective(dist.all_reduce, lowest, op=dist.ReduceOp.MIN)
    return float((highest - lowest).max())


def make_learner(args, n_obs, n_act, device, world_size=1):
    """PPO's agent, optimizer and steps on `device`. With `world_size` > 1, in a process group
    started before, every rank starts from rank 0's weights and the update averages the gradients
    over the ranks."""
    agent = Agent(n_obs, n_act, device=device)
    if world_size > 1:
        for parameter in agent.parameters():
            collective(dist.broadcast, parameter.data, src=0)
    # a tensor annealed in place: a captured graph reads its memory, and nothing recompiles
    lr = torch.tensor(args.learning_rate, device=device)
    # fused: one kernel for all parameters; capturable: the Adam a CUDA graph can record
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, fused=True, capturable=args.cudagraphs
    )

    def loss_fn(mb):
        """The clipped-surrogate loss of a minibatch, and its statistics."""
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

        # policy loss
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        # value loss
        newvalue = newvalue.view(-1)
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

    if args.compile:  # the forward and backward; the averaging, clip and Adam step stay eager
        loss_fn = torch.compile(loss_fn, fullgraph=True)

    def update(mb):
        """One gradient step on a minibatch (a TensorDict); returns its statistics."""
        optimizer.zero_grad()
        loss, stats = loss_fn(mb)
        loss.backward()
        if world_size > 1:
            all_reduce_gradients([p.grad for p in agent.parameters()], world_size)
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        return stats

    # acting reads the weights through a copy that shares their memory, with no autograd state
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
    rank, local_rank, world_size = process_layout(os.environ)
    check_args(args, world_size)
    device = rank_device(args.cuda, local_rank)
    backend = dist_backend(args, device)
    # each rank is the twin with its own seeds: global envs seed + rank * num_envs, ...
    args = replace(args, seed=args.seed + rank * args.num_envs)
    # ranks.py: folder, seeds, signals, ...; rank 0 keeps the folder, wandb and the messages
    free_flags = ("dist_backend", "dist_timeout")
    run = RankRun(args, "ppo_continuous_action_distributed", rank, world_size, free_flags)
    videos = None if args.eval_model else run.videos
    wrappers = functools.partial(wrap, gamma=args.gamma)
    envs = make_envs(args.env_id, args.num_envs, args.seed, videos, wrap=wrappers)
    space = envs.single_action_space
    if not isinstance(space, gym.spaces.Box):
        fail(f"--env-id {args.env_id!r} has a {space} action space; PPO needs a Box")
    # every input is checked: from here on, each rank waits for the others at most --dist-timeout
    if world_size > 1:
        start_process_group(backend, args.dist_timeout)
        seeds = f"{args.seed}..{args.seed + args.num_envs - 1}"
        where = f"(local rank {local_rank}, pid {os.getpid()}) on {device} with {backend}"
        print(f"rank {rank} of {world_size} {where}: envs seeded {seeds}", file=sys.stderr)
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(space.shape))
    learner = make_learner(args, n_obs, n_act, device, world_size)
    agent, optimizer = learner.agent, learner.optimizer

    def evaluate_agent(episodes, videos):  # the Gaussian's mean; `obs_rms` is bound below
        eval_wrappers = functools.partial(wrap, gamma=args.gamma, obs_rms=obs_rms)
        eval_envs = make_envs(args.env_id, 1, args.seed, videos, episodes, eval_wrappers)
        return evaluate(agent.actor_mean, eval_envs, episodes, args.seed, device)

    if args.eval_model:
        agent.load_state_dict(run.saved_model["agent"])
        obs_rms = run.saved_model["obs_rms"]
        envs.close()
        return run.finish(
            device, run.saved_model, evaluate_agent, world_size=1, parameter_spread=0.0
        )

    policy, get_value, update = learner.policy, learner.get_value, learner.update
    compute_gae = gae
    if args.compile:
        # GAE is one small graph; make_learner compiled the loss
        compute_gae = torch.compile(gae, fullgraph=True)
        policy = torch.compile(policy)
    if args.cudagraphs:
        # the first `warmup - 1` calls run as they are (Adam makes its state, compile compiles once
        # more), the next records a CUDA graph, later calls replay it
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    def to_tensor(x):  # the envs' numpy arrays, as float32 on the device
        return torch.as_tensor(x, device=device, dtype=torch.float)

    # the rollout, [num_steps, num_envs, ...], one TensorDict
    scalars = ("logprobs", "values", "rewards", "terminations", "truncations", "final_values")
    rollout = {key: torch.zeros(args.num_steps, args.num_envs, device=device) for key in scalars}
    rollout["obs"] = torch.zeros(args.num_steps, args.num_envs, n_obs, device=device)
    rollout["actions"] = torch.zeros(args.num_steps, args.num_envs, n_act, device=device)
    rollout = TensorDict(rollout, batch_size=[args.num_steps, args.num_envs], device=device)

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = to_tensor(next_obs)
    # one rank's rollout; all ranks together step world_size times more
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // (batch_size * world_size)

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        state = dict(agent=learner.agent, optimizer=learner.optimizer)
        return dict(learner=state, envs=(envs, next_obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    global_step = run.steps  # 0 unless resumed
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            # in place: no recompile
            optimizer.param_groups[0]["lr"].copy_(frac * args.learning_rate)

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs * world_size
            rollout["obs"][step] = next_obs
            with torch.no_grad():
                action, logprob, _, value = policy(next_obs)
            rollout["values"][step] = value.flatten()
            rollout["actions"][step] = action
            rollout["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            run.log_episodes(global_step, finished_episodes(infos))
            rollout["rewards"][step] = to_tensor(reward)
            rollout["terminations"][step] = to_tensor(terminations)
            rollout["truncations"][step] = to_tensor(truncations)
            if truncations.any():
                # the value where each truncated episode was cut (gae reads it only there)
                final_obs = to_tensor(true_next_obs(next_obs, infos))
                with torch.no_grad():
                    rollout["final_values"][step] = get_value(final_obs).flatten()
            next_obs = to_tensor(next_obs)

        # advantages
        with torch.no_grad():
            next_value = get_value(next_obs).flatten()
        keys = ("rewards", "values", "final_values", "terminations", "truncations")
        advantages, returns = compute_gae(
            **{key: rollout[key] for key in keys},
            next_value=next_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
        )

        # update
        b = rollout.select("obs", "actions", "logprobs", "values").flatten(0, 1)
        b["advantages"], b["returns"] = advantages.flatten(), returns.flatten()
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device).split(minibatch_size)
            for mb_inds in b_inds:
                stats = update(b[mb_inds])
            # so that every rank takes the same early-stop decision
            stats = mean_over_ranks(stats, world_size)
            # host sync, once per epoch
            if args.target_kl is not None and stats[4] > args.target_kl:
                break

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var() / b["returns"].var()
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        metrics = dict(zip(names, stats), explained_variance=explained_var)
        metrics["learning_rate"] = optimizer.param_groups[0]["lr"]
        run.log_progress(global_step, metrics)
        # torchrun forwards a Ctrl-C or SIGTERM to every rank, each at its own moment: all stop here
        # (a signal that comes after this all-reduce waits for the next iteration's)
        run.signals.agreed = max_over_ranks(run.signals.received, world_size, device)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        # a divergence is on every rank at once: the losses it checks are all-reduced, the same
        if run.stopped:
            break

    # the first env's observation normalization is part of the policy, saved with it
    rms = envs.envs[0].get_wrapper_attr("obs_rms")
    obs_rms = {key: torch.as_tensor(getattr(rms, key)) for key in ("mean", "var", "count")}
    envs.close()
    spread = parameter_spread(agent, world_size)
    if world_size > 1:
        dist.destroy_process_group()
    if rank > 0:  # rank 0 alone saves, evaluates and reports
        signum = run.signals.stop
        sys.exit(3 if run.logs[0].diverged else 128 + signum if signum else 0)
    model = {"agent": agent.state_dict(), "obs_rms": obs_rms}
    run.finish(device, model, evaluate_agent, world_size=world_size, parameter_spread=spread)


def check_args(args, world_size):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    flags = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    flags += ("learning_rate", "clip_coef", "max_grad_norm", "target_kl", "dist_timeout")
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value <= 0:  # --target-kl None: off
            fail(f"--{flag.replace('_', '-')} must be positive, got {value}")
    batch_size = args.num_steps * args.num_envs
    if args.total_timesteps < batch_size * world_size:
        rollout = f"one rollout of all ranks ({world_size} x --num-steps x --num-envs)"
        fail(f"--total-timesteps {args.total_timesteps} is less than {rollout}")
    if batch_size % args.num_minibatches or batch_size < 2 * args.num_minibatches:
        rollout = f"--num-steps x --num-envs ({batch_size})"
        fail(f"--num-minibatches must split {rollout} into equal parts of 2 or more")
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")
    if world_size > 1 and (args.cudagraphs or args.eval_model):
        fail(f"--cudagraphs and --eval-model run in one process, not in {world_size} ranks")


if __name__ == "__main__":
    main(tyro.cli(Args))
