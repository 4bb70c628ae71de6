"""When a scan beats a loop: the forward and backward pass of PPO's recurrent memory over sequences
of T steps (docs/memory.md).

    python -m benchmarks.studies.memory  # T 16 64 256 1024, batch 8 and 64 (~6 min here)
    python -m benchmarks.studies.memory --candidates  # also every scan tried, on bare tensors
    python -m benchmarks.studies.memory --quick  # a smoke run
    python -m benchmarks.studies.memory --learning  # LSTM, minGRU, no memory: 5 seeds
    python -m benchmarks.studies.memory --tasks --jobs 2  # the three on five POMDPs (~25 min)
    python -m benchmarks.studies.memory --tasks repeat-first --seeds 1 2

Variants (128 hidden units, one intra-op thread): `lstm-loop` (ppo_lstm.py), `mingru-loop`
(ppo_mingru.py), `mingru-scan` (ppo_mingru_torchcompile.py's chunked scan) and
`mingru-scan-compiled`. Each minGRU variant's features and gradients must equal `mingru-loop`'s
(max |a - b| <= atol + rtol max |b|) or the run stops with exit status 1; then `--rounds` rounds
each time one block per variant, the order rotated. `--candidates` times every scan tried for the
twin on a, b [T, B, 128]: Hillis-Steele, torch's prototype `associative_scan`, the chunked scan and
log-space cumulative sums. `--tasks` trains the three agents on each POMDP of TASKS (velocity-hidden
CartPole and four of POPGym's; requirements/requirements-popgym.txt) against a random policy.
Writes benchmarks/results/memory[-tasks]-<time>.{json,md,png} (or to `--out`).
"""

import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import gymnasium as gym
import torch
from torch._higher_order_ops.associative_scan import associative_scan

from benchmarks import cli
from benchmarks.cli import conclude, pick_device, positive_float, positive_int
from benchmarks.machine import machine_info
from benchmarks.plots import panels, save
from benchmarks.processes import note
from benchmarks.report import machine_line, optional, table, write_result
from benchmarks.scripts import load_script
from benchmarks.studies.inference import Variant, calls_per_block, time_block, warm_up

FULL = {"steps": [16, 64, 256, 1024], "batch_sizes": [8, 64], "rounds": 5, "block_ms": 200.0}
QUICK = {"steps": [8, 16], "batch_sizes": [2], "rounds": 2, "block_ms": 5.0}
HIDDEN, N_OBS, START_PROB = 128, 2, 0.05
LEARNING = (
    ("lstm", "ppo_lstm", ()),
    ("mingru", "ppo_mingru", ()),
    ("mingru-no-memory", "ppo_mingru", ("--no-memory",)),
)
# `--tasks`: each POMDP's env id, env steps per run and flags for every agent (the one place budgets
# live). POPGym's ids need requirements/requirements-popgym.txt. Budgets: under a minute per run of
# an eager script on an idle 2-core machine (one thread per run), where the memory agents' curves
# have left no memory's behind.
TASKS = {
    # the scripts' default: positions only (0 2)
    "cartpole-velocity-hidden": ("CartPole-v1", 40_960, ()),
    # recall the card 4 steps back
    "repeat-previous": ("popgym:popgym-RepeatPreviousEasy-v0", 40_960, ()),
    # control, hidden state
    "position-only-cartpole": ("popgym:popgym-PositionOnlyCartPoleEasy-v0", 40_960, ()),
    # noisy control
    "noisy-position-only-cartpole": ("popgym:popgym-NoisyPositionOnlyCartPoleEasy-v0", 40_960, ()),
    # a card game: is the next card higher?
    "higher-lower": ("popgym:popgym-HigherLowerEasy-v0", 20_480, ()),
    # not in the default set: the LSTM took 35k-100k+ steps to start recalling here (seed-dependent)
    # recall the first card of 51
    "repeat-first": ("popgym:popgym-RepeatFirstEasy-v0", 102_400, ()),
}
DEFAULT_TASKS = tuple(task for task in TASKS if task != "repeat-first")
# the agents of `--tasks` (the eager scripts, as `--learning`), and the optimized twins whose
# `--compile` sps is shown
TASK_AGENTS = (
    ("lstm", "ppo_lstm", ()),
    ("mingru", "ppo_mingru", ()),
    ("no-memory", "ppo_mingru", ("--no-memory",)),
)
COMPILED = (("lstm", "ppo_lstm_torchcompile"), ("mingru", "ppo_mingru_torchcompile"))
RANDOM_EPISODES = 200


