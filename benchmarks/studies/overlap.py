"""Double-buffered sampling measured: the rollout phase alone, synchronous against envpool's async
mode, each next to the bound its design can reach (docs/async-sampling.md).

    python -m benchmarks.studies.overlap  # stand-ins at d = 0.1, 1, 10 ms, PPO Atari (18 min)
    python -m benchmarks.studies.overlap --quick  # a smoke run (~1 min)
    python -m benchmarks.studies.overlap --skip-atari  # the stand-in envs alone
    python -m benchmarks.studies.overlap --compile  # the Atari policy compiled

Designs: `sync` steps all `--num-envs` envs, then acts on all; `async B` is envpool's async mode
with batch_size B (`--async-batch-sizes`), the other envs stepping in the pool's threads. Bounds
come from costs timed alone, in blocks that take turns with the rollouts: E, env-only time per env
step, and A, acting time per env step at the design's batch; sync 1 / (E + A), async 1 / max(E, A),
plus the pipeline bound 1 / max(E + A / k, A) for k = envs / B batches in flight.

(a) Stand-in envs (benchmarks/standin.py) sleep `--step-ms` per step outside the GIL; the policy
is a matmul chain calibrated to `--policy-ms`. (b) PPO Atari with envpool: the twin's rollout loop,
reproduced in `twin_rollout` (tests/test_overlap.py checks it line by line against the twin),
against ppo_atari_envpool_async.py's `collect_rollout`; beside them each script's whole iteration
(its SUMMARY's sps). Writes benchmarks/results/overlap-<time>.{json,md,png} (or to `--out`).
"""

import functools
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, closing
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

from benchmarks import cli
from benchmarks.cli import conclude, pick_device, positive_float, positive_int
from benchmarks.env_limit import random_actions
from benchmarks.machine import machine_info
from benchmarks.plots import panels, save
from benchmarks.processes import note
from benchmarks.report import machine_line, optional, table, write_result
from benchmarks.run import BenchmarkError, failure, parse_summary
from benchmarks.scripts import load_script
from benchmarks.standin import StandInEnvs
from benchmarks.studies.inference import time_block

TWIN, ASYNC = "ppo_atari_envpool_torchcompile", "ppo_atari_envpool_async"
# the scripts' flags: 20 iterations of 8 x 128 steps
FULL = dict(step_ms=[0.1, 1.0, 10.0], rounds=5, seconds=2.0, atari_steps=128, atari_rollouts=2)
FULL["script_flags"] = "--total-timesteps 20480 --measure-burnin 3"
QUICK = dict(step_ms=[0.1, 1.0, 10.0], rounds=2, seconds=0.2, atari_steps=8, atari_rollouts=1)
QUICK["script_flags"] = "--total-timesteps 512 --num-steps 16 --update-epochs 1 --measure-burnin 1"
WARMUP_CALLS = 5  # loop steps (or rollouts: 1) before a block's clock starts
WIDTH = 64  # the stand-in policy's matmul: [WIDTH, WIDTH] per frame


# ---- the rollout loops, on any env with envpool's API ----


def sync_loop(envs, act):
    """One vector step per call, the synchronous way."""
    obs, _ = envs.reset()

    def step():
        nonlocal obs
        obs = envs.step(act(obs))[0]
        return len(obs)

    return step


def async_loop(envs, act):
    """One batch per call, envpool's async way: receive the first envs done, act on them, send their
    actions (the others step meanwhile). Returns a function that takes one batch and returns its env
    steps."""
    envs.async_reset()

    def step():
        obs, _, _, _, info = envs.recv()
        envs.send(act(obs), info["env_id"])
        return len(obs)

    return step


def steps_per_second(step, seconds, warmup=WARMUP_CALLS, clock=time.perf_counter):
    """Env steps per second of `step()` (returns its env steps) over `seconds`."""
    for _ in range(warmup):
        step()
    env_steps, start = 0, clock()
    while (elapsed := clock() - start) < seconds:
        env_steps += step()
    return env_steps / elapsed


def acting_step(act, frames, cuda=False):
    """A step for `steps_per_second`: `act` on `frames` once (no grad; CUDA waited for)."""

    def step():
        with torch.no_grad():
            act(frames)
        if cuda:
            torch.cuda.synchronize()
        return len(frames)

    return step


