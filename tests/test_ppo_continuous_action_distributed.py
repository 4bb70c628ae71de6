"""PPO data-parallel under `torchrun`, on this CPU with gloo: two ranks train in lockstep and rank 0
alone reports; two ranks with half the data each take one process's steps with all of it; ranks
and seeds come from RANK, not LOCAL_RANK; run plainly, it trains exactly as its twin; a rank that
dies or hangs ends the run; Ctrl-C or SIGTERM stops every rank at the same iteration; bad input
exits 2 before any collective. Runs are pinned to the CPU and gloo (a CUDA machine's choices are
checked with CUDA patched in); launches listen on loopback only, and every process is killed at
the end of each test."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
import torch
from conftest import ROOT, RUNS_CWD, SCRIPTS, load_script, run_script, script_env, summary
from helpers import distributed_update

from benchmarks.processes import kill_tree

SCRIPT, TWIN = "ppo_continuous_action_distributed", "ppo_continuous_action_torchcompile"
# Pendulum-v1 truncates every 200 steps: 64 vector steps a rollout, 2 minibatches, 2 epochs
TINY = "--no-cuda --env-id Pendulum-v1 --num-steps 64 --num-minibatches 2 --update-epochs 2"
TINY = (*TINY.split(), "--measure-burnin", "1")
BANNER = re.compile(
    r"rank (\d+) of (\d+) \(local rank (\d+), pid (\d+)\) on (\S+) with (\w+): "
    r"envs seeded (\d+)\.\.(\d+)"
)
GLOO = ("--dist-backend", "gloo")  # what the ranks of every launch use (the CPU's default, named)
LAUNCH_TIMEOUT = 300
HELPER = ROOT / "tests" / "helpers" / "distributed_update.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def distributed_env():
    """A script's test environment, with gloo on the loopback interface."""
    return script_env() | {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}


def torchrun_command(launcher, program, *flags):
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher,
        str(program),
        *map(str, flags),
    ]


def standalone(nproc, program=SCRIPTS / f"{SCRIPT}.py"):
    return ["--standalone", "--nproc_per_node", str(nproc)], program


class Launch:
    """A torchrun launch in the background: its output collected, its ranks' banners parsed; `close`
    kills whatever is left of it (torchrun and every rank)."""

    def __init__(self, cmd, env=None):
        env = distributed_env() | (env or {})
        pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.proc = subprocess.Popen(cmd, cwd=RUNS_CWD, env=env, **pipes)
        self.output = ""

    def ranks(self):
        """{rank: (local_rank, pid, first env seed, last env seed)} from the banners in `output`."""
        return {
            int(m[1]): (int(m[3]), int(m[4]), int(m[7]), int(m[8]))
            for m in BANNER.finditer(self.output)
        }

    def wait_for(self, pattern, timeout):
        """Read the output until a line matches `pattern` (returns the match) or the launch ends
        (returns None); past `timeout` seconds the launch is killed, which ends it."""
        watchdog = threading.Timer(timeout, self.kill)
        watchdog.start()
        try:
            for line in self.proc.stdout:
                self.output += line
                if match := re.search(pattern, line):
                    return match
            return None
        finally:
            watchdog.cancel()

    def finish(self, timeout=LAUNCH_TIMEOUT):
        """Wait for the launch to end; its return code, with all its output in `output`."""
        rest, _ = self.proc.communicate(timeout=timeout)
        self.output += rest
        return self.proc.returncode

    def kill(self):
        """SIGKILL to torchrun and every rank it started."""
        kill_tree(self.proc.pid)

    def close(self):
        self.kill()
        self.proc.communicate()


@pytest.fixture
def launches():
    """Start torchrun launches with `launches(cmd)`; all are killed at the end of the test."""
    started = []

    def launch(cmd, env=None):
        started.append(Launch(cmd, env))
        return started[-1]

    yield launch
    for launch in started:
        launch.close()


def long_launch(launches, dist_timeout):
    """Two ranks on a budget they will not reach."""
    flags = ("--total-timesteps", "10000000", "--dist-timeout", str(dist_timeout))
    return launches(torchrun_command(*standalone(2), *TINY, *GLOO, *flags))


class Finished:
    """What `conftest.summary` reads: the SUMMARY lines of an output and an exit status."""

    def __init__(self, returncode, output):
        self.returncode, self.stdout, self.stderr = returncode, output, output