# ---- the scan candidates, on bare tensors: each maps (a, b, h0) to the states h_1..h_T ----


def hillis_steele_scan(a, b, h0):
    """log2(T) rounds; with shift s each (a_t, b_t) composes with the pair s before."""
    b = torch.cat([(a[0] * h0 + b[0])[None], b[1:]])
    shift = 1
    while shift < len(a):
        b = torch.cat([b[:shift], a[shift:] * b[:-shift] + b[shift:]])
        a = torch.cat([a[:shift], a[shift:] * a[:-shift]])
        shift *= 2
    return b


def compose(first, second):
    """(a1, b1) o (a2, b2) = (a1 * a2, a2 * b1 + b2): apply the first step, then the second."""
    return first[0] * second[0], second[0] * first[1] + second[1]


def prototype_scan(a, b, h0):
    """torch's prototype associative scan, the only mode that runs on a CPU (a work-efficient
    recursion of vmapped combines)."""
    b = torch.cat([(a[0] * h0 + b[0])[None], b[1:]])
    return associative_scan(compose, (a, b), dim=0, combine_mode="generic")[1]


def log_space_scan(a, b, h0):
    """h_t = exp(A_t + logcumsumexp(log b - A)_t) with A = cumsum(log a), in float64 (A reaches
    hundreds at T = 1024, too far for float32's precision). An episode start is log a_t = -60: what
    came before is scaled by e^-60, far below float64's precision of a sum (and float32's). It needs
    b > 0 (minGRU's log-space form keeps its candidate positive for this)."""
    b = torch.cat([(a[0] * h0 + b[0])[None], b[1:]]).double()
    log_a = torch.where(a > 0, a.double().clamp_min(1e-300).log(), -60.0)
    cumulative = log_a.cumsum(0)
    return (cumulative + (b.log() - cumulative).logcumsumexp(0)).exp().float()


def candidates(loop, chunked):
    """The candidate scans by name: (function, compile it too)."""
    return {
        "loop": (loop, False),
        "hillis-steele": (hillis_steele_scan, True),
        "prototype-associative-scan": (prototype_scan, False),
        "chunked": (chunked, True),
        "log-space": (log_space_scan, False),
    }


# ---- inputs, variants and checks ----


