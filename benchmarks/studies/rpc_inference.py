"""Serving an acting policy over `torch.distributed.rpc`: one agent process answers the action
requests of N observer processes that step real gymnasium environments, with one forward pass
per request or one per batch of requests, eager or compiled (docs/serving-rpc.md).

    python -m benchmarks.studies.rpc_inference  # 8 observers, batch off,on, 4 policies
    python -m benchmarks.studies.rpc_inference --policies dqn --observers 1,2,4,8 --batch on
    python -m benchmarks.studies.rpc_inference --policies ppo_continuous --compile off,on --batch on

One of --observers, --batch and --compile may list several values: the x-axis, its values
alternating over --repeats. A run is a fresh set of processes, all on loopback, one intra-op
thread each: a coordinator, the agent (the policy built as its twin builds it,
benchmarks/policies.py) and the observers, each stepping its own env (ENVS) and asking the agent
for every action. Batched, the agent waits for one request from every observer and answers them
as one batch. Metrics at p50/p75/p90/p95: agent latency and throughput, observer latency and
throughput; served/s over the timed episodes. Checks: the first --check-steps answers equal the
eager policy's on the observation alone (|a - b| <= atol + rtol |b|), and answers follow an
in-place weight update. Every remote call has a timeout; a dead process, a silent agent, a run
past --timeout or a failed check exits 1 with one line, every process killed. Writes
benchmarks/results/rpc-inference-<time>.{json,md,png} (or to --out).
"""

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import statistics
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from benchmarks import cli
from benchmarks.cli import conclude, positive_float, positive_int, values_of
from benchmarks.machine import machine_info
from benchmarks.policies import SPECS
from benchmarks.processes import die_with_parent, note
from benchmarks.report import machine_line, table, write_result
from benchmarks.scripts import load_script
from benchmarks.studies.inference import COMPILE_WARMUP, check_mark, difference

ENVS = {  # policy -> (the environment its observers step, the answer they step it with)
    "ppo_continuous": ("HalfCheetah-v4", "action"),
    "sac": ("HalfCheetah-v4", "mean"),
    "td3": ("HalfCheetah-v4", "action"),
    "dqn": ("CartPole-v1", "action"),
}
AXES = ("observers", "batch", "compile")
# indices into the 19 cut points of n=20 quantiles
QUANTILES = {"p50": 9, "p75": 14, "p90": 17, "p95": 18}
DISTRIBUTIONS = "agent_latency_ms agent_throughput observer_latency_ms observer_throughput".split()
SCALARS = "served_per_s policy_us_per_request agent_cpu_us_per_request observer_cpu_us_per_request"
SCALARS = (*SCALARS.split(), "setup_s", "requests", "batches", "wall_s")
MAX_OBSERVERS = 64
SWITCH = {"on": True, "off": False}
GRACE_S = 20.0  # how long finished processes get to leave rpc.shutdown before they are killed


class Batcher:
    """Gathers one request per slot into one batch, runs `answer` on it once, and answers each
    request with its own row. With one slot every request is its own batch: requests are served
    one at a time, in arrival order.

    `answer(batch)` returns a dict of tensors whose first dimension is the batch. `batches`
    holds, per answered batch, [seconds from the first request's arrival to the answers being
    ready, batch size, seconds in `answer`]."""

    def __init__(self, answer, slots):
        self.answer, self.slots = answer, slots
        self.lock = threading.Lock()
        self.batches = []
        self._reset()

    def _reset(self):
        self.pending, self.first_arrival, self.future = {}, None, torch.futures.Future()

    def submit(self, slot, obs):
        """Queue `obs` in `slot`; returns a Future of this request's row of the answer."""
        arrival = time.perf_counter()
        ready = None
        with self.lock:
            if slot in self.pending:
                raise RuntimeError(f"slot {slot} asked twice before its batch was full")
            self.first_arrival = self.first_arrival or arrival
            self.pending[slot] = obs
            row = self.future.then(lambda fut: take_row(fut.value(), slot))
            if len(self.pending) == self.slots:
                ready = self._run()
        if ready:
            future, outputs = ready
            future.set_result(outputs)  # outside the lock: the callbacks cut each observer's row
        return row

    def _run(self):
        """Answer the full batch in slot order; returns its Future and outputs; opens the next."""
        batch = torch.stack([self.pending[slot] for slot in range(self.slots)])
        start = time.perf_counter()
        outputs = self.answer(batch)
        done = time.perf_counter()
        self.batches.append([done - self.first_arrival, self.slots, done - start])
        ready = (self.future, outputs)
        self._reset()
        return ready