def test_two_ranks_train_in_lockstep_and_rank_0_reports(launches, tmp_path):
    """The README's one-machine line, compiled, with the early stop on KL (decided from the ranks'
    mean statistics, or they would diverge or wait forever), saving and evaluating on rank 0; a
    plain process then replays the saved model to the same evaluation returns."""
    flags = "--num-envs 2 --total-timesteps 1280 --compile --target-kl 0.001 --save-model"
    flags += " --eval-episodes 1 --dist-timeout 60"
    run = launches(torchrun_command(*standalone(2), *TINY, *GLOO, *flags.split()))
    result = summary(Finished(run.finish(), run.output))
    assert (result["world_size"], result["num_envs"], result["total_timesteps"]) == (2, 2, 1280)
    assert result["parameter_spread"] == 0.0, "the ranks' parameters drifted apart"
    # 5 iterations of 2 ranks x 2 envs x 64 steps; rank 0's two envs count one Pendulum episode each
    # (320 steps)
    assert result["episodes"] == 2 and -2000 < result["return_mean"] < 0
    assert result["compile"] is True and result["sps"] > 0
    # rank r steps the global envs seed + 2r .. seed + 2r + 1; only rank 0 prints a SUMMARY (checked
    # by `summary`)
    assert run.ranks().keys() == {0, 1}
    assert [run.ranks()[rank][2:] for rank in (0, 1)] == [(1, 2), (3, 4)]
    flags = (*TINY[:3], "--eval-model", result["model_file"], "--eval-episodes", "1")
    replayed = summary(run_script(SCRIPT, *flags, env=distributed_env()))
    assert replayed["eval_returns"] == result["eval_returns"]


def test_rank_and_seed_come_from_RANK_not_LOCAL_RANK(launches):
    """Two "machines" of one process each (two launches with --nnodes 2, a static rendezvous on
    loopback): both ranks have LOCAL_RANK 0. Keyed by LOCAL_RANK, as in CleanRL's multi-GPU script,
    both would seed the same envs and both would print a SUMMARY."""
    endpoint = f"127.0.0.1:{free_port()}"
    flags = (*TINY, *GLOO, *"--total-timesteps 1280 --dist-timeout 60".split())
    nodes = [
        launches(torchrun_command(
            [*f"--nnodes 2 --nproc_per_node 1 --node_rank {node} --rdzv_backend static".split(),
             "--rdzv_endpoint", endpoint],
            SCRIPTS / f"{SCRIPT}.py", *flags,
        ))
        for node in (0, 1)
    ]  # fmt: skip
    statuses = [node.finish() for node in nodes]
    assert statuses == [0, 0], nodes[0].output[-2000:] + nodes[1].output[-2000:]
    assert [list(node.ranks()) for node in nodes] == [[0], [1]]
    (local_0, _, *seeds_0), (local_1, _, *seeds_1) = nodes[0].ranks()[0], nodes[1].ranks()[1]
    assert (local_0, seeds_0, local_1, seeds_1) == (0, [1, 1], 0, [2, 2])
    assert "SUMMARY" not in nodes[1].output
    result = summary(Finished(0, nodes[0].output))
    want = (2, 1280, 0.0)
    assert (result["world_size"], result["total_timesteps"], result["parameter_spread"]) == want


