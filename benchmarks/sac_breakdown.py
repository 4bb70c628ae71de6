"""Where a SAC step's time goes: each part of the learning-phase loop timed on its own, for both twins.

    python -m benchmarks.sac_breakdown                  # HalfCheetah-v4, 300 timed steps per variant
    python -m benchmarks.sac_breakdown --compile        # also the twin with torch.compile

The parts are built with the scripts' own functions (make_envs, ReplayBuffer, make_updates, ...), so what is
timed is what the scripts run. Each part's median over the timed steps is reported in microseconds and as a
share of their sum; the actor step runs every step here and is weighted by 1 (CleanRL's policy_frequency 2
runs 2 actor steps every 2 steps). CPU only: CUDA work is asynchronous and would need synchronizing.
"""

import argparse
import statistics
import time

import numpy as np
import torch
from tensordict import TensorDict, from_module, from_modules

from benchmarks.machine import machine_info
from benchmarks.scripts import load_script

PARTS = ("env step", "acting", "storing", "sampling", "critic update", "actor update", "target update")


def timed(times, part, fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    times[part].append(time.perf_counter() - start)
    return out


def build(module, twin, compile_parts, env_id, seed=1):
    """Environment, buffer, policy and updates, as the script's main() builds them."""
    args = module.Args(env_id=env_id)
    torch.manual_seed(seed)
    envs = module.make_envs(env_id, 1, seed)
    n_obs = int(np.prod(envs.single_observation_space.shape))
    n_act = int(np.prod(envs.single_action_space.shape))
    space = envs.single_action_space
    actor = module.Actor(n_obs, n_act, space.low, space.high)
    qf1, qf2 = module.SoftQNetwork(n_obs, n_act), module.SoftQNetwork(n_obs, n_act)
    log_alpha = torch.zeros((), requires_grad=True)
    alpha = log_alpha.detach().exp()
    fused = twin or None
    if twin:
        qnet_params = from_modules(qf1, qf2, as_module=True)
        q_params = qnet_params.values(True, True)
        nets = (module.make_ensemble_qf(n_obs, n_act), module.make_ensemble_qf(n_obs, n_act), qnet_params, qnet_params.data.clone())
    else:
        qf1_target, qf2_target = module.SoftQNetwork(n_obs, n_act), module.SoftQNetwork(n_obs, n_act)
        q_params = list(qf1.parameters()) + list(qf2.parameters())
        nets = (qf1, qf2, qf1_target, qf2_target)
    optimizers = (
        torch.optim.Adam(q_params, lr=args.q_lr, fused=fused),
        torch.optim.Adam(actor.parameters(), lr=args.policy_lr, fused=fused),
        torch.optim.Adam([log_alpha], lr=args.q_lr, fused=fused),
    )
    update_critic, update_actor, update_targets = module.make_updates(
        actor, *nets, log_alpha, alpha, optimizers, args, -float(n_act)
    )
    policy = actor.get_action
    if twin:
        actor_detach = module.Actor(n_obs, n_act, space.low, space.high)
        from_module(actor).data.to_module(actor_detach)
        policy = actor_detach.get_action
    if compile_parts:
        policy, update_critic, update_actor = map(torch.compile, (policy, update_critic, update_actor))
    return envs, module.ReplayBuffer(100_000, n_obs, n_act, "cpu"), policy, (update_critic, update_actor, update_targets)


def run_variant(script, twin, compile_parts, env_id, steps, warmup=50):
    """Median seconds per part over `steps` learning-phase steps, after `warmup` untimed ones."""
    module = load_script(script)
    envs, rb, policy, (update_critic, update_actor, update_targets) = build(module, twin, compile_parts, env_id)
    obs, _ = envs.reset(seed=1)
    times = {part: [] for part in PARTS}
    for step in range(warmup + steps):
        if step == warmup:
            times = {part: [] for part in PARTS}
        with torch.no_grad():
            actions, _, _ = timed(times, "acting", policy, torch.as_tensor(obs, dtype=torch.float))
        actions = actions.numpy()
        next_obs, rewards, terminations, _, infos = timed(times, "env step", envs.step, actions)
        transition = {
            "obs": obs, "next_obs": module.true_next_obs(next_obs, infos), "actions": actions,
            "rewards": rewards, "terminations": terminations,
        }

        def store():
            tensors = {k: torch.as_tensor(v, dtype=torch.float) for k, v in transition.items()}
            rb.add(TensorDict(tensors, [1]) if twin else tensors)

        timed(times, "storing", store)
        obs = next_obs
        data = timed(times, "sampling", rb.sample, 256)
        timed(times, "critic update", update_critic, data)
        timed(times, "actor update", update_actor, data)
        timed(times, "target update", update_targets)
    envs.close()
    return {part: statistics.median(values) for part, values in times.items()}


def table(results):
    names = list(results)
    lines = ["| part | " + " | ".join(f"{n} (µs)" for n in names) + " | " + " | ".join(f"{n} share" for n in names) + " |"]
    lines.append("|---" * (1 + 2 * len(names)) + "|")
    totals = {n: sum(results[n].values()) for n in names}
    for part in PARTS + ("total",):
        us = [totals[n] if part == "total" else results[n][part] for n in names]
        shares = [u / totals[n] for u, n in zip(us, names)]
        lines.append(f"| {part} | " + " | ".join(f"{u * 1e6:.0f}" for u in us) + " | " + " | ".join(f"{s:.0%}" for s in shares) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="HalfCheetah-v4")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per variant")
    parser.add_argument("--compile", action="store_true", help="also time the twin with torch.compile")
    opts = parser.parse_args()
    variants = {"eager twin": ("sac_continuous_action", False, False), "optimized twin": ("sac_continuous_action_torchcompile", True, False)}
    if opts.compile:
        variants["optimized twin, compiled"] = ("sac_continuous_action_torchcompile", True, True)
    results = {name: run_variant(*spec, opts.env_id, opts.steps) for name, spec in variants.items()}
    info = machine_info()
    print(f"{opts.env_id}, {opts.steps} steps, {info['cpu']} ({info['cores']} cores), torch {info['versions']['torch']}")
    print(table(results))


if __name__ == "__main__":
    main()
