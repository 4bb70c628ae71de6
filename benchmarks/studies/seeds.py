"""Many seeds in one process: the aggregate sps of a seeds script (`leanrl/<algo>_seeds.py`, N runs
as one vmapped program) against the best way to run N seeds of the fastest single-seed script on
this machine, beside the env-only limit of the same N x num_envs envs (docs/performance.md).

    python -m benchmarks.studies.seeds  # every seeds script, N = 1 2 4 8 16, 2 rounds
    python -m benchmarks.studies.seeds --algos dqn --members 1 8 --repeats 3
    python -m benchmarks.studies.seeds --gpu-proxy  # per-member cost of acting and an update
    python -m benchmarks.studies.seeds --quick  # a smoke test of the harness

Per N and round: `seeds` runs the seeds script once per way it runs; `P at once` runs the
single-seed script N times, P processes at a time (each pinned to its share of the cores with
`taskset`), summing a wave's sps; the best P is the baseline. `env only` steps the seeds script's
vector env with random actions. `--gpu-proxy` compiles each seeds learner's acting and update for N
members, times them, and counts their ATen ops, matmuls and inductor kernels: the GPU column is
kernels x `--us-per-kernel` / N, an expectation, not a measurement. Writes
benchmarks/results/seeds[-proxy]-<time>.{json,md,png} (or to --out-dir).
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks import cli, env_limit
from benchmarks.machine import machine_info
from benchmarks.plots import panels, save
from benchmarks.report import machine_line, optional, table, write_result
from benchmarks.run import BenchmarkError, failure, note, result_line
from benchmarks.scripts import load_script

TASKSET = shutil.which("taskset") is not None  # pins a single-seed process to its cores


@dataclass(frozen=True)
class SeedsAlgo:
    """An algorithm's seeds script, the single-seed script it is measured against (its fastest on a
    CPU), the flags of every run of either (per member) under the full and the quick budget, and the
    flags of each way the seeds script runs (each is a row; the best one is compared)."""

    name: str
    script: str
    single: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    seeds_variants: tuple[tuple[str, ...], ...] = ((),)


# SAC and TD3: 5,000 random steps, then 3,000 updates; quick: 1,000, then 200
ACTOR_CRITIC_BUDGETS = (
    ("--env-id", "HalfCheetah-v4", "--total-timesteps", "8000", "--learning-starts", "5000"),
    ("--env-id", "HalfCheetah-v4", "--total-timesteps", "1200", "--learning-starts", "1000"),
)
# adding an algorithm is one line; one whose seeds script is not on disk is skipped with a note
ALGOS = (
    # learning from 10k steps (CleanRL's default), sps over the 20k after it; quick: 1,000 steps,
    # then 100 updates
    SeedsAlgo(
        "dqn",
        "dqn_seeds",
        "dqn_cpu",
        ("--total-timesteps", "30000"),
        ("--total-timesteps", "2000", "--learning-starts", "1000"),
        # a second thread: only on an idle machine
        seeds_variants=(("--threads", "1"), ("--threads", "2")),
    ),
    SeedsAlgo(
        "ppo_continuous_action",
        "ppo_continuous_action_seeds",
        "ppo_continuous_action_cpu",
        ("--env-id", "HalfCheetah-v4", "--total-timesteps", "40960", "--measure-burnin", "5"),
        ("--env-id", "HalfCheetah-v4", "--total-timesteps", "6144", "--measure-burnin", "1")
        + ("--num-steps", "512"),
        # the second thread: in the update, idle envs
        seeds_variants=(("--threads", "1"), ("--threads", "2")),
    ),
    *(
        SeedsAlgo(name, f"{script}_seeds", f"{script}_cpu", *ACTOR_CRITIC_BUDGETS)
        for name, script in (("sac", "sac_continuous_action"), ("td3", "td3_continuous_action"))
    ),
)


def runnable(algos, scripts_dir):
    """The algorithms whose seeds and single-seed scripts are both on disk."""
    ready = []
    for algo in algos:
        missing = [
            f"{n}.py" for n in (algo.script, algo.single) if not (scripts_dir / f"{n}.py").exists()
        ]
        if missing:
            note(f"skipping {algo.name}: missing {', '.join(missing)}")
        else:
            ready.append(algo)
    return ready


def budget(algo, quick):
    return list(algo.quick if quick else algo.full)


def seeds_command(algo, scripts_dir, members, quick, flags):
    script = str(scripts_dir / f"{algo.script}.py")
    return [sys.executable, script, *budget(algo, quick), "--num-seeds", str(members), *flags]


def process_cores(index, at_once, cores):
    """The cores of process `index` of `at_once` processes sharing `cores` cores."""
    if at_once > cores:
        return [index % cores]
    share = cores // at_once
    return list(range(index * share, (index + 1) * share))


def single_command(algo, scripts_dir, seed, quick, cores):
    """One single-seed run and its environment: pinned to `cores`, as many threads."""
    script = str(scripts_dir / f"{algo.single}.py")
    cmd = [sys.executable, script, *budget(algo, quick), "--seed", str(seed)]
    pin = ["taskset", "-c", ",".join(map(str, cores))] if TASKSET else []
    return pin + cmd, {"OMP_NUM_THREADS": str(len(cores))}


def read_summary(cmd, proc):
    """The summary.json of a finished run (its SUMMARY line names it)."""
    line = result_line(cmd, proc, "SUMMARY")
    summary = json.loads(Path(line["summary_file"]).read_text())
    if not isinstance(summary.get("sps"), (int, float)):
        raise failure(cmd, "printed a SUMMARY without a numeric sps (does it end in the burn-in?)")
    return summary


def run_together(commands, timeout, cwd, envs=None):
    """Start `commands` at once (`envs[i]` added to command i's environment) and wait for all."""
    envs = [dict(os.environ, **extra) for extra in envs or [{}] * len(commands)]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    procs = [subprocess.Popen(cmd, env=env, **pipes) for cmd, env in zip(commands, envs)]
    try:
        summaries = []
        for cmd, proc in zip(commands, procs):
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise failure(cmd, f"ran past the {timeout} s timeout") from None
            if proc.returncode != 0:
                raise failure(cmd, f"exited with status {proc.returncode}", stderr)
            summaries.append(read_summary(cmd, subprocess.CompletedProcess(cmd, 0, stdout, stderr)))
        return summaries
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def processes_at_once(members, requested, cores):
    """The process counts P to try for N = `members`."""
    return sorted({p for p in (requested or (1, cores, members)) if 1 <= p <= members})


def waves_sps(summaries, at_once):
    """The aggregate sps of N runs made `at_once` at a time."""
    waves = [summaries[i : i + at_once] for i in range(0, len(summaries), at_once)]
    return sum(len(wave) * sum(s["sps"] for s in wave) for wave in waves) / len(summaries)


def env_only(algo, scripts_dir, members, quick, seconds):
    """The env-only sps of the seeds script's vector env for `members` members."""
    flags = [*budget(algo, quick), "--num-seeds", str(members)]
    return env_limit.measure(scripts_dir / f"{algo.script}.py", flags, seconds)


def add(runs, run, summaries, sps=None):
    """Note a run (its algo, members, repeat and variant) and add it to `runs` with its summaries
    and sps (the one summary's without `sps`)."""
    run |= dict(sps=summaries[0]["sps"] if sps is None else sps, summaries=summaries)
    where = f"{run['algo']} N={run['members']} round {run['repeat'] + 1}"
    note(f"{where}: {run['variant']} {run['sps']:.0f} sps")
    runs.append(run)


def measure(algos, scripts_dir, members_list, processes, repeats, quick, env_seconds, timeout, cwd):
    """Every run, in order (per algorithm, per round, per N: the seeds script, then each P), and the
    env-only limits."""
    cores = os.cpu_count() or 1
    runs, limits = [], {}
    for algo in algos:
        for members in members_list:
            limits[f"{algo.name} {members}"] = env_only(
                algo, scripts_dir, members, quick, env_seconds
            )
        for repeat in range(repeats):
            for members in members_list:
                key = dict(algo=algo.name, members=members, repeat=repeat)
                for flags in algo.seeds_variants:
                    cmd = seeds_command(algo, scripts_dir, members, quick, flags)
                    (summary,) = run_together([cmd], timeout, cwd)
                    add(runs, key | dict(variant=" ".join(["seeds", *flags])), [summary])
                for at_once in processes_at_once(members, processes, cores):
                    summaries = []
                    for first in range(1, members + 1, at_once):
                        wave = range(first, min(first + at_once, members + 1))
                        cores_of = [process_cores(seed - first, at_once, cores) for seed in wave]
                        single = [
                            single_command(algo, scripts_dir, s, quick, c)
                            for s, c in zip(wave, cores_of)
                        ]
                        cmds, envs = zip(*single)
                        summaries += run_together(cmds, timeout, cwd, envs)
                    run = key | dict(variant=f"{at_once} at once")
                    add(runs, run, summaries, waves_sps(summaries, at_once))
    return runs, limits


def rows(runs, limits):
    """Per algorithm and N: the median sps of each way of running the seeds script and of each P,
    the best of either, the ratio of the two bests, the env-only limit, and the seeds runs' mean
    return."""
    table = []
    for algo, members in dict.fromkeys((r["algo"], r["members"]) for r in runs):
        mine = [r for r in runs if (r["algo"], r["members"]) == (algo, members)]
        medians = {}
        for variant in dict.fromkeys(r["variant"] for r in mine):
            medians[variant] = statistics.median(r["sps"] for r in mine if r["variant"] == variant)
        seeds = {variant: sps for variant, sps in medians.items() if variant.startswith("seeds")}
        processes = {variant: sps for variant, sps in medians.items() if variant not in seeds}
        best_seeds = max(seeds, key=seeds.get)
        best = max(processes, key=processes.get) if processes else None
        summaries = [s for r in mine if r["variant"] in seeds for s in r["summaries"]]
        returns = [s["return_mean"] for s in summaries if s["return_mean"] is not None]
        row = dict(algo=algo, members=members, seeds_variants=seeds, best_seeds=best_seeds)
        row |= dict(seeds_sps=seeds[best_seeds], processes_sps=processes, best=best)
        row |= dict(best_sps=processes.get(best), env_only_sps=limits[f"{algo} {members}"]["sps"])
        row["vs_best"] = seeds[best_seeds] / processes[best] if best else None
        table.append(row | dict(return_mean=statistics.fmean(returns) if returns else None))
    return table


def markdown(result):
    settings = result["settings"]
    lines = [
        machine_line(result["machine"]),
        f"Budget: {settings['budget']}, {settings['repeats']} round(s), medians; the P "
        "single-seed processes split "
        f"{settings['cores']} cores, a thread per core (taskset: {settings['taskset']}); started "
        f"{settings['started']}",
        "",
    ]
    rows = [
        f"{r['algo']} | {r['members']} | {r['seeds_sps']:.0f} ({r['best_seeds']}) | "
        f"{r['best'] or 'n/a'} | {optional(r['best_sps'], '.0f')} | "
        f"{optional(r['vs_best'], '.2f', 'x')} | {r['env_only_sps']:.0f} | "
        + ", ".join(
            f"{v}: {sps:.0f}" for v, sps in (r["seeds_variants"] | r["processes_sps"]).items()
        )
        + f" | {optional(r['return_mean'], '.1f')}"
        for r in result["table"]
    ]
    header = "algo | N | seeds sps (best way) | best P at once | its sps | seeds / best | env-only "
    header += "sps | every run (sps) | return"
    return "\n".join(lines + table(header, rows, "lrrrrrrlr")) + "\n"


def plot(result, path):
    """Aggregate sps against N per algorithm: seeds script, best processes, env-only limit."""
    algos = list(dict.fromkeys(r["algo"] for r in result["table"]))
    figure, axes = panels(len(algos), 4.5)
    for ax, algo in zip(axes, algos):
        table = [r for r in result["table"] if r["algo"] == algo]
        members = [r["members"] for r in table]
        ax.plot(members, [r["seeds_sps"] for r in table], "o-", label="one process, N members")
        ax.plot(members, [r["best_sps"] for r in table], "s-", label="N processes, best P at once")
        ax.plot(members, [r["env_only_sps"] for r in table], "k--", label="env only (one process)")
        ax.set(xscale="log", yscale="log", xlabel="N (seeds)", title=algo)
        ax.set_ylabel("env steps per second, all seeds")
        ax.set_xticks(members, [str(n) for n in members])
        ax.legend(fontsize=7)
    save(figure, path)


# --- the GPU proxy
# ----------------------------------------------------------------------------------------------


def dqn_proxy(module, members):
    """DQN's vmapped policy and update for `members` members (CartPole, batch 128)."""
    import torch

    args = module.Args(num_seeds=members)
    learner = module.make_learner(args, 4, 2, list(range(1, members + 1)), torch.device("cpu"))
    policy, update = learner.policy, learner.update
    batch = dict(
        obs=torch.randn(members, args.batch_size, 4),
        next_obs=torch.randn(members, args.batch_size, 4),
        actions=torch.randint(0, 2, (members, args.batch_size)),
        rewards=torch.rand(members, args.batch_size),
        terminations=torch.zeros(members, args.batch_size),
    )
    return {
        "acting": (policy, (torch.randn(members, args.num_envs, 4),)),
        "update": (update, (batch,)),
    }


def actor_critic_proxy(module, members):
    """SAC's or TD3's vmapped torch policy, critic update and actor update for `members` members
    (HalfCheetah's sizes, a batch of 256 per member); the update is the critic's then the actor's,
    as on every policy-delay step."""
    import torch

    n_obs, n_act, batch_size = 17, 6, 256
    args, low, high = (
        module.Args(num_seeds=members),
        -torch.ones(n_act).numpy(),
        torch.ones(n_act).numpy(),
    )
    learner = module.make_learner(
        args, n_obs, n_act, low, high, list(range(1, members + 1)), torch.device("cpu")
    )
    policy, update_critic, update_actor = (
        learner.policy,
        learner.update_critic,
        learner.update_actor,
    )
    columns = dict(obs=n_obs, next_obs=n_obs, actions=n_act, rewards=None, terminations=None)
    batch = {
        key: torch.rand(members, batch_size, *([n] if n else [])) for key, n in columns.items()
    }

    def update(batch):
        return update_critic(batch), update_actor(batch)

    return {
        "acting": (policy, (torch.randn(members, args.num_envs, n_obs),)),
        "update": (update, (batch,)),
    }


def ppo_proxy(module, members):
    """PPO's vmapped torch policy and one minibatch update for `members` members (HalfCheetah's
    sizes, CleanRL's minibatch of 64 per member: 2048 steps in 32 minibatches); an iteration
    makes 320 such updates."""
    import torch

    n_obs, n_act = 17, 6
    args = module.Args(num_seeds=members)
    learner = module.make_learner(
        args, n_obs, n_act, list(range(1, members + 1)), torch.device("cpu")
    )
    policy, update = learner.policy, learner.update
    size = (members, args.num_steps * args.num_envs // args.num_minibatches)
    mb = {key: torch.randn(*size) for key in ("logprobs", "values", "advantages", "returns")}
    mb |= dict(
        obs=torch.randn(*size, n_obs), actions=torch.randn(*size, n_act), valid=torch.ones(*size)
    )
    return {
        "acting": (policy, (torch.randn(members * args.num_envs, n_obs),)),
        "update": (update, (mb,)),
    }


# (module, N) -> {name: (fn, inputs)}
PROXIES = {
    "dqn": dqn_proxy,
    "ppo_continuous_action": ppo_proxy,
    "sac": actor_critic_proxy,
    "td3": actor_critic_proxy,
}
MATMULS = ("aten.mm.", "aten.bmm.", "aten.addmm.", "aten.baddbmm.")


def time_calls(fn, inputs, seconds):
    """Microseconds per call of `fn(*inputs)`: the median of 5 timed blocks of about `seconds` / 5
    each (at least a call each), after 3 calls (a compile, a warm-up) of which the last sizes
    the blocks."""
    for _ in range(3):
        start = time.perf_counter()
        fn(*inputs)
    per_block = max(1, int(seconds / 5 / (time.perf_counter() - start)))
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(per_block):
            fn(*inputs)
        blocks.append((time.perf_counter() - start) / per_block * 1e6)
    return statistics.median(blocks)


def graph_size(fn, inputs, compiled):
    """The ATen ops of one call of `fn` (traced with make_fx, unfused), the matmuls among them and,
    if `compiled`, the kernels inductor generates for the rest (a compile with the FX graph
    cache off; None otherwise)."""
    import torch
    from torch._inductor import config, metrics
    from torch.fx.experimental.proxy_tensor import make_fx

    ops = [
        str(node.target) for node in make_fx(fn)(*inputs).graph.nodes if node.op == "call_function"
    ]
    ops = [
        op
        for op in ops
        if not op.startswith(
            ("aten.view", "aten._unsafe_view", "aten.expand", "aten.transpose", "<built-in")
        )
    ]
    fused = None
    if compiled:
        with config.patch(fx_graph_cache=False):
            metrics.reset()
            torch._dynamo.reset()
            torch.compile(fn, fullgraph=True)(*inputs)
            fused = metrics.generated_kernel_count
    return {
        "aten_ops": len(ops),
        "matmuls": sum(op.startswith(MATMULS) for op in ops),
        "fused_kernels": fused,
    }


def flops(fn, inputs):
    """The floating-point operations of one call of `fn(*inputs)` (FlopCounterMode)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*inputs)
    return counter.get_total_flops()


def matmul_rate(seconds):
    """This CPU's fp32 matmul rate on the current threads, in FLOP per microsecond."""
    import torch

    a = torch.randn(8, 256, 256)
    return 2 * 8 * 256**3 / time_calls(torch.bmm, (a, a), seconds)


def proxy(algos, scripts_dir, members_list, compiled, seconds, us_per_kernel):
    """Per algorithm, function and N: microseconds per call and per member, the graph's size, and
    how close the call comes to the matmul bound (its FLOPs at the rate of a large bmm timed
    just after it, over its time)."""
    import torch

    torch.set_num_threads(1)  # as the scripts run on a CPU
    table = []
    for algo in algos:
        module = load_script(algo.script, scripts_dir)
        for members in members_list:
            for name, (fn, inputs) in PROXIES[algo.name](module, members).items():
                size = graph_size(fn, inputs, compiled)
                torch._dynamo.reset()
                timed = torch.compile(fn, fullgraph=True) if compiled else fn
                us = time_calls(timed, inputs, seconds)
                flop, rate = flops(fn, inputs), matmul_rate(seconds)
                kernels = size["matmuls"] + size["fused_kernels"] if compiled else size["aten_ops"]
                gpu = kernels * us_per_kernel
                note(
                    f"{algo.name} {name} N={members}: {us:.0f} us a call, {us / members:.1f} "
                    f"each; {kernels} kernels; "
                    f"matmul bound {flop / rate / us:.2f} of the time"
                )
                table.append(
                    dict(
                        algo=algo.name,
                        function=name,
                        members=members,
                        us_per_call=us,
                        us_per_member=us / members,
                        **size,
                        kernels=kernels,
                        gpu_us_per_member_unmeasured=gpu / members,
                        mflop_per_member=flop / members / 1e6,
                        matmul_gflops=rate / 1e3,
                        matmul_bound_share=flop / rate / us,
                    )
                )
    return table


def proxy_markdown(result):
    settings = result["settings"]
    lines = [
        machine_line(result["machine"]),
        f"Compiled: {settings['compiled']}, one thread; the GPU column is unmeasured: kernels x "
        f"{settings['us_per_kernel']} us / N; started {settings['started']}",
        "",
    ]
    rows = [
        f"{r['algo']} | {r['function']} | {r['members']} | {r['us_per_call']:.0f} | "
        f"{r['us_per_member']:.1f} | {optional(r.get('mflop_per_member'), '.2f')} | "
        f"{optional(r.get('matmul_bound_share'), '.2f')} | {r['aten_ops']} | {r['matmuls']} | "
        f"{optional(r['fused_kernels'], 'd')} | {r['kernels']} | "
        f"{r['gpu_us_per_member_unmeasured']:.2f}"
        for r in result["table"]
    ]
    header = "algo | function | N | us a call | us per member | MFLOP per member | matmul bound / "
    header += "time | ATen ops | matmuls | fused kernels | kernels | GPU us per member (unmeasured)"
    return "\n".join(lines + table(header, rows, "ll" + "r" * 10)) + "\n"


def proxy_plot(result, path):
    """Microseconds per member against N (log-log), a line per algorithm and function."""
    figure, (ax,) = panels(1, 6, 4)
    for index, key in enumerate(dict.fromkeys((r["algo"], r["function"]) for r in result["table"])):
        table = [r for r in result["table"] if (r["algo"], r["function"]) == key]
        members, name = [r["members"] for r in table], " ".join(key)
        keys = ("us_per_member", "gpu_us_per_member_unmeasured")
        cpu, gpu = ([r[k] for r in table] for k in keys)
        ax.plot(members, cpu, "o-", color=f"C{index}", label=f"{name}, this CPU")
        ax.plot(members, gpu, ":", color=f"C{index}", label=f"{name}, GPU (unmeasured)")
    ax.set(xscale="log", yscale="log", xlabel="N (members)", ylabel="microseconds per member")
    ax.legend(fontsize=7)
    save(figure, path)


def parse_args(argv):
    names = [algo.name for algo in ALGOS]
    parser, add = cli.parser("benchmarks.studies.seeds", __doc__, "--scripts-dir --out-dir")
    add("--algos", nargs="+", choices=names, default=names, help="algorithms (default: all)")
    add("--members", type=int, nargs="+", help="N (default 1 2 4 8 16; proxy 1 8 32 128)")
    add("--processes", type=int, nargs="+", help="single-seed processes at once (1, cores, N)")
    add("--repeats", type=int, default=2, help="rounds of every run")
    add("--quick", action="store_true", help="tiny budgets, N = 1 2, one round")
    add("--env-seconds", type=float, default=2.0, help="how long to time each env alone")
    add("--gpu-proxy", action="store_true", help="time acting and the update per member instead")
    add("--no-compile", action="store_true", help="proxy: time eagerly, no kernel count")
    add("--proxy-seconds", type=float, default=2.0, help="proxy: timing per function and N")
    add("--us-per-kernel", type=float, default=3.0, help="proxy: GPU cost per kernel")
    add("--timeout", type=float, default=1800, help="seconds one run may take")
    args = parser.parse_args(argv)
    if args.members is None:
        args.members = (
            [1, 2] if args.quick else [1, 8, 32, 128] if args.gpu_proxy else [1, 2, 4, 8, 16]
        )
    if args.quick:
        args.repeats, args.env_seconds, args.proxy_seconds = 1, 0.2, 0.2
    if min(args.members) < 1 or args.repeats < 1 or min(args.processes or [1]) < 1:
        parser.error("--members, --processes and --repeats must be >= 1")
    return args


def main(argv=None):
    """Run the benchmark (or the GPU proxy), print the table, write the results."""
    args = parse_args(argv)
    algos = runnable([algo for algo in ALGOS if algo.name in args.algos], args.scripts_dir)
    if args.gpu_proxy:
        algos = [algo for algo in algos if algo.name in PROXIES]
    if not algos:
        note("benchmark stopped: no algorithm has its scripts on disk")
        return 1
    started = datetime.now()
    budget = "quick" if args.quick else "full"
    settings = dict(members=args.members, started=started.isoformat(), budget=budget)
    result = dict(settings=settings, machine=machine_info())
    if args.gpu_proxy:
        compiled, us = not args.no_compile, args.us_per_kernel
        settings |= dict(compiled=compiled, us_per_kernel=us)
        result["table"] = proxy(
            algos, args.scripts_dir, args.members, compiled, args.proxy_seconds, us
        )
        stem, render, draw = f"seeds-proxy-{started:%Y%m%d-%H%M%S}", proxy_markdown, proxy_plot
    else:
        settings |= dict(repeats=args.repeats, processes=args.processes, cores=os.cpu_count())
        settings["taskset"] = TASKSET
        runs_dir = args.out_dir / "runs"  # the runs' run folders
        runs_dir.mkdir(parents=True, exist_ok=True)
        flags = (args.members, args.processes, args.repeats, args.quick, args.env_seconds)
        try:
            runs, limits = measure(algos, args.scripts_dir, *flags, args.timeout, runs_dir)
        except BenchmarkError as error:
            note(f"benchmark stopped: {error}")
            return 1
        result |= dict(env_limits=limits, table=rows(runs, limits), runs=runs)
        stem, render, draw = f"seeds-{started:%Y%m%d-%H%M%S}", markdown, plot
    return cli.conclude(render(result), write_result(result, args.out_dir, stem, render, draw))


if __name__ == "__main__":
    sys.exit(main())