def take_row(outputs, row):
    """Row `row` of every output, copied: RPC then sends the row, not the batch's storage."""
    return {name: tensor[row].clone() for name, tensor in outputs.items()}


class AgentServer:
    """The policy on the agent process: built as its twin builds it, eager or compiled, warmed up at
    the batch size it will serve, then answering observers through a Batcher (`observers` slots
    batched, one slot unbatched). After the warm-up, the process's compile stance is
    fail_on_recompile: one static graph per run."""

    def __init__(self, policy, observers, batch, compiled, backend, seed, scripts_dir):
        start = time.perf_counter()
        torch.manual_seed(seed)
        self.spec = SPECS[policy]
        self.built = self.spec.build(
            load_script(self.spec.script, scripts_dir), torch.device("cpu")
        )
        act = torch.compile(self.built.act, backend=backend) if compiled else self.built.act
        slots = observers if batch else 1
        with torch.no_grad():
            warm = self.spec.observe(
                slots, torch.device("cpu"), torch.Generator().manual_seed(seed)
            )
            for _ in range(COMPILE_WARMUP if compiled else 1):
                act(warm)
        # in this process from now on: a recompile is an error
        torch.compiler.set_stance("fail_on_recompile")
        self.batcher = Batcher(lambda obs: self.answer(act, obs), slots)
        self.setup_s = time.perf_counter() - start
        self.cpu_mark = time.process_time()

    def answer(self, act, obs):
        """The policy's deterministic outputs for a batch of observations."""
        with torch.no_grad():
            return self.spec.deterministic(act(obs))

    def act(self, observer, obs):
        """A Future of the answer to one observer's request."""
        return self.batcher.submit(observer % self.batcher.slots, obs)

    def setup_seconds(self):
        """Seconds spent building, compiling and warming up the policy."""
        return self.setup_s

    def take_batches(self):
        """The batches answered and this process's CPU seconds since the last call."""
        batches, self.batcher.batches = self.batcher.batches, []
        cpu_mark, self.cpu_mark = self.cpu_mark, time.process_time()
        return batches, self.cpu_mark - cpu_mark

    def reference(self, observations):
        """The eager policy's answer to each observation alone: the check's reference."""
        with torch.no_grad():
            return [
                take_row(self.answer(self.built.act, obs.unsqueeze(0)), 0) for obs in observations
            ]

    def perturb(self):
        """Change the training module's weights in place, as an optimizer step does."""
        self.spec.perturb(self.built.source)


@rpc.functions.async_execution
def request_action(agent_rref, observer, obs):
    """On the agent: the Future of `observer`'s answer (async: a wait holds no thread)."""
    return agent_rref.local_value().act(observer, obs)


