"""PPO for continuous actions: ppo_continuous_action_cpu.py as `--num-seeds N` runs in one vmapped
program.

It imports the run modules beside it in leanrl/; leanrl/export.py makes a copy that needs none.

Paper: https://arxiv.org/abs/1707.06347. Defaults are CleanRL's (HalfCheetah-v4, 1M steps), per
member.

    python leanrl/ppo_continuous_action_seeds.py  # 8 members (seeds 1..8), compiled
    python leanrl/ppo_continuous_action_seeds.py --env-id InvertedPendulum-v4 \
        --total-timesteps 40960 --num-seeds 3
    python leanrl/ppo_continuous_action_seeds.py --compile --cudagraphs  # on CUDA
    python leanrl/ppo_continuous_action_seeds.py --env-id InvertedPendulum-v4 \
        --total-timesteps 40960 --num-seeds 2 --ent-coef 0 0.01 --clip-coef 0.1 0.2  # a sweep

Member k is the CPU script with `--seed seed + k * num_envs`: the same initial weights and env
seeds, its own Adam state, normalization statistics and random draws. A flag that takes several
values (`--learning-rate`, `--gamma`, `--gae-lambda`, `--clip-coef`, `--ent-coef`, `--vf-coef`,
`--max-grad-norm`) makes a sweep: each setting of their grid is trained by `--num-seeds` members,
with the same seeds, and the run ends with a table of the settings, best first (docs/usage.md,
"Sweeps"). `make_learner` writes one member's functions as the CPU script does, then one block vmaps
them over a leading seeds axis of the stacked parameters (`diff` the two files). Every member's envs
are one envpool, stepped by C++ threads, in next-step reset mode (the step after an episode's end
only resets, and weighs 0 in the loss); it renders no frames and cannot be saved, so a resumed run's
episodes start fresh. A member whose loss or weights turn non-finite is left out, and the others go
on. The SUMMARY, model files and `--resume`, per member: docs/usage.md, "The seeds scripts".
"""

import math
import os
from dataclasses import dataclass
from types import SimpleNamespace

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from flags import CudaFlags, fail
from optimizers import Adam
from seeds import (
    SeedsRun,
    check_memory,
    finished_member_episodes,
    flat,
    member_values,
    per_member,
    settings,
    sweep_argv,
)
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule
from threads import ThreadFlags
from torch.func import functional_call, grad_and_value, stack_module_state, vmap
from vector_envs import evaluate


@dataclass
class Args(CudaFlags, ThreadFlags):
    num_seeds: int = 8
    """the number of independent runs (members) trained as one program; in a sweep, of each
    setting"""
    env_id: str = "HalfCheetah-v4"
    """the id of the environment (one of envpool's tasks)"""
    total_timesteps: int = 1_000_000
    """total environment steps of each member"""
    learning_rate: tuple[float, ...] = (3e-4,)
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments of each member"""
    num_steps: int = 2048
    """the number of vector steps of each rollout"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the iterations"""
    gamma: tuple[float, ...] = (0.99,)
    """the discount factor gamma"""
    gae_lambda: tuple[float, ...] = (0.95,)
    """the lambda of the general advantage estimation"""
    num_minibatches: int = 32
    """the number of minibatches each epoch splits the rollout into"""
    update_epochs: int = 10
    """the number of epochs (passes over the rollout) of each update"""
    norm_adv: bool = True
    """normalize the advantages of each minibatch"""
    clip_coef: tuple[float, ...] = (0.2,)
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """use a clipped loss for the value function, as in the paper"""
    ent_coef: tuple[float, ...] = (0.0,)
    """coefficient of the entropy bonus"""
    vf_coef: tuple[float, ...] = (0.5,)
    """coefficient of the value function loss"""
    max_grad_norm: tuple[float, ...] = (0.5,)
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """stop a member's epochs early once its approximate KL exceeds this (off by default)"""

    compile: bool = True
    """compile acting, GAE and the update, each one graph; --no-compile runs the same functions
    eagerly"""
    cudagraphs: bool = False
    """record acting and the update as CUDA graphs (needs a CUDA device)"""