def sequence_inputs(steps, batch, seed, device):
    """Observations [T, B, N_OBS] and episode starts [T, B] from `seed`."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(steps, batch, N_OBS, generator=g)
    done = (torch.rand(steps, batch, generator=g) < START_PROB).float()
    return obs.to(device), done.to(device)


def model_variant(name, agent, get_states, state, obs, done, width, seed):
    """A `Variant` whose call runs `get_states` over the sequence and the backward pass of a fixed
    linear loss of its features (`width` of them per step) to `agent`'s parameters; it returns the
    features and the gradients."""
    # the heads are unused
    params = [p for n, p in agent.named_parameters() if not n.startswith(("actor", "critic"))]
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(*done.shape, width, generator=g).to(done.device)

    def forward_backward(_):
        features, _ = get_states(obs, state, done)
        grads = torch.autograd.grad((features * weights).sum(), params)
        return [features.detach(), *grads]

    return Variant(name, forward_backward, warmup=3)


def model_variants(scripts, steps, batch, seed, device, backend):
    """The four variants at one (T, batch): the LSTM from ppo_lstm.py, the minGRU of ppo_mingru.py
    and of its twin with the same weights."""
    obs, done = sequence_inputs(steps, batch, seed, device)
    torch.manual_seed(seed)
    lstm = scripts["ppo_lstm"].Agent(N_OBS, 2, HIDDEN, device=device)
    mingru = scripts["ppo_mingru"].Agent(N_OBS, 2, HIDDEN, device=device)
    twin = scripts["ppo_mingru_torchcompile"].Agent(N_OBS, 2, HIDDEN, device=device)
    twin.load_state_dict(mingru.state_dict())
    g = torch.Generator().manual_seed(seed + 1)
    state = torch.randn(2, batch, mingru.state_size, generator=g).to(device)  # two layers' h
    lstm_state = tuple(torch.randn(batch, HIDDEN, generator=g).to(device) for _ in range(2))
    compiled = torch.compile(twin.get_states, backend=backend)
    # features: the LSTM's outputs; the minGRU's tanh layer after it
    shared = dict(state=state, obs=obs, done=done, width=mingru.width, seed=seed)
    return [
        model_variant("lstm-loop", lstm, lstm.get_states, lstm_state, obs, done, HIDDEN, seed),
        model_variant("mingru-loop", mingru, mingru.get_states, **shared),
        model_variant("mingru-scan", twin, twin.get_states, **shared),
        model_variant("mingru-scan-compiled", twin, compiled, **shared),
    ]


def candidate_variants(scripts, steps, batch, seed, device, backend):
    """Every candidate scan, eager and (where marked) compiled, on bare a, b [T, B, HIDDEN]."""
    g = torch.Generator().manual_seed(seed)
    keep = (torch.rand(steps, batch, 1, generator=g) >= START_PROB).float().to(device)
    a_raw = torch.rand(steps, batch, HIDDEN, generator=g).to(device).requires_grad_()
    # > 0 for log-space
    b = (torch.rand(steps, batch, HIDDEN, generator=g) + 0.01).to(device).requires_grad_()
    h0 = torch.rand(batch, HIDDEN, generator=g).to(device).requires_grad_()
    weights = torch.randn(steps, batch, HIDDEN, generator=g).to(device)
    variants = []
    loop = scripts["ppo_mingru"].linear_recurrence
    chunked = scripts["ppo_mingru_torchcompile"].linear_recurrence
    for name, (scan, compiles) in candidates(loop, chunked).items():
        compiled = [(torch.compile(scan, backend=backend), f"{name}-compiled")] if compiles else []
        for fn, label in [(scan, name), *compiled]:

            def forward_backward(_, fn=fn):
                h = fn(a_raw * keep, b, h0)
                return [h.detach(), *torch.autograd.grad((h * weights).sum(), (a_raw, b, h0))]

            variants.append(Variant(label, forward_backward, warmup=3))
    return variants


def difference(got, want, rtol, atol):
    """(ok, worst relative difference) of two lists of tensors."""
    ok, worst = True, 0.0
    for x, y in zip(got, want, strict=True):
        err, scale = float((x - y).abs().max()), float(y.abs().max())
        ok &= err <= atol + rtol * scale
        worst = max(worst, err / (scale + atol))
    return ok, worst


def check_against(reference, variants, rtol, atol):
    """{name: (ok, worst)} of each variant's outputs and gradients against `reference`."""
    want = reference.fn(None)
    return {v.name: difference(v.fn(None), want, rtol, atol) for v in variants}


# ---- timing ----


def bench_cell(variants, reference, steps, batch, args, cuda, fatal):
    """Warm up, check and time every variant at one (T, batch); returns one row per variant."""
    setup = {v.name: warm_up(v, None, cuda) for v in variants}
    compared = [v for v in variants if v.name != "lstm-loop"]
    checks = check_against(reference, compared, args.rtol, args.atol)
    failed = []
    for name, (ok, worst) in checks.items():
        if not ok:
            tolerance = f"(rtol {args.rtol:g}, atol {args.atol:g})"
            note(
                f"check failed: T {steps} batch {batch} {name}: outputs or gradients differ from "
                f"{reference.name}'s by {worst:.3g} of their scale {tolerance}"
            )
            if fatal:
                sys.exit(1)
            failed.append(dict(steps=steps, batch=batch, variant=name))
            failed[-1]["check"] = {"ok": False, "diff": worst}
    variants = [v for v in variants if v.name not in {row["variant"] for row in failed}]
    once = {v.name: statistics.median(time_block(v.fn, None, 2, cuda)) for v in variants}
    calls = {name: calls_per_block(s, args.block_ms / 1e3, 1, 1000) for name, s in once.items()}
    latencies = {v.name: [] for v in variants}
    with torch.compiler.set_stance("fail_on_recompile"):
        for r in range(args.rounds):
            k = r % len(variants)
            for v in variants[k:] + variants[:k]:
                latencies[v.name] += time_block(v.fn, None, calls[v.name], cuda)
    base = "mingru-loop" if "mingru-loop" in latencies else "loop"
    rows = []
    for v in variants:
        times = latencies[v.name]
        quantiles = statistics.quantiles(times, n=10, method="inclusive")
        rows.append(dict(steps=steps, batch=batch, variant=v.name, calls=len(times)))
        rows[-1] |= dict(median_ms=statistics.median(times) * 1e3, setup_s=setup[v.name])
        rows[-1] |= dict(p10_ms=quantiles[0] * 1e3, p90_ms=quantiles[-1] * 1e3)
        check = checks.get(v.name)
        rows[-1]["check"] = {"ok": check[0], "diff": check[1]} if check else None
    base_median = next(row["median_ms"] for row in rows if row["variant"] == base)
    for row in rows:
        row["speedup_vs_loop"] = base_median / row["median_ms"]
    return rows + failed