class Observer:
    """One environment on an observer process, stepped with actions asked of the agent."""

    def __init__(self, index, policy, seed, rpc_timeout):
        import gymnasium as gym

        env_id, self.action_key = ENVS[policy]
        self.index, self.rpc_timeout = index, rpc_timeout
        self.env = gym.make(env_id)
        self.env.action_space.seed(seed)
        self.seed = seed

    def ask(self, agent_rref, obs, step):
        """The agent's answer to `obs`; a timeout or a lost agent raises one line naming us."""
        try:
            return rpc.rpc_sync(
                agent_rref.owner(),
                request_action,
                args=(agent_rref, self.index, obs),
                timeout=self.rpc_timeout,
            )
        except RuntimeError as error:
            raise RuntimeError(
                f"observer{self.index}: no answer from the agent at step {step} "
                f"(--rpc-timeout {self.rpc_timeout:g} s): {first_line(error)}"
            ) from None

    def env_action(self, answer):
        """The answer as an action the environment takes (continuous ones clipped)."""
        action = answer[self.action_key]
        if action.dim() == 0:
            return int(action)
        space = self.env.action_space
        return action.numpy().clip(space.low, space.high)

    def run_episode(self, agent_rref, steps, record):
        """Reset and take `steps` steps (resetting when the environment ends an episode)."""
        cpu_start = time.process_time()
        obs, _ = self.env.reset(seed=self.seed)
        self.seed = None  # only the first reset is seeded
        latencies, samples = [], []
        for step in range(steps):
            request = torch.as_tensor(obs, dtype=torch.float32)
            start = time.perf_counter()
            answer = self.ask(agent_rref, request, step)
            latencies.append(time.perf_counter() - start)
            if step < record:
                samples.append((request, answer))
            obs, _, terminated, truncated, _ = self.env.step(self.env_action(answer))
            if terminated or truncated:
                obs, _ = self.env.reset()
        return latencies, samples, time.process_time() - cpu_start

    def probe(self, agent_rref, obs):
        """The agent's answer to a given observation, through the same path as every step."""
        return self.ask(agent_rref, obs, "probe")


def first_line(error):
    """The first meaningful line of an exception's text."""
    for line in str(error).splitlines():
        text = line.strip().removeprefix("RuntimeError: ").removeprefix("RPCErr:1:")
        if text.startswith(("RuntimeError('", 'RuntimeError("')):
            text = text[len("RuntimeError('") : -2]
        if text and not text.startswith(("On WorkerInfo", "Traceback")):
            return text
    return "(no message)"


class RunFailed(Exception):
    """A run failed; the message is the one line to show."""


def wait_each(futures, names):
    """The values of `futures`; the first that failed raises RunFailed naming its process."""
    values = []
    for future, name in zip(futures, names):
        try:
            values.append(future.wait())
        except RuntimeError as error:
            text = first_line(error)
            raise RunFailed(text if text.startswith(name) else f"{name}: {text}") from error
    return values


def run_episodes(observers, agent, steps, record, timeout):
    """Every observer runs one episode at once; their run_episode results, in order."""
    futures = [ob.rpc_async(timeout=timeout).run_episode(agent, steps, record) for ob in observers]
    return wait_each(futures, [ob.owner().name for ob in observers])


def probe(observers, agent, observations, timeout):
    """Every observer asks for the answer to its observation at once."""
    futures = [
        ob.rpc_async(timeout=timeout).probe(agent, obs) for ob, obs in zip(observers, observations)
    ]
    return wait_each(futures, [ob.owner().name for ob in observers])


def compare(answers, references, rtol, atol):
    """(ok, worst difference) of served answers against their references (dicts of tensors)."""
    results = [difference(got, ref, rtol, atol) for got, ref in zip(answers, references)]
    return all(ok for ok, _ in results), max(worst for _, worst in results)


def check_weights_update(observers, agent, observations, settings):
    """Probe, change the agent's weights in place, probe again."""
    timeout, rtol, atol = settings["timeout"], settings["rtol"], settings["atol"]
    before = probe(observers, agent, observations, timeout)
    agent.rpc_sync(timeout=timeout).perturb()
    after = probe(observers, agent, observations, timeout)
    reference = agent.rpc_sync(timeout=timeout).reference(observations)
    changed = all(not difference(new, old, rtol, atol)[0] for new, old in zip(after, before))
    ok, diff = compare(after, reference, rtol, atol)
    return {"ok": ok and changed, "changed": changed, "diff": diff}