def update_rms(rms, x):
    """gymnasium's RunningMeanStd.update with one sample per env: rms = (mean, var, count)."""
    mean, var, count = rms
    delta = x - mean
    var = (var + delta**2 / (count + 1)) * count / (count + 1)
    return mean + delta / (count + 1), var, count + 1


class EnvpoolWrappers:
    """make_env's wrappers in numpy, each env its own statistics, around `num_envs` envpool envs,
    with gymnasium's interface. `resetting` marks the envs taking a reset step (next-step mode),
    which the statistics skip. `make(seed)`: a new pool, env i seeded `seed + i`."""

    def __init__(self, envs, num_envs, gamma, obs_rms=None, make=None):
        self.envs, self.num_envs, self.gamma, self.make = envs, num_envs, gamma, make
        self.single_action_space = envs.action_space
        shape, dtype = (num_envs, *envs.observation_space.shape), envs.observation_space.dtype
        # as gymnasium's; one count for all envs
        self.obs_rms = (np.zeros(shape, dtype), np.ones(shape, dtype), 1e-4)
        # a trained policy acts on observations normalized as in its training
        self.frozen = obs_rms is not None
        if self.frozen:
            mean, var, count = obs_rms["mean"], obs_rms["var"], obs_rms["count"]
            self.obs_rms = (mean.numpy(), var.numpy(), float(count))
        self.return_rms = (np.zeros(num_envs), np.ones(num_envs), np.full(num_envs, 1e-4))
        self.discounted_reward = np.zeros(num_envs)
        self.episode_return, self.episode_length = np.zeros(num_envs), np.zeros(num_envs, int)
        self.resetting = np.zeros(num_envs, bool)

    def close(self):
        self.envs.close()

    def normalize(self, obs):
        """NormalizeObservation, then the clip to [-10, 10]; float32 once, here."""
        self.obs_rms = self.obs_rms if self.frozen else update_rms(self.obs_rms, obs)
        mean, var, _ = self.obs_rms
        return np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10).astype(np.float32)

    def reset(self, seed=None):  # envpool's seeds are fixed when it is made: a seed makes anew
        if seed is not None:
            self.envs.close()
            self.envs = self.make(seed)
        self.episode_return[:], self.episode_length[:], self.resetting[:] = 0.0, 0, False
        return self.normalize(self.envs.reset()[0]), {}

    def state_dict(self):  # the statistics, for checkpoints (envpool's envs cannot be saved)
        rms = dict(obs_rms=self.obs_rms, return_rms=self.return_rms)
        return rms | dict(discounted_reward=self.discounted_reward)

    def load_state_dict(self, state):
        vars(self).update(state)

    def step(self, actions):
        stepped = ~self.resetting
        actions = np.clip(actions, self.envs.action_space.low, self.envs.action_space.high)
        obs, reward, terminations, truncations, _ = self.envs.step(actions)
        self.episode_return = np.where(stepped, self.episode_return, 0.0) + reward
        self.episode_length = np.where(stepped, self.episode_length + 1, 0)
        self.resetting = terminations | truncations
        episode = {"r": self.episode_return, "l": self.episode_length}
        infos = {"final_info": {"episode": episode, "_episode": self.resetting}}
        # NormalizeReward (its discounted return restarts at a termination only), then the clip
        discounted_reward = self.discounted_reward * self.gamma * (1 - terminations) + reward
        self.discounted_reward = np.where(stepped, discounted_reward, self.discounted_reward)
        rms = update_rms(self.return_rms, self.discounted_reward)
        self.return_rms = tuple(np.where(stepped, x, old) for x, old in zip(rms, self.return_rms))
        reward = np.clip(reward / np.sqrt(self.return_rms[1] + 1e-8), -10, 10)
        return self.normalize(obs), reward, terminations, truncations, infos


