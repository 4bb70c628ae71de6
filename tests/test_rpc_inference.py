"""The RPC serving benchmark on a tiny budget: a run of 1 agent and 2 observers, batched and not,
with its checks and outputs; the batching logic routes each row to its own request; a dead
observer or a hung agent ends the run with one clear line and no process left behind; bad input
exits 2."""

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from benchmarks.scripts import SCRIPTS
from benchmarks.studies import rpc_inference
from benchmarks.studies.rpc_inference import QUANTILES, Batcher
from tests.conftest import ROOT, assert_user_error, script_env

TINY = "--observers 2 --episodes 2 --steps 12 --warmup-steps 2 --check-steps 3".split()
RUN_KEYS = set("policy observers batch compile setup_s served_per_s requests batches".split())
RUN_KEYS |= set("agent_latency_ms agent_throughput observer_latency_ms observer_throughput".split())
RUN_KEYS |= {"policy_us_per_request", "agent_cpu_us_per_request", "observer_cpu_us_per_request"}
RUN_KEYS |= {"wall_s", "check_equal", "check_after_update", "repeat"}
FAULT_RUN = (
    "--policies dqn --observers 2 --episodes 1000 --steps 200 --rpc-timeout 3 --timeout 120"
).split()
# The launcher's own --timeout bounds a faulty run, whatever the fault: the test waits past it, so
# that a slow machine (CI once took over 60 s here) shows the benchmark's own failure line rather
# than the test's timeout.
FAULT_WAIT_S = 150


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """PPO continuous served to 2 observers stepping HalfCheetah-v4, unbatched then batched: exit
    status, result."""
    out = tmp_path_factory.mktemp("rpc")
    argv = ["--policies", "ppo_continuous", "--batch", "off,on", *TINY, "--out", str(out)]
    status = rpc_inference.main(argv)
    assert list(out.glob("*.json")), f"exit status {status} and no results: a run failed (stderr)"
    paths = [sorted(out.glob(f"*.{ext}")) for ext in ("json", "md", "png")]
    (json_path,), (md_path,), (png_path,) = paths
    result = json.loads(json_path.read_text())
    return status, result, md_path.read_text(), png_path.read_bytes(), out


@pytest.mark.slow  # the agent and its observers, several processes (20-40 s here)
def test_tiny_run_serves_every_request_batched_and_not(tiny_run):
    status, result, _, _, out = tiny_run
    assert status == 0
    runs, rows = result["runs"], result["rows"]
    assert [(r["policy"], r["observers"], r["batch"], r["compile"]) for r in runs] == [
        ("ppo_continuous", 2, False, False),
        ("ppo_continuous", 2, True, False),
    ]
    for run in runs:
        assert run["requests"] == 2 * 2 * 12  # observers x episodes x steps, warm-up not counted
        # batched: one forward per step
        assert run["batches"] == (12 * 2 if run["batch"] else 2 * 2 * 12)
        for metric in rpc_inference.DISTRIBUTIONS:
            values = [run[metric][q] for q in QUANTILES]
            assert values == sorted(values) and values[0] > 0, f"{metric}: {values}"
        assert run["served_per_s"] == pytest.approx(run["requests"] / run["wall_s"])
        assert run["check_equal"] == {"ok": True, "diff": run["check_equal"]["diff"], "samples": 6}
        assert run["check_after_update"]["ok"] and run["check_after_update"]["changed"]
        assert run["policy_us_per_request"] > 0 and run["agent_cpu_us_per_request"] > 0
        assert run["observer_cpu_us_per_request"] > 0 and run["setup_s"] > 0
    assert rows[0]["vs_first"]["served_per_s"] == 1.0
    served = runs[1]["served_per_s"] / runs[0]["served_per_s"]
    assert rows[1]["vs_first"]["served_per_s"] == pytest.approx(served)
    assert not list(out.glob("*-logs")), "a successful run keeps no logs"