def percentiles(values):
    """p50, p75, p90 and p95 of `values` (inclusive method; a single value is every percentile)."""
    if len(values) == 1:
        return {name: values[0] for name in QUANTILES}
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    return {name: cuts[index] for name, index in QUANTILES.items()}


def run_metrics(batches, agent_cpu_s, episodes, wall_s):
    """The run's metrics from the agent's batches (Batcher.batches) and CPU seconds, and the
    observers' episodes (run_episode's results per observer, per episode) over `wall_s` seconds."""
    latencies = [latency for episode in episodes for observer in episode for latency in observer[0]]
    observer_cpu_s = sum(observer[2] for episode in episodes for observer in episode)
    requests = len(latencies)
    return {
        "agent_latency_ms": percentiles([latency * 1e3 for latency, _, _ in batches]),
        "agent_throughput": percentiles([size / latency for latency, size, _ in batches]),
        "observer_latency_ms": percentiles([latency * 1e3 for latency in latencies]),
        "observer_throughput": percentiles([1 / latency for latency in latencies]),
        "served_per_s": requests / wall_s,
        "policy_us_per_request": sum(policy_s for _, _, policy_s in batches) / requests * 1e6,
        "agent_cpu_us_per_request": agent_cpu_s / requests * 1e6,
        "observer_cpu_us_per_request": observer_cpu_s / requests * 1e6,
        "requests": requests,
        "batches": len(batches),
        "wall_s": wall_s,
    }


def start_roles(config, settings):
    """Create the agent (built, compiled, warmed up) and the observers."""
    timeout = settings["timeout"]
    served = [config[key] for key in ("policy", "observers", "batch", "compile")]
    served += [settings[key] for key in ("backend", "seed", "scripts_dir")]
    agent = rpc.remote("agent", AgentServer, timeout=timeout, args=tuple(served))
    setup_s = agent.rpc_sync(timeout=timeout).setup_seconds()
    observers = [
        rpc.remote(
            f"observer{i}",
            Observer,
            timeout=timeout,
            args=(i, config["policy"], settings["seed"] + i, settings["rpc_timeout"]),
        )
        for i in range(config["observers"])
    ]
    return agent, observers, setup_s


def coordinate(config, settings, phase):
    """The coordinator's work for one run: start the roles, run the warm-up and the timed episodes
    (the first records the answers to check), collect the metrics, run the checks; `phase(text)`
    tells the launcher where the run is. Returns the run's record."""
    timeout, steps = settings["timeout"], settings["steps"]
    agent, observers, setup_s = start_roles(config, settings)
    if settings["warmup_steps"]:
        run_episodes(observers, agent, settings["warmup_steps"], 0, timeout)
    agent.rpc_sync(timeout=timeout).take_batches()
    phase(f"agent ready (setup {setup_s:.1f} s), timed episodes running")
    start = time.perf_counter()
    episodes = [
        run_episodes(
            observers, agent, steps, settings["check_steps"] if episode == 0 else 0, timeout
        )
        for episode in range(settings["episodes"])
    ]
    wall_s = time.perf_counter() - start
    batches, agent_cpu_s = agent.rpc_sync(timeout=timeout).take_batches()
    samples = [sample for observer in episodes[0] for sample in observer[1]]
    reference = agent.rpc_sync(timeout=timeout).reference([obs for obs, _ in samples])
    ok, diff = compare(
        [answer for _, answer in samples], reference, settings["rtol"], settings["atol"]
    )
    probes = [observer[1][0][0] for observer in episodes[0]]
    return {
        **config,
        "setup_s": setup_s,
        **run_metrics(batches, agent_cpu_s, episodes, wall_s),
        "check_equal": {"ok": ok, "diff": diff, "samples": len(samples)},
        "check_after_update": check_weights_update(observers, agent, probes, settings),
    }


def start_barrier(port, world_size, timeout_s):
    """Wait, at most `timeout_s`, until every process of the run has started."""
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))
    if store.add("started", 1) == world_size:
        store.set("all_started", "1")
    store.wait(["all_started"])
    return store