def make_envs(env_id, num_envs, seed, num_seeds, gamma, obs_rms=None):
    """All members' envs as one envpool in EnvpoolWrappers, member k's a slice, env j seeded
    `seed + j` or `seed[j]` (a list; member k's env i, as the single-seed script with `--seed
    seeds[k]` seeds it: seeds[k] + i); `gamma`, a number or one per env; `obs_rms` (a saved
    model's) normalizes, frozen. An id that is not envpool's exits 2."""
    if env_id not in envpool.list_all_envs():
        fail(f"--env-id {env_id!r} is not one of envpool's tasks (envpool.list_all_envs())")
    n = num_seeds * num_envs
    threads = min(len(os.sched_getaffinity(0)), n)

    def make(seed):  # env j (env j % num_envs of member j // num_envs)
        env_seeds = seed if isinstance(seed, list) else [(seed + j) % 2**31 for j in range(n)]
        return envpool.make_gymnasium(env_id, num_envs=n, env_seed=env_seeds, num_threads=threads)

    return EnvpoolWrappers(make(seed), n, gamma, obs_rms, make)


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

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        # acting: under vmap's randomness="different", each member draws its own noise
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

    forward = get_action_and_value  # what `functional_call` runs


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


def make_learner(args, n_obs, n_act, seeds, device):
    """PPO's members' agents, optimizer and steps on `device`, stacked on a leading seeds axis.
    Member k starts from the weights ppo_continuous_action_cpu.py draws with `--seed seeds[k]`."""
    members = []
    for seed in seeds:
        with torch.random.fork_rng():  # the global generator is left as it was
            torch.manual_seed(seed)
            members.append(Agent(n_obs, n_act, device=device))
    agent = Agent(n_obs, n_act, device="meta")  # the shell that `functional_call` fills
    # each member's hyperparameters, [num_members] (a sweep's settings, each `--num-seeds` times)
    hp = member_values(args, len(seeds), device)
    # a tensor annealed in place: the compiled update reads it, and nothing recompiles
    lr = hp["learning_rate"].clone()
    # the members' tensors, stacked, which Adam updates in place
    params = {name: p.detach() for name, p in stack_module_state(members)[0].items()}
    # a step count per member: --target-kl stops the members after different numbers of steps
    optimizer = Adam(params, lr, eps=1e-5, members=lr.shape)

    def loss_fn(params, mb, hp):
        """The clipped-surrogate loss of a minibatch, and its statistics."""
        inputs = (mb["obs"], mb["actions"])
        _, newlogprob, entropy, newvalue = functional_call(agent, params, inputs)
        logratio = newlogprob - mb["logprobs"]
        ratio = logratio.exp()
        # envpool's reset steps weigh 0 in every mean; a member with one valid row in a
        # minibatch, or none, gets means and a std of 0. Of shape [1], not []: under vmap on a
        # GPU, a number in arithmetic with a 0-d tensor makes a CPU tensor
        valid, count = mb["valid"], mb["valid"].sum(0, keepdim=True)

        def mean(x):
            return (x * valid).sum(0, keepdim=True) / count.clamp(min=1)

        with torch.no_grad():
            # calculate approx_kl http://joschu.net/blog/kl-approx.html
            old_approx_kl = mean(-logratio)
            approx_kl = mean((ratio - 1) - logratio)
            clipfrac = mean(((ratio - 1.0).abs() > hp["clip_coef"]).float())

        mb_advantages = mb["advantages"]
        if args.norm_adv:
            centered = mb_advantages - mean(mb_advantages)
            std = ((centered**2 * valid).sum(0, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
            mb_advantages = centered / (std + 1e-8)

        # policy loss
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - hp["clip_coef"], 1 + hp["clip_coef"])
        pg_loss = mean(torch.max(pg_loss1, pg_loss2))

        # value loss
        newvalue = newvalue.view(-1)
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - mb["returns"]) ** 2
            v_clipped = mb["values"] + torch.clamp(
                newvalue - mb["values"], -hp["clip_coef"], hp["clip_coef"]
            )
            v_loss_clipped = (v_clipped - mb["returns"]) ** 2
            v_loss = 0.5 * mean(torch.max(v_loss_unclipped, v_loss_clipped))
        else:
            v_loss = 0.5 * mean((newvalue - mb["returns"]) ** 2)

        entropy_loss = mean(entropy)
        loss = pg_loss - hp["ent_coef"] * entropy_loss + v_loss * hp["vf_coef"]
        stats = [pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]
        return loss.sum(), torch.cat(stats).detach()

    def ppo_grads(params, mb, hp):
        """The gradients of a minibatch's loss, clipped, and its statistics. `torch.func` takes
        them and the clip is written out: `backward` would split the compiled graph."""
        grads, (loss, stats) = grad_and_value(loss_fn, has_aux=True)(params, mb, hp)
        # nn.utils.clip_grad_norm_, written out
        squares = torch.stack([grad.pow(2).sum() for grad in grads.values()])
        total_norm = squares.sum(0, keepdim=True).sqrt()  # of shape [1]: see loss_fn
        scale = (hp["max_grad_norm"] / (total_norm + 1e-6)).clamp(max=1.0)
        return {name: grad * scale for name, grad in grads.items()}, stats

    # ---- N seeds: the member functions above, vmapped over the leading seeds axis ----
    # Each name below stands for its member function lifted over the members: parameters and
    # minibatches [num_seeds, ...]. Acting draws each member's own noise. Adam's step needs no
    # vmap: elementwise, it runs on the stacks as it is.
    ppo_grads = vmap(ppo_grads)
    get_action_and_value = vmap(
        lambda params, obs: functional_call(agent, params, (obs,)), randomness="different"
    )

    def policy(obs):  # every member's envs at once: [num_seeds * num_envs, n_obs]
        return tuple(flat(x) for x in get_action_and_value(params, per_member(obs, len(seeds))))

    # ---- end of the N seeds block ----

    # each member's hyperparameters of shape [1], not [] (see loss_fn)
    member_hp = {name: value.unsqueeze(1) for name, value in hp.items()}

    def update(mb):
        """One gradient step on a minibatch (a TensorDict); returns its statistics."""
        grads, stats = ppo_grads(params, mb, member_hp)
        optimizer.step(grads)
        return stats

    return SimpleNamespace(
        agent=agent,
        params=params,
        optimizer=optimizer,
        hp=hp,
        policy=policy,
        update=update,
    )