def rollouts_block(one, rollouts):
    """A block of `rollouts` calls of `one()` (one rollout each, returning its env steps)."""

    def block():
        start, env_steps = time.perf_counter(), sum(one() for _ in range(rollouts))
        return env_steps / (time.perf_counter() - start)

    return block


def alternate(blocks, rounds):
    """Each block's rates over `rounds` rounds, the blocks' order rotated each round."""
    names, rates = list(blocks), {name: [] for name in blocks}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            rates[name].append(blocks[name]())
    return rates


def bounds(design, num_envs, batch, env_sps, acting_sps):
    """The design's costs per env step, E (`env_sps`: the envs alone) and A (`acting_sps`: frames/s
    of the policy on `batch` frames), in µs, and its bound in env steps/s: 1 / (E + A) for sync,
    1 / max(E, A) for async; for async also the pipeline bound of k = num_envs / batch batches,
    1 / max(E + A / k, A), which holds where a batch steps in E x num_envs (a thread per env)."""
    env_us, act_us = 1e6 / env_sps, 1e6 / acting_sps
    row = dict(env_us_per_step=env_us, acting_us_per_step=act_us, acting_ms=batch * act_us / 1e3)
    if design == "sync":
        return row | {"bound_sps": 1e6 / (env_us + act_us), "pipeline_bound_sps": None}
    pipeline = 1e6 / max(env_us + act_us / (num_envs / batch), act_us)
    return row | {"bound_sps": 1e6 / max(env_us, act_us), "pipeline_bound_sps": pipeline}


def design_rows(case, plan, num_envs, rates, pipeline=True):
    """One row per design of `plan` from the rates of its blocks (`rollout <design>`, `env-only
    <design>`, `acting <batch>`): medians, costs, bounds and ratios; sps relative to sync.
    `pipeline`: whether the pipeline bound holds (a thread per env)."""
    rows = []
    for name, batch in plan:
        env_blocks, acting_blocks = rates[f"env-only {name}"], rates[f"acting {batch}"]
        env_sps, acting_sps = statistics.median(env_blocks), statistics.median(acting_blocks)
        row = dict(case=case, design=name, batch=batch, env_only_sps=env_sps, acting_sps=acting_sps)
        row |= dict(env_only_blocks=env_blocks, acting_blocks=acting_blocks)
        row |= bounds(name, num_envs, batch, env_sps, acting_sps)
        if not pipeline:
            row["pipeline_bound_sps"] = None
        rows.append(summarize(row, rates[f"rollout {name}"]))
    sync = rows[0]["sps_median"]
    return [r | {"vs_sync": r["sps_median"] / sync} for r in rows]


def summarize(row, sps):
    """`row` with its blocks' sps, their median, min and max, and the ratios to the bounds."""
    median = statistics.median(sps)
    row |= {"sps": sps, "sps_median": median, "sps_min": min(sps), "sps_max": max(sps)}
    row["ratio_to_bound"] = median / row["bound_sps"]
    pipeline = row["pipeline_bound_sps"]
    row["ratio_to_pipeline_bound"] = median / pipeline if pipeline else None
    return row


def loop_of(design):
    """The rollout loop of a design: `sync_loop` or `async_loop`."""
    return sync_loop if design == "sync" else async_loop


def designs(num_envs, batch_sizes):
    """(name, batch) of every design: sync, then async at each batch size."""
    return [("sync", num_envs)] + [(f"async {b}", b) for b in batch_sizes]


# ---- (a) stand-in envs ----