def process_main(name, rank, world_size, port, config, settings, log_path, result_path):
    """Every process of a run: logs, one thread, loopback, the RPC world, the record."""
    die_with_parent()
    # Ctrl-C is the launcher's to handle: it kills every process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    torch.set_num_threads(1)
    from torch._inductor import config as inductor_config

    inductor_config.compile_threads = 1  # compile in this process: no pool of compile workers
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TP_SOCKET_IFNAME="lo",
        GLOO_SOCKET_IFNAME="lo",
        TORCHELASTIC_USE_AGENT_STORE="True",
    )  # connect to the launcher's store, as torchrun's ranks do
    store = start_barrier(port, world_size, settings["timeout"])
    options = rpc.TensorPipeRpcBackendOptions(
        init_method="env://",
        rpc_timeout=settings["rpc_timeout"],
        num_worker_threads=max(16, config["observers"] + 8),
    )
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    if name == "coordinator":
        try:
            record = coordinate(config, settings, lambda text: store.set("phase", text))
        except (RunFailed, RuntimeError) as error:
            Path(result_path).write_text(json.dumps({"error": first_line(error)}))
            os._exit(1)  # a graceful shutdown would wait for the failed processes
        Path(result_path).write_text(json.dumps(record))
    rpc.shutdown(graceful=True, timeout=settings["timeout"])


def loopback_listener():
    """A TCP socket listening on 127.0.0.1 at a free port chosen by the kernel."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def label(config):
    """A run's name in messages."""
    return (
        f"{config['policy']} observers={config['observers']} batch={onoff(config['batch'])} "
        f"compile={onoff(config['compile'])}"
    )


def exit_reason(code):
    """How a process ended, in words."""
    return f"died with {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"


def supervise(processes, store, result_path, timeout_s, run_label):
    """Wait for the coordinator to finish, at most `timeout_s`, noting the phases it sets in
    `store`; returns None on success or the line naming what failed (a process that ended badly,
    the coordinator's error, or the deadline)."""
    deadline = time.monotonic() + timeout_s
    coordinator = processes["coordinator"]
    while True:
        if store.check(["phase"]):
            note(f"{run_label}: {store.get('phase').decode()}")
            store.delete_key("phase")
        for name, process in processes.items():
            if process.exitcode not in (None, 0):
                if name == "coordinator" and result_path.exists():
                    return json.loads(result_path.read_text())["error"]
                return f"{name} (pid {process.pid}) {exit_reason(process.exitcode)}"
        if coordinator.exitcode == 0:
            return None if result_path.exists() else "the coordinator ended without a result"
        if time.monotonic() > deadline:
            return f"the run took more than --timeout {timeout_s:g} s"
        multiprocessing.connection.wait(
            [p.sentinel for p in processes.values() if p.exitcode is None], timeout=0.5
        )


def stop(processes, grace_s):
    """Give the processes `grace_s` seconds to leave, then kill and reap the rest."""
    deadline = time.monotonic() + grace_s
    for process in processes.values():
        process.join(max(0.0, deadline - time.monotonic()))
    killed = [name for name, process in processes.items() if process.exitcode is None]
    for name in killed:
        processes[name].kill()
    for process in processes.values():
        process.join(5.0)
    return killed