@pytest.mark.slow
def test_json_schema_table_and_plot(tiny_run):
    _, result, table, png, _ = tiny_run
    assert set(result) == {"arguments", "axis", "settings", "started", "machine", "rows", "runs"}
    assert result["axis"] == "batch" and result["arguments"]["batch"] == [False, True]
    assert result["arguments"]["observers"] == [2] and result["arguments"]["compile"] == [False]
    assert set(result["machine"]) == {"cpu", "cores", "gpu", "versions"}
    for run in result["runs"]:
        assert set(run) == RUN_KEYS
        assert set(run["agent_latency_ms"]) == {"p50", "p75", "p90", "p95"}
        assert set(run["check_after_update"]) == {"ok", "changed", "diff"}
    # one repeat: each row is its run
    for row, run in zip(result["rows"], result["runs"], strict=True):
        assert set(row) == RUN_KEYS - {"repeat"} | {"repeats", "vs_first"} and row["repeats"] == 1
        assert row["agent_latency_ms"] == run["agent_latency_ms"]
        assert row["served_per_s"] == run["served_per_s"]
    fast = result["rows"][1]
    cells = " / ".join(f"{fast['agent_latency_ms'][q]:.2f}" for q in QUANTILES)
    assert f"| ppo_continuous | 2 | on | off | {cells} |" in table
    assert f"| ppo_continuous | 2 | on | off | {fast['served_per_s']:.0f} |" in table
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_batcher_answers_each_slot_with_its_own_row():
    batcher = Batcher(lambda batch: {"value": batch * 10.0, "first": batch[:, 0].long()}, slots=4)
    futures = {}
    for slot in (2, 0, 3):  # arrival order is not slot order
        futures[slot] = batcher.submit(slot, torch.full((3,), float(slot)))
        assert not futures[slot].done(), "answered before the batch was full"
    futures[1] = batcher.submit(1, torch.full((3,), 1.0))
    assert all(future.done() for future in futures.values()), "the full batch was not answered"
    for slot, future in futures.items():
        row = future.wait()
        assert torch.equal(row["value"], torch.full((3,), 10.0 * slot))
        assert int(row["first"]) == slot
    assert len(batcher.batches) == 1 and batcher.batches[0][1] == 4
    latency, _, policy_s = batcher.batches[0]
    assert latency >= policy_s > 0
    assert not batcher.submit(0, torch.zeros(3)).done(), "the next batch starts empty"