def main(args):
    for setting in settings(args):  # each point of a sweep, as a single run's flags
        check_args(setting)
    run = SeedsRun(args, "ppo_continuous_action_seeds")  # seeds.py: folder, seeds, sweep, ...
    members = len(run.seeds)  # settings x seeds
    # one env first: its id and sizes, before N members'
    probe = make_envs(args.env_id, 1, args.seed, 1, args.gamma)
    space = probe.single_action_space
    if not isinstance(space, gym.spaces.Box):
        fail(f"--env-id {args.env_id!r} has a {space} action space; PPO needs a Box")
    n_obs = int(np.prod(probe.envs.observation_space.shape))
    n_act = int(np.prod(space.shape))
    probe.close()
    # 3 copies, float32
    rollout_bytes = 3 * args.num_steps * args.num_envs * (n_obs + n_act + 8) * 4
    check_memory(members, rollout_bytes, "rollouts")
    # each env's gamma, its member's
    gamma = np.repeat([setting.gamma for setting in run.member_settings], args.num_envs)
    envs = make_envs(args.env_id, args.num_envs, run.env_seeds, members, gamma)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    learner = make_learner(args, n_obs, n_act, run.seeds, device)
    params, optimizer, hp = learner.params, learner.optimizer, learner.hp

    def evaluate_agent(member, episodes, videos):  # the Gaussian's mean; `models` is bound below
        model, seed = models[member], run.seeds[member]
        agent = Agent(n_obs, n_act, device=device)
        agent.load_state_dict(model["agent"])
        gamma = run.member_settings[member].gamma
        eval_envs = make_envs(args.env_id, 1, seed, 1, gamma, model["obs_rms"])
        return evaluate(agent.actor_mean, eval_envs, episodes, seed, device)

    if args.eval_model:  # the saved model as every member
        models = [run.saved_model] * members
        envs.close()
        return run.finish(device, models, evaluate_agent)
    policy, update = learner.policy, learner.update
    compute_gae = gae
    if args.compile:
        # acting, GAE and the whole update, each one graph; a C++ wrapper makes fewer Python calls
        options = {"cpp_wrapper": device.type == "cpu"}
        policy = torch.compile(policy, fullgraph=True, options=options)
        compute_gae = torch.compile(gae, fullgraph=True, options=options)
        update = torch.compile(update, fullgraph=True, options=options)
    if args.cudagraphs:
        # the first calls run as they are (compiling, with --compile), the next records the graph,
        # later ones replay it
        policy = CudaGraphModule(policy, warmup=3 if args.compile else 2)
        update = CudaGraphModule(update, warmup=3 if args.compile else 2)

    # the rollout, [num_steps, num_seeds * num_envs, ...] on the host, one TensorDict
    scalars = ("logprobs", "values", "rewards", "terminations", "truncations", "valid")
    rollout = {key: torch.zeros(args.num_steps, envs.num_envs) for key in scalars}
    rollout["obs"] = torch.zeros(args.num_steps, envs.num_envs, n_obs)
    rollout["actions"] = torch.zeros(args.num_steps, envs.num_envs, n_act)
    rollout = TensorDict(rollout, batch_size=[args.num_steps, envs.num_envs])
    # numpy views of the rollout's tensors, which the policy's arrays are written to
    store = rollout.numpy()

    next_obs, _ = envs.reset()
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size

    def training_state():  # what a checkpoint keeps, beside the run's counters and generators
        # envpool's envs cannot be saved, their statistics can
        state = dict(params=params, optimizer=optimizer)
        return dict(learner=state, normalization=envs, envs=(envs, next_obs))

    start = run.resume(training_state())  # 0, or the iteration after the checkpoint's
    # with a [num_seeds, k] index: member rows
    member_rows = torch.arange(members, device=device).unsqueeze(1)
    global_step = run.steps  # 0 unless resumed
    for iteration in run.progress(range(start, num_iterations)):
        if iteration == args.measure_burnin:
            run.start_clock(global_step)  # sps counts from here
        if args.anneal_lr:
            frac = 1.0 - iteration / num_iterations
            # in place: no recompile
            optimizer.param_groups[0]["lr"].copy_(frac * hp["learning_rate"])

        # rollout
        for step in range(args.num_steps):
            global_step += args.num_envs
            store["obs"][step] = next_obs
            store["valid"][step] = ~envs.resetting
            action, logprob, _, value = (
                x.cpu().numpy() for x in policy(torch.as_tensor(next_obs, device=device))
            )
            store["values"][step] = value.flatten()
            store["actions"][step] = action
            store["logprobs"][step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action)
            run.log_episodes(global_step, finished_member_episodes(infos, members))
            store["rewards"][step] = reward
            store["terminations"][step] = terminations
            store["truncations"][step] = truncations

        # advantages
        next_value = policy(torch.as_tensor(next_obs, device=device))[3].flatten().cpu()
        # envpool's next-step reset: the true final obs of an episode is the obs stored at the step
        # after its end
        rollout["final_values"] = torch.cat([rollout["values"][1:], next_value.unsqueeze(0)])
        keys = ("rewards", "values", "final_values", "terminations", "truncations")
        advantages, returns = compute_gae(
            **{key: rollout[key] for key in keys},
            next_value=next_value,
            # each env's, its member's
            gamma=hp["gamma"].repeat_interleave(args.num_envs).cpu(),
            gae_lambda=hp["gae_lambda"].repeat_interleave(args.num_envs).cpu(),
        )

        # update, on [num_seeds, num_steps * num_envs]: each member its own rows
        b = rollout.select("obs", "actions", "logprobs", "values", "valid")
        b["advantages"], b["returns"] = advantages, returns
        b = b.unflatten(1, (members, args.num_envs)).transpose(0, 1).flatten(1, 2).to(device)
        # members stopped by --target-kl
        stopped = torch.zeros(members, dtype=torch.bool, device=device)
        # what a member past the target keeps
        member_state = [x for x in (*params.values(), *optimizer.state_dict().values()) if x.dim()]
        kept = [x.clone() for x in member_state] + [torch.zeros(members, 6, device=device)]
        for _epoch in range(args.update_epochs):
            # each member its own shuffle
            b_shuffled = b[member_rows, torch.rand(b.shape, device=device).argsort(dim=1)]
            for mb in b_shuffled.split(minibatch_size, dim=1):
                stats = update(mb)
            # host sync, once per epoch: a member past the target keeps this state
            if args.target_kl is not None:
                for x, saved in zip([*member_state, stats], kept):
                    x[stopped], saved[~stopped] = saved[stopped], x[~stopped]
                stopped |= stats[:, 4] > args.target_kl
                if stopped.all():
                    break

        # log
        explained_var = 1 - (b["returns"] - b["values"]).var(1) / b["returns"].var(1)
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
        metrics = dict(zip(names, stats.T), explained_variance=explained_var)
        metrics["learning_rate"] = optimizer.param_groups[0]["lr"]
        run.log_progress(global_step, metrics)
        run.checkpoint(iteration, training_state, global_step)  # when due, on a signal, at the end
        if run.stopped:  # a first Ctrl-C or SIGTERM, or no member left
            break

    # each member's observation normalization (its first env's) is part of its policy, saved with it
    mean, var, count = envs.obs_rms
    models = []
    for k in range(members):
        rms = (mean[k * args.num_envs], var[k * args.num_envs], count)
        obs_rms = {key: torch.tensor(x) for key, x in zip(("mean", "var", "count"), rms)}
        weights = {name: param[k].cpu().clone() for name, param in params.items()}
        models.append({"agent": weights, "obs_rms": obs_rms})
    envs.close()
    run.finish(device, models, evaluate_agent)


def check_args(args):
    """This script's flags: a value that makes no sense ends the run before training, with one line
    that names the flag (exit status 2); the run flags are the Run's to check."""
    flags = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    flags += ("learning_rate", "clip_coef", "max_grad_norm", "target_kl", "num_seeds")
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value <= 0:  # --target-kl None: off
            fail(f"--{flag.replace('_', '-')} must be positive, got {value}")
    batch_size = args.num_steps * args.num_envs
    if args.total_timesteps < batch_size:
        rollout = "one rollout (--num-steps x --num-envs)"
        fail(f"--total-timesteps {args.total_timesteps} is less than {rollout}")
    if batch_size % args.num_minibatches or batch_size < 2 * args.num_minibatches:
        rollout = f"--num-steps x --num-envs ({batch_size})"
        fail(f"--num-minibatches must split {rollout} into equal parts of 2 or more")
    if not 0 <= args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail("--gamma and --gae-lambda must be in [0, 1]")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA device and there is none (or --no-cuda was given)")
    if args.capture_video:
        single = "record a saved member with the single-seed script"
        fail(f"--capture-video: envpool renders no frames; {single}")


if __name__ == "__main__":
    main(tyro.cli(Args, args=sweep_argv(Args)))