def run_one(config, settings, log_dir):
    """Start the processes of one run, supervise them, stop them all."""
    log_dir.mkdir(parents=True, exist_ok=True)
    result_path = log_dir / "result.json"
    names = ["coordinator", "agent", *(f"observer{i}" for i in range(config["observers"]))]
    listener = loopback_listener()
    port = listener.getsockname()[1]
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        master_listen_fd=listener.detach(),
        wait_for_workers=False,
        timeout=timedelta(seconds=settings["timeout"]),
    )
    context = multiprocessing.get_context("spawn")
    processes = {}
    failure = "interrupted"
    try:
        for rank, name in enumerate(names):
            log = str(log_dir / f"{name}.log")
            main_args = (name, rank, len(names), port, config, settings, log, str(result_path))
            processes[name] = context.Process(target=process_main, name=name, args=main_args)
            processes[name].start()
        note(
            f"{label(config)}: " + ", ".join(f"{name} pid {p.pid}" for name, p in processes.items())
        )
        failure = supervise(processes, store, result_path, settings["timeout"], label(config))
    finally:
        killed = stop(processes, GRACE_S if failure is None else 0.0)
        del store  # the store owns the listening socket and closes it
    if failure:
        raise RunFailed(f"{label(config)}: {failure} (logs: {log_dir})")
    if killed:
        note(
            f"{label(config)}: killed {', '.join(killed)}, still in rpc.shutdown after "
            f"{GRACE_S:g} s"
        )
    record = json.loads(result_path.read_text())
    shutil.rmtree(log_dir)
    return record


def combine(runs, axis):
    """One row per policy and axis value: medians over its repeats; checks pass if all did."""
    groups = {}
    for run in runs:
        groups.setdefault((run["policy"], run[axis]), []).append(run)
    return [combined(group) for group in groups.values()]


def combined(group):
    """The row of one policy and axis value from its repeats (see `combine`)."""
    row = {key: group[0][key] for key in ("policy", *AXES)} | {"repeats": len(group)}
    for key in DISTRIBUTIONS:
        row[key] = {q: statistics.median(run[key][q] for run in group) for q in QUANTILES}
    for key in SCALARS:
        row[key] = statistics.median(run[key] for run in group)
    for check, total in (("check_equal", "samples"), ("check_after_update", "changed")):
        runs = [run[check] for run in group]
        row[check] = {"ok": all(c["ok"] for c in runs), "diff": max(c["diff"] for c in runs)}
        row[check][total] = (sum if total == "samples" else all)(c[total] for c in runs)
    return row


def add_speedups(runs, axis):
    """Add to each run its p50 agent throughput and served/s over the first axis value's."""
    first = {}
    for run in runs:
        first.setdefault(run["policy"], run)
    for run in runs:
        base = first[run["policy"]]
        throughput = run["agent_throughput"]["p50"] / base["agent_throughput"]["p50"]
        served = run["served_per_s"] / base["served_per_s"]
        run["vs_first"] = dict(axis_value=base[axis], agent_throughput_p50=throughput)
        run["vs_first"]["served_per_s"] = served


def onoff(value):
    """A boolean as the command line spells it."""
    return "on" if value is True else "off" if value is False else str(value)


def cell(stats, spec):
    """p50 / p75 / p90 / p95 in one table cell."""
    return " / ".join(f"{stats[name]:{spec}}" for name in QUANTILES)


def markdown(result):
    """The machine and settings, then two tables, one line per row (policy and axis value, the
    median over its repeats): the four metrics at p50 / p75 / p90 / p95; served/s against the
    first axis value, where the CPU time goes, setup time and checks."""
    axis, settings = result["axis"], result["settings"]
    first = onoff(result["rows"][0]["vs_first"]["axis_value"]) if result["rows"] else "-"
    key = "policy | observers | batch | compile"
    metrics, costs = [], []
    for r in result["rows"]:
        row = f"{r['policy']} | {r['observers']} | {onoff(r['batch'])} | {onoff(r['compile'])}"
        metrics.append(
            f"{row} | {cell(r['agent_latency_ms'], '.2f')} | {cell(r['agent_throughput'], '.0f')}"
            f" | {cell(r['observer_latency_ms'], '.2f')} | {cell(r['observer_throughput'], '.0f')}"
        )
        vs = r["vs_first"]
        costs.append(
            f"{row} | {r['served_per_s']:.0f} | {vs['agent_throughput_p50']:.2f}x, "
            f"{vs['served_per_s']:.2f}x | {r['policy_us_per_request']:.0f} | "
            f"{r['agent_cpu_us_per_request']:.0f} | {r['observer_cpu_us_per_request']:.0f} | "
            f"{r['setup_s']:.1f} | {check_mark(r)}"
        )
    tolerance = f"|a - b| <= {settings['atol']:g} + {settings['rtol']:g} |b|"
    lines = [
        machine_line(result["machine"]),
        f"Axis: {axis}; median of {result['arguments']['repeats']} alternating runs; "
        f"{settings['episodes']} episodes x {settings['steps']} steps per observer "
        f"(+{settings['warmup_steps']} warm-up); backend {settings['backend']}; started "
        f"{result['started']}",
        "",
        "p50 / p75 / p90 / p95:",
        "",
        *table(
            f"{key} | agent latency ms | agent throughput /s | observer latency ms | observer "
            "throughput /s",
            metrics,
            "lrll" + "r" * 4,
        ),
        "",
        *table(
            f"{key} | served/s | vs {axis}={first}: agent throughput p50, served/s | policy "
            "µs/request | agent CPU µs/request | observer CPU µs/request | setup s | check",
            costs,
            "lrll" + "r" * 6 + "l",
        ),
        "",
        f"Checks: answers equal the eager policy's on one observation within {tolerance} and "
        "follow an in-place weight update (DIFFERS: they were not equal; STALE: they did not "
        "follow). CPU: all threads of the process, per request; policy: the forward passes alone.",
    ]
    return "\n".join(lines) + "\n"