def matmul_policy(policy_ms, num_envs, n_actions, seed=0):
    """A policy of known cost: per frame, `rounds` products with one [WIDTH, WIDTH] matrix (a
    batched matmul, so the cost grows with the batch), `rounds` calibrated so that acting on
    `num_envs` frames takes about `policy_ms`. The action is the frame's step in its episode,
    mod `n_actions`. Returns the policy (numpy frames in, actions out) and `rounds`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_envs, WIDTH, WIDTH, generator=g)
    w = torch.randn(WIDTH, WIDTH, generator=g) / WIDTH**0.5

    def work(batch, rounds):
        y = x[:batch]
        for _ in range(rounds):
            y = torch.tanh(y @ w)
        return y

    probe = 20
    work(num_envs, probe)  # the first calls allocate
    per_round = statistics.median(time_block(lambda _: work(num_envs, probe), None, 10, False))
    per_round /= probe
    rounds = max(1, round(policy_ms / 1e3 / per_round))

    def act(obs):
        work(len(obs), rounds)
        return obs.reshape(len(obs), -1)[:, 2].astype(np.int64) % n_actions

    return act, rounds


def fixed_actions(obs):
    return np.zeros(len(obs), dtype=np.int64)


def standin_case(step_ms, args, act, frames):
    """One step cost d: every design's rollout, env-only and acting blocks, alternated."""
    plan = designs(args.num_envs, args.async_batch_sizes)

    def pool(batch):  # a thread per env in every design, so that all envs can step at once in each
        return StandInEnvs(args.num_envs, batch, args.num_envs, step_ms / 1e3, seed=args.seed)

    with ExitStack() as stack:
        blocks = {}
        for name, batch in plan:
            for kind, policy in (("rollout", act), ("env-only", fixed_actions)):
                step = loop_of(name)(stack.enter_context(closing(pool(batch))), policy)
                blocks[f"{kind} {name}"] = functools.partial(steps_per_second, step, args.seconds)
            step = acting_step(act, frames[:batch])
            blocks[f"acting {batch}"] = functools.partial(steps_per_second, step, args.seconds / 4)
        rates = alternate(blocks, args.rounds)
    return design_rows(f"stand-in d={step_ms:g} ms", plan, args.num_envs, rates)


def standin(args):
    """Every step cost's rows, with the stand-in policy's calibration."""
    act, rounds = matmul_policy(args.policy_ms, args.num_envs, n_actions=4, seed=args.seed)
    with closing(StandInEnvs(args.num_envs, seed=args.seed)) as envs:
        frames = envs.reset()[0]
    rows = []
    for step_ms in args.step_ms:
        note(f"stand-in envs: d = {step_ms:g} ms")
        rows += standin_case(step_ms, args, act, frames)
    return {"policy_rounds": rounds, "rows": rows}


# ---- (b) PPO Atari with envpool ----


def twin_rollout(envs, policy, rollout, next_obs, game_returns, finished_games, device):
    """ppo_atari_envpool_torchcompile.py's rollout loop, line for line (its `for step in
    range(args.num_steps)`, the games' scores computed by its `finished_games` and dropped instead
    of logged); returns the next frames."""
    for step in range(rollout.shape[0]):
        obs = rollout["obs"][step]
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
        next_obs = torch.from_numpy(next_obs)
        finished_games(game_returns, infos, truncations)
    return next_obs


def storage(rows, envs, device):
    """The Atari scripts' rollout storage: a TensorDict [rows, num_envs]."""
    shape = (rows, envs.num_envs)
    keys = ("logprobs", "values", "rewards", "terminations", "truncations")
    rollout = TensorDict(
        {key: torch.zeros(shape, device=device) for key in keys}, batch_size=shape, device=device
    )
    rollout["obs"] = torch.zeros(
        *shape, *envs.single_observation_space.shape, dtype=torch.uint8, device=device
    )
    rollout["actions"] = torch.zeros(shape, dtype=torch.long, device=device)
    return rollout


def twin_rollouts(twin, num_steps, envs, policy, get_value, device):
    """A function that runs one rollout phase of the twin and returns its env steps."""
    rollout = storage(num_steps, envs, device)
    next_obs = torch.from_numpy(envs.reset()[0])
    game_returns = np.zeros(envs.num_envs)

    def one():
        nonlocal next_obs
        next_obs = twin_rollout(
            envs, policy, rollout, next_obs, game_returns, twin.finished_games, device
        )
        with torch.no_grad():
            get_value(next_obs.to(device))
        return rollout.numel()

    return one


def async_rollouts(module, num_steps, envs, policy, get_value, device):
    """A function that runs the async script's `collect_rollout` once per call (each env's
    `num_steps` steps and its bootstrap value, the script's storage and state carried from call
    to call) and returns its env steps."""
    rollout = module.make_storage(
        num_steps, envs.num_envs, envs.single_observation_space.shape, device
    )
    state = module.RolloutState(envs.num_envs)
    envs.async_reset()

    def one():
        sent = state.global_step
        module.collect_rollout(envs, policy, get_value, rollout, state, num_steps, lambda *_: None)
        # num_steps x num_envs, a few more or fewer as envs run ahead
        return state.global_step - sent

    return one