def test_two_ranks_with_half_the_data_step_as_one_process_with_all(launches, tmp_path):
    """One epoch of 4 minibatch updates: 2 ranks, each with its half of every minibatch, against one
    process with the whole minibatches (tests/helpers/distributed_update.py arranges both). The
    ranks end bit-identical (the all-reduce gives every rank the same sum); against one process, the
    float32 sums differ in order only: 1e-6 absolute, 1e-5 relative. Without the all-reduce, or with
    a sum instead of the mean, the gradients differ by far more."""
    run = launches(torchrun_command(*standalone(2, HELPER), "update", tmp_path))
    assert run.finish() == 0, run.output[-3000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    for part in ("parameters", "grads"):
        for name in ranks[0][part]:
            assert torch.equal(ranks[0][part][name], ranks[1][part][name]), f"{part} {name}"
    single = distributed_update.train(load_script(SCRIPT), rank=0, world_size=1)
    for part in ("parameters", "grads"):
        torch.testing.assert_close(ranks[0][part], single[part], atol=1e-6, rtol=1e-5)


def test_a_whole_run_of_two_ranks_is_one_process_with_both_ranks_envs(launches):
    """`main` with its randomness taken out (tests/helpers/distributed_update.py): 2 ranks of 1 env
    against one process of 2 envs, 8 minibatch updates: rank 0's saved weights equal the
    process's to 1e-6 (3e-8 measured; another seed differs by ~1)."""
    flags = "--num-steps 64 --num-minibatches 4 --update-epochs 2 --total-timesteps 128"
    flags = (
        *TINY[:3],
        *GLOO,
        *flags.split(),
        *"--no-norm-adv --save-model --measure-burnin 0".split(),
    )
    run = launches(torchrun_command(*standalone(2, HELPER), "main", *flags, "--num-envs", "1"))
    ranks = summary(Finished(run.finish(), run.output))
    cmd = [sys.executable, str(HELPER), "main", *flags, "--num-envs", "2"]
    kwargs = dict(capture_output=True, text=True, cwd=RUNS_CWD, env=distributed_env())
    one = summary(subprocess.run(cmd, timeout=LAUNCH_TIMEOUT, **kwargs))
    assert (ranks["world_size"], ranks["total_timesteps"]) == (2, 128)
    assert (one["world_size"], one["total_timesteps"]) == (1, 128)
    weights = [torch.load(r["model_file"], weights_only=True)["model"] for r in (ranks, one)]
    torch.testing.assert_close(weights[0]["agent"], weights[1]["agent"], atol=1e-6, rtol=0)
    # rank 0's first env is the process's
    torch.testing.assert_close(weights[0]["obs_rms"], weights[1]["obs_rms"])


def test_one_process_without_torchrun_trains_as_the_twin():
    """Without torchrun there is no process group, and the run is the twin's, episode for
    episode."""
    flags = (*TINY, "--total-timesteps", "640", "--num-envs", "2")
    result, twin = (summary(run_script(name, *flags)) for name in (SCRIPT, TWIN))
    assert (result["world_size"], result["parameter_spread"], result["device"]) == (1, 0.0, "cpu")
    assert [point[::2] for point in result["curve"]] == [point[::2] for point in twin["curve"]]
    assert result["episodes"] == 2


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGSTOP], ids=["dies", "hangs"])
def test_a_rank_that_dies_or_hangs_ends_the_run(launches, stop):
    """Rank 1 killed or stopped mid-training: rank 0 does not wait forever (a hang ends after
    --dist-timeout with one line naming the cause) and the launch fails."""
    run = long_launch(launches, dist_timeout=5)
    # training, past the burn-in
    assert run.wait_for(r"sps +\d+", timeout=LAUNCH_TIMEOUT), run.output[-3000:]
    os.kill(run.ranks()[1][1], stop)
    if stop == signal.SIGSTOP:
        line = run.wait_for(r"error: rank 0: .*", timeout=60)
        assert line and "--dist-timeout" in line[0] and "Timed out" in line[0], run.output[-3000:]
        # else torchrun waits 30 s for the stopped rank to end
        os.kill(run.ranks()[1][1], signal.SIGKILL)
    status = run.finish(timeout=90)
    assert status != 0
    assert "SUMMARY" not in run.output and "[rank0]: Traceback" not in run.output, run.output[
        -3000:
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_every_rank_after_the_same_iteration(launches, signum):
    """The ranks agree where to stop (an all-reduce each iteration): rank 0 reports whole
    iterations, in lockstep, and each rank ends by itself (no SIGKILL from torchrun)."""
    run = long_launch(launches, dist_timeout=30)
    assert run.wait_for(r"sps +\d+", timeout=LAUNCH_TIMEOUT), run.output[-3000:]
    run.proc.send_signal(signum)
    # torchrun itself ends with status 1 after a signal, whatever its ranks did
    run.finish(timeout=90)
    result = summary(Finished(0, run.output))
    assert result["interrupted"] is True and result["parameter_spread"] == 0.0
    assert result["total_timesteps"] > 0 and result["total_timesteps"] % (2 * 64) == 0
    assert not re.search(r"\[rank\d\]: Traceback", run.output), run.output[-3000:]
    assert f"closing signal {signal.Signals(signum).name}" in run.output
    assert "SIGKILL" not in run.output


def test_a_signal_to_one_rank_alone_stops_every_rank_after_the_same_iteration(launches):
    """SIGTERM to rank 1 only: rank 0 learns of it in the iteration's all-reduce and reports whole
    iterations, in lockstep."""
    run = long_launch(launches, dist_timeout=30)
    assert run.wait_for(r"sps +\d+", timeout=LAUNCH_TIMEOUT), run.output[-3000:]
    os.kill(run.ranks()[1][1], signal.SIGTERM)
    run.finish(timeout=90)
    result = summary(Finished(0, run.output))
    assert result["interrupted"] is True and result["parameter_spread"] == 0.0
    assert result["total_timesteps"] > 0 and result["total_timesteps"] % (2 * 64) == 0
    assert not re.search(r"\[rank\d\]: Traceback", run.output), run.output[-3000:]


@pytest.mark.parametrize(
    "flags, env, words",
    [
        (("--dist-backend", "nccl", "--no-cuda"), {}, ("--dist-backend", "nccl")),
        (("--dist-backend", "mpi9"), {}, ("--dist-backend 'mpi9'",)),
        (("--dist-timeout", "0"), {}, ("--dist-timeout",)),
        (("--num-envs", "3", "--num-minibatches", "5"), {}, ("--num-minibatches", "(6144)")),
        ((), {"RANK": "1"}, ("RANK", "LOCAL_RANK", "WORLD_SIZE")),
        ((), {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ("RANK 2",)),
    ],
    ids="nccl-on-cpu unknown-backend zero-timeout minibatches-do-not-divide rank-alone".split()
    + ["rank-past-world"],
)
def test_bad_input_exits_2(flags, env, words, refused, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    refused(SCRIPT, ("--no-cuda", *flags), words)


def test_bad_input_under_torchrun_exits_2_on_every_rank_before_any_collective(launches):
    """A budget below one rollout of all ranks (2 x 64 steps): each rank says so and exits 2 before
    it joins the process group (no banner, which each rank prints once it has joined)."""
    run = launches(torchrun_command(*standalone(2), *TINY, *GLOO, "--total-timesteps", "100"))
    assert run.finish() != 0
    line = "error: --total-timesteps 100 is less than one rollout of all ranks"
    assert run.output.count(line) == 2, run.output[-3000:]
    assert not run.ranks() and not re.search(r"\[rank\d\]: Traceback", run.output)
    assert re.search(r"exitcode +: 2", run.output), run.output[-3000:]


@pytest.mark.parametrize(
    "environ, layout",
    [
        ({}, (0, 0, 1)),
        ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}, (0, 0, 1)),
        # machine 2 of 4 with 2 ranks each
        ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, (5, 1, 8)),
    ],
)
def test_process_layout_reads_the_global_rank_from_RANK(environ, layout):
    assert load_script(SCRIPT).process_layout(environ) == layout