def test_batcher_routes_rows_across_threads():
    batcher = Batcher(lambda batch: {"value": batch.sum(dim=1)}, slots=6)
    results = {}

    def observer(slot):
        results[slot] = float(batcher.submit(slot, torch.full((4,), float(slot))).wait()["value"])

    threads = [threading.Thread(target=observer, args=(slot,), daemon=True) for slot in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert results == {slot: 4.0 * slot for slot in range(6)}


def test_batcher_refuses_a_second_request_from_one_slot_in_one_batch():
    batcher = Batcher(lambda batch: {"value": batch}, slots=2)
    batcher.submit(0, torch.zeros(1))
    with pytest.raises(RuntimeError, match="slot 0 asked twice"):
        batcher.submit(0, torch.ones(1))


def test_unbatched_serving_answers_each_request_alone():
    batcher = Batcher(lambda batch: {"value": batch + 1.0}, slots=1)
    futures = [batcher.submit(0, torch.full((2,), float(i))) for i in range(3)]
    assert all(future.done() for future in futures), "a lone request was left waiting"
    assert [future.wait()["value"].tolist() for future in futures] == [
        [i, i] for i in (1.0, 2.0, 3.0)
    ]
    assert [size for _, size, _ in batcher.batches] == [1, 1, 1]


@pytest.mark.parametrize("policy", ["dqn", "ppo_continuous"])
def test_compiled_batched_agent_matches_eager_unbatched_and_follows_weights(policy):
    try:
        agent = rpc_inference.AgentServer(policy, 3, True, True, "aot_eager", 1, str(SCRIPTS))
        g = torch.Generator().manual_seed(2)
        observations = rpc_inference.SPECS[policy].observe(3, torch.device("cpu"), g)

        def serve():
            futures = [agent.act(slot, obs) for slot, obs in enumerate(observations)]
            assert all(future.done() for future in futures)
            return [future.wait() for future in futures]

        answers = serve()
        assert rpc_inference.compare(answers, agent.reference(list(observations)), 1e-3, 1e-4)[0]
        agent.perturb()
        after = serve()
        assert rpc_inference.compare(after, agent.reference(list(observations)), 1e-3, 1e-4)[0]
        changed = [
            not rpc_inference.difference(a, b, 1e-3, 1e-4)[0] for a, b in zip(after, answers)
        ]
        assert all(changed)
    finally:
        # the agent sets fail_on_recompile for its whole process
        torch.compiler.set_stance("default")


def test_repeats_alternate_and_combine_to_medians():
    args = rpc_inference.parse_args("--policies dqn td3 --compile off,on --repeats 2".split())
    plan = [(c["policy"], c["batch"], c["compile"], c["repeat"]) for c in rpc_inference.plan(args)]
    # the compile values alternate within each policy's repeat
    expected = [(p, True, c, r) for p in ("dqn", "td3") for r in (0, 1) for c in (False, True)]
    assert plan == expected
    runs = [fake_run(served, ok) for served, ok in ((100.0, True), (300.0, True), (200.0, False))]
    (row,) = rpc_inference.combine(runs, "batch")
    assert row["served_per_s"] == 200.0
    assert row["agent_latency_ms"] == {"p50": 2.0, "p75": 3.0, "p90": 4.0, "p95": 5.0}
    assert row["repeats"] == 3 and row["check_equal"] == {"ok": False, "diff": 0.5, "samples": 12}


def fake_run(served, ok):
    """A run record with `served` requests/s, latencies proportional to it and check `ok`."""
    stats = {q: served / 100.0 + i for i, q in enumerate(QUANTILES)}
    run = dict(policy="dqn", observers=2, batch=True, compile=False)
    run |= {key: stats for key in rpc_inference.DISTRIBUTIONS}
    run |= {key: served for key in rpc_inference.SCALARS}
    run["check_equal"] = {"ok": ok, "diff": 0.5 if not ok else 0.0, "samples": 4}
    return run | {"check_after_update": {"ok": True, "changed": True, "diff": 0.0}}


def test_percentiles_and_error_lines():
    cuts = {"p50": 11, "p75": 16, "p90": 19, "p95": 20}
    assert rpc_inference.percentiles([float(v) for v in range(1, 22)]) == cuts
    assert rpc_inference.percentiles([3.0]) == {"p50": 3.0, "p75": 3.0, "p90": 3.0, "p95": 3.0}
    wrapped = RuntimeError(
        "RuntimeError: On WorkerInfo(id=2, name=observer0):\nRuntimeError('observer0: no answer "
        "from the agent at step 4')\nTraceback (most recent call last):\n  File ..."
    )
    assert rpc_inference.first_line(wrapped) == "observer0: no answer from the agent at step 4"


def start_benchmark(tmp_path, *argv):
    """The benchmark as a user starts it, its stderr read line by line."""
    cmd = [sys.executable, "-m", "benchmarks.studies.rpc_inference", *argv, "--out", str(tmp_path)]
    pipes = dict(stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return subprocess.Popen(cmd, cwd=ROOT, env=script_env(), **pipes)


def read_until(proc, words, timeout):
    """The lines of `proc`'s stderr up to the first that contains `words`, waiting at most `timeout`
    seconds."""
    selector = selectors.DefaultSelector()
    selector.register(proc.stderr, selectors.EVENT_READ)
    deadline, lines = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        if selector.select(timeout=1.0):
            line = proc.stderr.readline()
            lines.append(line)
            if words in line or not line:
                return lines
    proc.kill()
    pytest.fail(f"no line with {words!r} within {timeout} s:\n{''.join(lines)}")


def pids(line):
    """{process name: pid} from the launcher's 'name pid N, ...' line."""
    parts = line.split(": ", 1)[1].split(", ")
    return {part.split(" pid ")[0]: int(part.split(" pid ")[1]) for part in parts}


def alive(pid):
    """Whether `pid` is a live process (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def fault_outcome(tmp_path, name, sig):
    """Start a long run, send `sig` to process `name` once the timed episodes run; returns the exit
    status, the failure line and the pids of the run."""
    proc = start_benchmark(tmp_path, *FAULT_RUN)
    try:
        started = read_until(proc, "coordinator pid", timeout=60)[-1]
        read_until(proc, "timed episodes running", timeout=90)
        processes = pids(started)
        os.kill(processes[name], sig)
        try:
            status = proc.wait(timeout=FAULT_WAIT_S)
        except subprocess.TimeoutExpired:
            logs = {log.name: log.read_text()[-2000:] for log in tmp_path.glob("*-logs/run0/*.log")}
            pytest.fail(
                f"the run outlived its own --timeout after {sig.name} to {name}; the processes' "
                f"logs: {logs}"
            )
        rest = proc.stderr.read().strip().splitlines()
    finally:
        proc.kill()
        proc.wait()
    return status, rest[-1], processes


@pytest.mark.slow
def test_a_killed_observer_ends_the_run_with_one_line(tmp_path):
    status, line, processes = fault_outcome(tmp_path, "observer1", signal.SIGKILL)
    assert status == 1
    assert line.startswith("rpc_inference: dqn observers=2 batch=off compile=off: observer1")
    assert "died with SIGKILL" in line and "Traceback" not in line
    assert not [name for name, pid in processes.items() if alive(pid)], "processes left behind"


@pytest.mark.slow
def test_a_hung_agent_ends_the_run_through_the_rpc_timeout(tmp_path):
    status, line, processes = fault_outcome(tmp_path, "agent", signal.SIGSTOP)
    assert status == 1
    assert "no answer from the agent" in line and "--rpc-timeout 3 s" in line, line
    assert not [name for name, pid in processes.items() if alive(pid)], "processes left behind"


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--observers", "0"], "--observers"),
        (["--observers", "2,x"], "--observers"),
        (["--batch", "maybe"], "--batch"),
        (["--batch", "off,on", "--compile", "off,on"], "--observers, --batch, --compile"),
        (["--observers", "65"], "--observers"),
        (["--steps", "2", "--check-steps", "3"], "--check-steps"),
        (["--backend", "nope"], "--backend"),
        (["--policies", "ppo_atari"], "--policies"),
        (["--rpc-timeout", "0"], "--rpc-timeout"),
        (["--warmup-steps", "-1"], "--warmup-steps"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        rpc_inference.parse_args(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], lines


def test_bad_input_from_the_shell_starts_nothing(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.studies.rpc_inference", "--observers", "4"]
    cmd += ["--compile", "off,on", "--batch", "off,on", "--out", str(tmp_path)]
    kwargs = dict(cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=120)
    proc = subprocess.run(cmd, **kwargs)
    assert_user_error(proc, "--batch", "--compile")
    assert not list(tmp_path.iterdir())