def atari_policy(twin, agent_args, n_act, device, compile_policy):
    """The twin's acting policy and value function on a fresh agent, for both designs."""
    learner = twin.make_learner(agent_args, n_act, device)
    policy, get_value = learner.policy, learner.get_value
    return torch.compile(policy, fullgraph=True) if compile_policy else policy, get_value


def random_actions_of(envs, seed):
    """A policy for the env-only blocks: pre-drawn random actions, cycled, cut to the batch."""
    actions = itertools.cycle(random_actions(envs.single_action_space, envs.num_envs, seed))

    def act(obs):
        return next(actions)[: len(obs)]

    return act


def atari(args, device, scripts_dir):
    """Rows of the twin's and the async script's rollout phases, with costs and bounds."""
    twin, asynchronous = load_script(TWIN, scripts_dir), load_script(ASYNC, scripts_dir)
    plan = designs(args.num_envs, args.async_batch_sizes)
    agent_args = dict(env_id=args.env_id, num_envs=args.num_envs, seed=args.seed)
    agent_args = twin.Args(**agent_args, num_steps=args.atari_steps, compile=args.compile)
    env_id, num_envs = args.env_id, args.num_envs

    def pool(name, batch):
        if name == "sync":
            return twin.make_envs(env_id, num_envs, args.seed)
        return asynchronous.make_envs(env_id, num_envs, batch, args.seed, args.env_threads)

    torch.manual_seed(args.seed)
    with ExitStack() as stack:
        blocks = {}
        for name, batch in plan:
            envs = stack.enter_context(closing(pool(name, batch)))
            if name == "sync":
                frames = torch.from_numpy(envs.reset()[0]).to(device)
                n_act = envs.single_action_space.n
                policy, get_value = atari_policy(twin, agent_args, n_act, device, args.compile)
                rollouts = functools.partial(twin_rollouts, twin)
            else:
                rollouts = functools.partial(async_rollouts, asynchronous)
            one = rollouts(args.atari_steps, envs, policy, get_value, device)
            one()  # untimed: the first rollout warms up (and compiles)
            blocks[f"rollout {name}"] = rollouts_block(one, args.atari_rollouts)
            envs_alone = stack.enter_context(closing(pool(name, batch)))
            step = loop_of(name)(envs_alone, random_actions_of(envs_alone, args.seed))
            blocks[f"env-only {name}"] = functools.partial(steps_per_second, step, args.seconds)
            step = acting_step(policy, frames[:batch], device.type == "cuda")
            blocks[f"acting {batch}"] = functools.partial(steps_per_second, step, args.seconds / 4)
        rates = alternate(blocks, args.rounds)
    return design_rows(f"{env_id}, {num_envs} envs", plan, num_envs, rates, pipeline=False)