def test_dist_timeout_is_the_groups_timeout(monkeypatch):
    """--dist-timeout is the process group's timeout: how long a gloo collective blocks, and how
    long NCCL's watchdog lets an nccl collective wait before it aborts the rank."""
    module = load_script(SCRIPT)
    calls = []
    init = lambda backend, **kwargs: calls.append((backend, kwargs))  # noqa: E731
    monkeypatch.setattr(module.dist, "init_process_group", init)
    module.start_process_group("nccl", 7.5)
    assert calls == [("nccl", {"timeout": timedelta(seconds=7.5)})]


def test_a_cuda_machine_gives_each_local_rank_its_gpu_and_nccl(monkeypatch, capsys):
    """What torchrun on a machine with one GPU gets (CUDA patched in): LOCAL_RANK 0 runs on cuda:0
    with nccl by default, LOCAL_RANK 1 has no GPU and exits 2 with one line, and --no-cuda puts
    every rank on the CPU with gloo (what every launch in this file does)."""
    module = load_script(SCRIPT)
    devices = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    monkeypatch.setattr(module.dist, "is_backend_available", lambda backend: True)
    assert module.rank_device(True, 0) == torch.device("cuda", 0) and devices == [0]
    assert module.dist_backend(module.Args(), torch.device("cuda", 0)) == "nccl"
    assert module.rank_device(False, 1) == torch.device("cpu")
    assert module.dist_backend(module.Args(cuda=False), torch.device("cpu")) == "gloo"
    with pytest.raises(SystemExit) as stop:
        module.rank_device(True, 1)
    assert stop.value.code == 2
    assert "LOCAL_RANK 1 has no GPU" in capsys.readouterr().err