def plot(result, path):
    """Agent throughput, served/s and observer latency (p50s) against the axis, per policy."""
    from benchmarks.plots import panels, save  # here: the processes of a run need no matplotlib

    axis = result["axis"]
    metrics = (
        ("agent throughput p50 (requests/s)", lambda r: r["agent_throughput"]["p50"]),
        ("served/s (whole run)", lambda r: r["served_per_s"]),
        ("observer latency p50 (ms)", lambda r: r["observer_latency_ms"]["p50"]),
    )
    values = list(dict.fromkeys(r[axis] for r in result["rows"]))
    fig, axes = panels(3, 4.3)
    for ax, (title, metric) in zip(axes, metrics):
        for policy in dict.fromkeys(r["policy"] for r in result["rows"]):
            rows = [r for r in result["rows"] if r["policy"] == policy]
            x = [values.index(r[axis]) for r in rows]
            ax.plot(x, [metric(r) for r in rows], marker="o", label=policy)
        ax.set_xticks(range(len(values)), [onoff(v) for v in values])
        ax.set(title=title, xlabel=axis)
        ax.legend(fontsize=7)
    fig.suptitle(f"policy served over RPC, {result['machine']['cpu']}", fontsize=9)
    save(fig, path)


def switch(text):
    """An argparse type: on or off."""
    if text not in SWITCH:
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return SWITCH[text]