def run_grid(kind, scripts, args, device):
    """Every (T, batch) cell of `kind` ("models" or "candidates")."""
    build = model_variants if kind == "models" else candidate_variants
    rows = []
    for batch in args.batch_sizes:
        for steps in args.steps:
            note(f"{kind}: T {steps} batch {batch}")
            torch._dynamo.reset()
            variants = build(scripts, steps, batch, args.seed, device, args.backend)
            reference = next(v for v in variants if v.name in ("mingru-loop", "loop"))
            cuda = device.type == "cuda"
            rows += bench_cell(variants, reference, steps, batch, args, cuda, kind == "models")
    return rows


# ---- learning at equal steps ----


def late_return_mean(summary):
    """The mean return of the episodes that ended in the second half of the run."""
    late = [r for step, _, r in summary["curve"] if step > summary["total_timesteps"] // 2]
    return sum(late) / len(late) if late else None


def final_return_mean(summary):
    """The mean return of the episodes that ended in the last tenth of the run (its final return);
    of the last 20 (the summary's return_mean) if none did."""
    final = [r for step, _, r in summary["curve"] if step > summary["total_timesteps"] * 0.9]
    return sum(final) / len(final) if final else summary["return_mean"]


def learning_run(script, flags, steps, seed, scripts_dir):
    """One training run of `script`: its late mean return, return_mean and sps."""
    cmd = [sys.executable, str(Path(scripts_dir) / f"{script}.py")]
    cmd += ["--total-timesteps", str(steps), "--seed", str(seed), *flags]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    line = next((line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")), None)
    if proc.returncode != 0 or line is None:
        note(f"{' '.join(cmd)} failed with status {proc.returncode}: {proc.stderr.strip()[-300:]}")
        sys.exit(1)
    summary = json.loads(line.removeprefix("SUMMARY "))
    with open(summary["summary_file"]) as f:
        summary = json.load(f)
    found = dict(late_return_mean=late_return_mean(summary), sps=summary["sps"])
    return found | dict(
        final_return_mean=final_return_mean(summary), return_mean=summary["return_mean"]
    )


def learning(args):
    """Each of LEARNING's agents for `--learning-steps` steps, every seed, alternating."""
    rows = []
    for seed in args.seeds:
        for name, script, flags in LEARNING:
            note(f"learning: {name} seed {seed}")
            found = learning_run(script, flags, args.learning_steps, seed, args.scripts_dir)
            rows.append(dict(agent=name, script=script, flags=list(flags), seed=seed) | found)
    return rows


# ---- POMDP tasks: the three agents at each task's budget, a random policy for scale ----


def random_return(env_id, episodes, seed):
    """The mean return of `episodes` episodes of `env_id` played with uniformly random actions."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        episodic_return, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            episodic_return += float(reward)
            done = terminated or truncated
        returns.append(episodic_return)
    env.close()
    return statistics.fmean(returns)


def task_runs(args):
    """Every (task, seed, agent) run, `--jobs` at a time (each run one thread: returns do not
    depend on timing)."""
    jobs = [
        (task, seed, *agent) for task in args.tasks for seed in args.seeds for agent in TASK_AGENTS
    ]

    def run(job):
        task, seed, agent, script, flags = job
        # a run folder per agent: two runs of one script, seed and task started in the same second
        # share a name
        env_id, steps, extra = TASKS[task]
        flags = ("--env-id", env_id, "--exp-name", f"{script}-{agent}", *extra, *flags)
        note(f"tasks: {task} {agent} seed {seed}")
        result = learning_run(script, flags, args.task_steps or steps, seed, args.scripts_dir)
        return dict(task=task, agent=agent, script=script, flags=list(flags), seed=seed) | result

    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run, job) for job in jobs]
        try:
            return [future.result() for future in futures]
        # a failed run (exit status 1) or Ctrl-C: the runs not started yet never start
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def compiled_sps(args):
    """{agent: sps} of each optimized twin with `--compile`, one run at a time."""
    sps = {}
    for agent, script in COMPILED:
        note(f"tasks: {script} --compile, {args.compiled_steps} steps")
        run = learning_run(script, ("--compile",), args.compiled_steps, args.seed, args.scripts_dir)
        sps[agent] = run["sps"]
    return sps


def task_table(rows, randoms):
    """{task: {agent: statistics}}: the final return's mean, spread (sample standard deviation, 0
    for one seed), the seeds' values, and the fraction of the way from the random policy's
    return to the best agent's mean."""
    table = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        cells = {}
        for agent, _, _ in TASK_AGENTS:
            mine = [r for r in rows if r["task"] == task and r["agent"] == agent]
            values = [r["final_return_mean"] for r in mine]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            sps = [r["sps"] for r in mine if r["sps"] is not None]
            sps = statistics.median(sps) if sps else None  # None: no run outlasted its burn-in
            cells[agent] = dict(
                mean=statistics.fmean(values), spread=spread, values=values, sps=sps
            )
        best = max(c["mean"] for c in cells.values())
        for cell in cells.values():
            gap = best - randoms[task]
            cell["of_best"] = (cell["mean"] - randoms[task]) / gap if gap > 0 else None
        table[task] = cells
    return table


def tasks(args):
    """The `--tasks` result: random returns, every run, the table, the compiled twins' sps."""
    randoms = {
        task: random_return(TASKS[task][0], RANDOM_EPISODES, args.seed) for task in args.tasks
    }
    rows = task_runs(args)
    found = dict(random=randoms, runs=rows, table=task_table(rows, randoms))
    return found | {"compiled_sps": compiled_sps(args) if args.compiled_steps else {}}


def tasks_markdown(result):
    settings, found = result["settings"], result["tasks"]
    agents = [agent for agent, _, _ in TASK_AGENTS]
    seeds = " ".join(map(str, settings["seeds"]))
    lines = [
        f"{machine_line(result['machine'])}; started {result['started']}, {settings['jobs']} "
        "run(s) at a time",
        "",
        "Final return (mean of the episodes that ended in the last tenth of each run, of the last "
        f"20 if none did) over seeds {seeds}: mean ± standard deviation, [fraction of the way from "
        f"random to the best of the three]; random: uniformly random actions, {RANDOM_EPISODES} "
        "episodes",
        "",
    ]
    rows, speeds = [], []
    for task, cells in found["table"].items():
        env_id, steps = TASKS[task][:2]
        rows.append([task, env_id, str(settings["task_steps"] or steps)])
        rows[-1] += [f"{found['random'][task]:.3g}"] + [
            f"{c['mean']:.3g} ± {c['spread']:.2g} [{optional(c['of_best'], '.2f')}]"
            for c in map(cells.get, agents)
        ]
        speeds.append([task] + [optional(cells[a]["sps"], ".0f") for a in agents])
    lines += table(["task", "env id", "env steps", "random", *agents], rows, "llrr" + "r" * 3)
    lines += ["", "Speed, env steps per second after burn-in (each eager run's sps: median over "]
    lines[-1] += "its task's runs)"
    lines += ["", *table(["task", *agents], speeds, "lrrr")]
    steps = settings["compiled_steps"]
    for agent, sps in found["compiled_sps"].items():
        twin = dict(COMPILED)[agent]
        lines.append(f"\n{twin} --compile, cartpole-velocity-hidden, {steps} steps: {sps:.0f} sps")
    return "\n".join(lines) + "\n"


def tasks_plot(result, path):
    """One panel per task: each agent's final return per seed (dots) and mean ± spread (a bar from
    random's return, the dashed line)."""
    found = result["tasks"]
    agents = [agent for agent, _, _ in TASK_AGENTS]
    fig, axes = panels(len(found["table"]), 3.2, 3.6)
    for ax, (task, cells) in zip(axes, found["table"].items()):
        for x, agent in enumerate(agents):
            cell = cells[agent]
            random = found["random"][task]  # bars rise (or fall) from the random policy's return
            bar = dict(bottom=random, yerr=cell["spread"], color=f"C{x}", alpha=0.6, capsize=3)
            ax.bar(x, cell["mean"] - random, **bar)
            ax.plot([x] * len(cell["values"]), cell["values"], "k.", markersize=4)
        ax.axhline(found["random"][task], color="gray", linestyle="--", label="random")
        ax.set_xticks(range(len(agents)), agents, fontsize=7)
        ax.set_title(task, fontsize=8)
        ax.legend(fontsize=6)
    fig.suptitle(
        f"final return, seeds {' '.join(map(str, result['settings']['seeds']))}; "
        f"{result['machine']['cpu']}",
        fontsize=8,
    )
    save(fig, path)


# ---- output ----


def cell_table(rows, title):
    """Markdown: per (T, batch), each variant's median ms [p10-p90] and its ratio."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lines = []
    for key in dict.fromkeys((r["batch"], r["steps"]) for r in rows):
        cells = {r["variant"]: r for r in rows if (r["batch"], r["steps"]) == key}
        lines.append([str(key[1]), str(key[0])])
        lines[-1] += [
            f"{c['median_ms']:.3g} [{c['p10_ms']:.3g}-{c['p90_ms']:.3g}] "
            f"({c['speedup_vs_loop']:.2f}x)"
            if "median_ms" in c
            else f"not exact: off by {c['check']['diff']:.2g} of the scale"
            for c in (cells[v] for v in variants)
        ]
    return [title, "", *table(["T", "batch", *variants], lines, "ll" + "l" * len(variants))]


def learning_table(rows, steps):
    """Markdown: each run's second-half mean return, per agent and seed, and the mean."""
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    lines = []
    for agent in dict.fromkeys(r["agent"] for r in rows):
        late = {r["seed"]: r["late_return_mean"] for r in rows if r["agent"] == agent}
        values = [late[s] for s in seeds]
        lines.append([agent, *(f"{v:.1f}" for v in [*values, statistics.mean(values)])])
    header = ["agent", *(f"seed {s}" for s in seeds), "mean"]
    return [
        f"Learning, velocity-hidden CartPole-v1, {steps} env steps each: mean return of the "
        "episodes that ended in the second half of the run",
        "",
        *table(header, lines, "l" * len(header)),
    ]


def markdown(result):
    settings, timed = result["settings"], result["models"] or result["candidates"]
    rounds = f"; {settings['rounds']} alternating rounds of blocks of ~{settings['block_ms']:g} ms"
    lines = [
        f"{machine_line(result['machine'])}; device {result['device']}, {settings['threads']} "
        "intra-op thread(s)",
        f"Started {result['started']}" + (rounds if timed else ""),
        "",
    ]
    what = " ms: median [p10-p90] (speed-up over "
    if result["models"]:
        title = f"Forward + backward of the sequence model,{what}mingru-loop)"
        lines += cell_table(result["models"], title) + [""]
    if result["candidates"]:
        title = f"Scan candidates on bare a, b (forward + backward),{what}the loop)"
        lines += cell_table(result["candidates"], title) + [""]
    if result["learning"]:
        lines += learning_table(result["learning"], settings["learning_steps"]) + [""]
    return "\n".join(lines)


def plot(result, path):
    """Median time against T (log-log), with p10-p90 bars; one panel per batch size and table."""
    cells = [
        (kind, batch)
        for kind in ("models", "candidates")
        if result[kind]
        for batch in dict.fromkeys(r["batch"] for r in result[kind])
    ]
    fig, axes = panels(len(cells), 5, 4)
    for ax, (kind, batch) in zip(axes, cells):
        rows = [r for r in result[kind] if r["batch"] == batch and "median_ms" in r]
        for variant in dict.fromkeys(r["variant"] for r in rows):
            mine = [r for r in rows if r["variant"] == variant]
            ax.errorbar(
                [r["steps"] for r in mine],
                [r["median_ms"] for r in mine],
                marker="o",
                label=variant,
                yerr=[
                    [r["median_ms"] - r["p10_ms"] for r in mine],
                    [r["p90_ms"] - r["median_ms"] for r in mine],
                ],
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(
            title=f"{'sequence model' if kind == 'models' else 'bare scan'}, batch {batch}",
            xlabel="T (steps)",
            ylabel="forward + backward (ms)",
        )
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['device']}, {result['machine']['cpu']}", fontsize=8)
    save(fig, path)


def parse_args(argv):
    """The command line; bad input exits with status 2 and a message naming the flag."""
    common = "--backend --device --seed --out --scripts-dir"
    parser, add = cli.parser("benchmarks.studies.memory", __doc__, common)
    add("--steps", nargs="+", type=positive_int, help="lengths T (default: 16 64 256 1024)")
    add("--batch-sizes", nargs="+", type=positive_int, help="sequences per batch (default: 8 64)")
    add("--rounds", type=positive_int, help="alternating rounds (default: 5)")
    add("--block-ms", type=positive_float, help="one block's length (default: 200)")
    add("--threads", type=positive_int, default=1, help="intra-op threads on a CPU")
    add("--candidates", action="store_true", help="also time every scan candidate")
    add("--no-models", dest="models", action="store_false", default=None, help="skip the models")
    add("--learning", action="store_true", help="also train the agents at equal steps")
    add("--learning-steps", type=positive_int, default=61440, help="steps of a learning run")
    add("--tasks", nargs="*", choices=list(TASKS), help="train on these POMDPs (none: the default)")
    add("--jobs", type=positive_int, default=1, help="--tasks runs at a time (each one thread)")
    add("--task-steps", type=positive_int, help="steps of every --tasks run (default: the task's)")
    add("--compiled-steps", type=int, default=30720, help="steps of each compiled twin's run")
    add("--seeds", nargs="+", type=int, help="learning and task seeds (default: 1-5 and 1-3)")
    add("--rtol", type=positive_float, default=1e-5, help="relative tolerance of the checks")
    add("--atol", type=positive_float, default=1e-5, help="absolute tolerance of the checks")
    add("--quick", action="store_true", help=f"smoke-run defaults: {QUICK}")
    args = cli.parse(parser, argv, QUICK, FULL)
    if args.models is None:
        args.models = args.tasks is None
    if args.tasks == []:
        args.tasks = list(DEFAULT_TASKS)
    if args.seeds is None:
        args.seeds = [1, 2, 3] if args.tasks else [1, 2, 3, 4, 5]
    if args.compiled_steps < 0:
        parser.error(f"--compiled-steps must be >= 0, got {args.compiled_steps}")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (p10 and p90 need two timings)")
    if not (args.models or args.candidates or args.learning or args.tasks):
        parser.error("--no-models with neither --candidates, --learning nor --tasks: nothing to do")
    return args


def main(argv=None):
    """Run what the flags ask for, print the tables, write the results."""
    args = parse_args(argv)
    device = pick_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    names = ("ppo_lstm", "ppo_mingru", "ppo_mingru_torchcompile")
    scripts = {name: load_script(name, args.scripts_dir) for name in names}
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "scripts_dir")}
    head = {"machine": machine_info(), "started": f"{datetime.now():%Y-%m-%dT%H:%M:%S}"}
    head["settings"] = settings
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}"
    if args.tasks:
        found = head | {"tasks": tasks(args)}
        paths = write_result(found, args.out, f"memory-tasks-{stamp}", tasks_markdown, tasks_plot)
        conclude(tasks_markdown(found), paths)
        if not (args.models or args.candidates or args.learning):
            return 0
    result = head | {
        "device": str(device),
        "models": run_grid("models", scripts, args, device) if args.models else [],
        "candidates": run_grid("candidates", scripts, args, device) if args.candidates else [],
        "learning": learning(args) if args.learning else [],
    }
    figure = plot if result["models"] or result["candidates"] else None
    paths = write_result(result, args.out, f"memory-{stamp}", markdown, figure)
    return conclude(markdown(result), paths)


if __name__ == "__main__":
    sys.exit(main())