def whole_iteration(args, scripts_dir, timeout=1800):
    """Each script's SUMMARY sps (rollout and update, after its burn-in) from one brief run with
    `args.script_flags` (FULL's or QUICK's); the async script once per async batch size."""
    rows = []
    threads = ["--env-threads", str(args.env_threads)]
    runs = [(TWIN, [])] + [
        (ASYNC, ["--async-batch-size", str(batch), *threads]) for batch in args.async_batch_sizes
    ]
    for script, flags in runs:
        cmd = [sys.executable, str(Path(scripts_dir) / f"{script}.py"), "--env-id", args.env_id]
        cmd += ["--num-envs", str(args.num_envs), "--seed", str(args.seed)]
        cmd += [*args.script_flags.split(), *flags]
        cmd += ["--compile"] if args.compile else []
        cmd += ["--no-cuda"] if args.device == "cpu" else []
        note("whole iterations: " + " ".join(cmd[1:]))
        with tempfile.TemporaryDirectory() as cwd:
            try:
                env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
                kwargs = dict(capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
                proc = subprocess.run(cmd, **kwargs)
            except subprocess.TimeoutExpired:
                raise failure(cmd, f"ran past the {timeout} s timeout") from None
            if proc.returncode != 0:
                raise failure(cmd, f"exited with status {proc.returncode}", proc.stderr)
            summary = parse_summary(cmd, proc)
        keys = ("script", "sps", "sps_wall", "total_timesteps", "async_batch_size")
        rows.append({k: summary.get(k) for k in keys})
    return rows


# ---- output ----


def rows_table(rows):
    """Markdown: per case and design, sps, the costs, the bounds and the ratios."""
    header = (
        "case | design | rollout sps median (min-max) | vs sync | env-only sps | acting ms/call"
    )
    header += " | E + A or max(E, A) bound sps | ratio to bound | pipeline bound sps | ratio to "
    rows = [
        f"{r['case']} | {r['design']} | {r['sps_median']:.0f} ({r['sps_min']:.0f}-"
        f"{r['sps_max']:.0f}) | {r['vs_sync']:.2f}x | {r['env_only_sps']:.0f} | "
        f"{r['acting_ms']:.3g} | {r['bound_sps']:.0f} | {r['ratio_to_bound']:.2f} | "
        f"{optional(r['pipeline_bound_sps'], '.0f')} | "
        f"{optional(r['ratio_to_pipeline_bound'], '.2f')}"
        for r in rows
    ]
    return table(header + "pipeline bound", rows, "ll" + "r" * 8)


def whole_iteration_table(rows):
    """Markdown: each script run's sps, and its ratio to the twin's (the first row)."""
    twin = rows[0]["sps"]
    cells = [
        f"{r['script']} | {optional(r['async_batch_size'], 'd')} | {optional(r['sps'], '.0f')} "
        f"| {optional(r['sps'] / twin if r['sps'] and twin else None, '.2f', 'x')} | "
        f"{r['sps_wall']:.0f} | {r['total_timesteps']}"
        for r in rows
    ]
    header = "script | async batch | sps (after burn-in) | vs twin | sps_wall | steps"
    return table(header, cells, "lrrrrr")


def markdown(result):
    settings = result["settings"]
    lines = [
        machine_line(result["machine"]) + f"; device {result['device']}",
        f"Started {result['started']}; {settings['rounds']} alternating rounds; "
        f"{settings['num_envs']} envs, async "
        f"batches {' '.join(map(str, settings['async_batch_sizes']))}",
        "",
    ]
    if result["standin"]:
        lines += [
            f"(a) Stand-in envs (a step sleeps d in a thread per env) against a matmul policy of "
            f"~{settings['policy_ms']:g} ms for {settings['num_envs']} frames; blocks of "
            f"{settings['seconds']:g} s",
            "",
            *rows_table(result["standin"]["rows"]),
            "",
        ]
    if result["atari"]:
        lines += [
            f"(b) PPO Atari rollout phase (envpool), rollouts of {settings['atari_steps']} steps x "
            f"{settings['num_envs']} envs, {settings['atari_rollouts']} per block; "
            f"policy {'compiled' if settings['compile'] else 'eager'}; async envs stepped by "
            f"{settings['env_threads']} "
            "envpool thread(s), sync envs by envpool's default",
            "",
            *rows_table(result["atari"]["rows"]),
            "",
            "Whole iterations (rollout + update), each script run once with "
            f"{settings['script_flags']}:",
            "",
            *whole_iteration_table(result["atari"]["whole_iteration"]),
            "",
        ]
    return "\n".join(lines)


def plot(result, path):
    """Per case, each design's median sps (bar, min-max whiskers) with its bound (a black tick) and,
    for stand-in async designs, the pipeline bound (a grey tick)."""
    rows = (result["standin"]["rows"] if result["standin"] else []) + (
        result["atari"]["rows"] if result["atari"] else []
    )
    cases = list(dict.fromkeys(r["case"] for r in rows))
    figure, axes = panels(len(cases), 3.4)
    for ax, case in zip(axes, cases):
        mine = [r for r in rows if r["case"] == case]
        x = range(len(mine))
        medians = [r["sps_median"] for r in mine]
        spread = [[m - r["sps_min"] for m, r in zip(medians, mine)]]
        spread.append([r["sps_max"] - m for m, r in zip(medians, mine)])
        drawn = ax.bar(x, medians, yerr=spread, color=[f"C{i}" for i in x], capsize=3)
        labels = [f"{r['ratio_to_bound']:.2f}" for r in mine]
        ax.bar_label(drawn, labels=labels, fontsize=7, label_type="center")
        ends = [i - 0.4 for i in x], [i + 0.4 for i in x]
        bounds = [r["bound_sps"] for r in mine]
        ax.hlines(bounds, *ends, colors="black", label="bound: E + A, max(E, A)")
        pipeline = [
            (i, r["pipeline_bound_sps"]) for i, r in zip(x, mine) if r["pipeline_bound_sps"]
        ]
        if pipeline:
            ends = ([i - 0.4 for i, _ in pipeline], [i + 0.4 for i, _ in pipeline])
            ax.hlines([p for _, p in pipeline], *ends, colors="grey", label="pipeline bound")
        ax.set_xticks(list(x), [r["design"] for r in mine], fontsize=7)
        ax.set_title(case, fontsize=9)
    axes[0].set_ylabel("env steps/s (labels: ratio to the black bound)")
    figure.legend(
        *axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=7
    )
    figure.suptitle(f"rollout phase, sync against async; {result['machine']['cpu']}", fontsize=8)
    save(figure, path)


def parse_args(argv):
    """The command line; bad input exits with status 2 and a message naming the flag."""
    parser, add = cli.parser("benchmarks.studies.overlap", __doc__, "--seed --out --scripts-dir")
    add("--step-ms", nargs="+", type=positive_float, help="stand-in step costs (default: 0.1 1 10)")
    add("--policy-ms", type=positive_float, default=1.0, help="stand-in policy's cost on all envs")
    add("--num-envs", type=positive_int, default=8, help="envs in every design")
    add("--async-batch-sizes", nargs="+", type=positive_int, help="default: envs / 2 and envs / 4")
    add("--rounds", type=positive_int, help="alternating rounds (default: 5)")
    add("--seconds", type=positive_float, help="one stand-in block's length (default: 2)")
    add("--skip-atari", action="store_true", help="only the stand-in envs")
    add("--env-id", default="Breakout-v5", help="the Atari game")
    add("--env-threads", type=positive_int, help="envpool's threads, async (default: cores - 1)")
    add("--atari-steps", type=positive_int, help="vector steps of one Atari rollout (default: 128)")
    add("--atari-rollouts", type=positive_int, help="Atari rollouts per block (default: 2)")
    add("--threads", type=positive_int, default=1, help="intra-op threads, here and in the runs")
    add("--compile", action="store_true", help="compile the Atari policy; the scripts too")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto", help="the Atari policy's")
    add("--quick", action="store_true", help="smoke-run defaults (about a minute in all)")
    args = cli.parse(parser, argv, QUICK, FULL)
    # the async script's default: the cores this process may use, less one
    if args.env_threads is None:
        args.env_threads = max(1, len(os.sched_getaffinity(0)) - 1)
    # the async script's default, and in a full run a quarter of the envs too
    if args.async_batch_sizes is None:
        halves = [args.num_envs // 2] + ([] if args.quick else [args.num_envs // 4])
        args.async_batch_sizes = list(dict.fromkeys(b for b in halves if b > 0))
    bad = [b for b in args.async_batch_sizes if b >= args.num_envs or args.num_envs % b]
    if bad:
        envs = args.num_envs
        parser.error(
            f"--async-batch-sizes {bad[0]}: must divide --num-envs ({envs}) and be smaller"
        )
    return args


def main(argv=None):
    """Run both parts, print the tables, write the results; exit status 1 if a script run failed."""
    args = parse_args(argv)
    device = pick_device(args.device)
    torch.set_num_threads(args.threads)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    del settings["scripts_dir"]
    result = dict(machine=machine_info(), device=str(device), settings=settings, atari=None)
    result |= dict(started=datetime.now().isoformat(timespec="seconds"), standin=standin(args))
    if not args.skip_atari:
        note(f"PPO Atari rollout phase: {args.env_id}, {args.num_envs} envs")
        try:
            rows = atari(args, device, args.scripts_dir)
            result["atari"] = dict(
                rows=rows, whole_iteration=whole_iteration(args, args.scripts_dir)
            )
        except BenchmarkError as error:
            note(f"error: {error}")
            return 1
    stem = f"overlap-{datetime.now():%Y%m%d-%H%M%S}"
    return conclude(markdown(result), write_result(result, args.out, stem, markdown, plot))


if __name__ == "__main__":
    sys.exit(main())