def parse_args(argv):
    """The command line; bad input exits 2 with one line, before any process starts."""
    common = "--backend --seed --out --scripts-dir"
    parser, add = cli.parser("benchmarks.studies.rpc_inference", __doc__, common, one_line=True)
    add("--policies", nargs="+", choices=list(ENVS), default=list(ENVS))
    add("--observers", type=values_of(positive_int), default=[8], help="observers, e.g. 1,2,4,8")
    add("--batch", type=values_of(switch), help="off, on or off,on (default: off,on)")
    add("--compile", type=values_of(switch), default=[False], help="off, on or off,on")
    add("--repeats", type=positive_int, default=1, help="runs per policy and axis value")
    add("--episodes", type=positive_int, default=3, help="timed episodes per observer")
    add("--steps", type=positive_int, default=200, help="steps (action requests) per episode")
    add("--warmup-steps", type=int, default=20, help="steps of the untimed warm-up episode")
    add("--check-steps", type=positive_int, default=4, help="answers per observer checked")
    add("--rtol", type=positive_float, default=1e-3, help="relative tolerance of the checks")
    add("--atol", type=positive_float, default=1e-4, help="absolute tolerance of the checks")
    add("--rpc-timeout", type=positive_float, default=30.0, help="s, each action request")
    add("--timeout", type=positive_float, default=600.0, help="s, one run")
    args = parser.parse_args(argv)
    if args.batch is None:
        args.batch = [True] if len(args.observers) > 1 or len(args.compile) > 1 else [False, True]
    listed = [axis for axis in AXES if len(getattr(args, axis)) > 1]
    if len(listed) > 1:
        many = ", ".join(listed)
        parser.error(f"only one of --observers, --batch, --compile may list several, got {many}")
    if max(args.observers) > MAX_OBSERVERS:
        most = max(args.observers)
        parser.error(f"--observers: at most {MAX_OBSERVERS} (one process each), got {most}")
    if args.warmup_steps < 0:
        parser.error(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.check_steps > args.steps:
        parser.error(f"--check-steps ({args.check_steps}) cannot exceed --steps ({args.steps})")
    if args.backend not in torch._dynamo.list_backends(exclude_tags=()):
        parser.error(f"--backend {args.backend!r} is not a torch.compile backend")
    scripts = {p: args.scripts_dir / f"{SPECS[p].script}.py" for p in args.policies}
    if missing := [p for p, script in scripts.items() if not script.exists()]:
        parser.error(f"--policies: no script for {', '.join(missing)} in {args.scripts_dir}")
    args.axis = listed[0] if listed else "batch"
    return args


def plan(args):
    """One config per policy, repeat and axis value, the axis values alternating."""
    fixed = {axis: getattr(args, axis)[0] for axis in AXES}
    return [
        {"policy": policy, **fixed, args.axis: value, "repeat": repeat}
        for policy in args.policies
        for repeat in range(args.repeats)
        for value in getattr(args, args.axis)
    ]


def settings_of(args):
    """What every process of a run needs to know, as plain values."""
    keys = "backend episodes steps warmup_steps check_steps rtol atol rpc_timeout timeout seed"
    return {key: getattr(args, key) for key in keys.split()} | {
        "scripts_dir": str(args.scripts_dir)
    }


def failed_checks(runs):
    """One line per run whose answers differed from eager's or ignored a weight update."""
    lines = []
    for run in runs:
        equal, update = run["check_equal"], run["check_after_update"]
        if not equal["ok"]:
            diff = equal["diff"]
            lines.append(
                f"{label(run)}: answers differ from the eager unbatched policy by {diff:.3g}"
            )
        if not update["ok"]:
            what = "differ from the eager policy" if update["changed"] else "did not change"
            lines.append(f"{label(run)}: after an in-place weight update the answers {what}")
    return lines


def raise_interrupt(signum, frame):
    """SIGTERM handler: unwind like Ctrl-C, so that every process is killed on the way out."""
    raise KeyboardInterrupt


def main(argv=None):
    """Run the benchmark, print the table, write the results."""
    args = parse_args(argv)
    settings = settings_of(args)
    stem = f"rpc-inference-{datetime.now():%Y%m%d-%H%M%S}"
    logs = args.out / f"{stem}-logs"
    started = datetime.now().isoformat(timespec="seconds")
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        runs = [run_one(config, settings, logs / f"run{i}") for i, config in enumerate(plan(args))]
    except RunFailed as failure:
        print(f"rpc_inference: {failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rpc_inference: interrupted; every process of the run was killed", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    shutil.rmtree(logs, ignore_errors=True)
    rows = combine(runs, args.axis)
    add_speedups(rows, args.axis)
    arguments = {k: v for k, v in vars(args).items() if k not in ("out", "scripts_dir", "axis")}
    result = dict(arguments=arguments, axis=args.axis, settings=settings, started=started)
    result |= dict(machine=machine_info(), rows=rows, runs=runs)
    return conclude(
        markdown(result), write_result(result, args.out, stem, markdown, plot), failed_checks(runs)
    )


if __name__ == "__main__":
    # so that RPC pickles this module's classes by name
    from benchmarks.studies.rpc_inference import main as imported_main

    sys.exit(imported_main())
