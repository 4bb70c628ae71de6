"""PPO on Ray env runners: a fragment has the right shapes and the true final observations; one
runner with a fixed seed yields the transitions of the same envs stepped here; runs learn-step
on a joined cluster and on a local one, double-buffered or not, with no Ray process left behind;
a killed runner is replaced and the run goes on; Ctrl-C or SIGTERM stops after the iteration
with a summary and exit 130 or 143, and the runners end; a run stopped by SIGTERM resumes with
its learner restored and fresh episodes; the scaling benchmark runs on a tiny budget; bad input
exits 2 (a bad --env-id before Ray starts).

One Ray head serves every test here: `ray start --head --block` on loopback with 2 CPUs, in its
own process group, killed as a group at the end of the module. Scripts join it with
--ray-address; this process joins it for the runner tests. Runs that test CPU behaviour pin
--no-cuda; the joined-cluster runs keep --cuda and check the learner's device (cuda where there
is one), so a GPU machine runs them too."""

import functools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    SCRIPTS,
    assert_user_error,
    checkpoint,
    load_script,
    run_script,
    script_env,
    summary,
)

SCRIPT = "ppo_continuous_action_ray"
# Pendulum-v1 truncates every 200 steps: 2 runners x 1 env x 200 steps an iteration, 4 iterations, 8
# episodes
SMOKE = ("--no-cuda", "--env-id", "Pendulum-v1", "--total-timesteps", "1600", "--num-steps", "200")
SMOKE += ("--num-minibatches", "4", "--update-epochs", "2", "--measure-burnin", "1")
# what the head, this process and the scripts joining the head run with: Ray keeps to 127.0.0.1 only
# with the first (see connect_ray); the head requires a token (Ray 2.60's default for a new
# cluster), this session's own
CLUSTER = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}
CLUSTER["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


BENCHMARK = [sys.executable, "-m", "benchmarks.studies.ray_scaling"]
CAPTURED = dict(cwd=ROOT, capture_output=True, text=True, timeout=60)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_processes():
    """Pids of the processes whose command line names Ray (its servers and workers: `ray::...`)."""
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith("ray::") or "site-packages/ray/" in cmdline:
            pids.add(int(pid))
    return pids


@pytest.mark.slow  # starts and stops a local Ray instance (22 s here)
def test_local_instance_leaves_no_ray_process(tmp_path):
    """First in the file: before the session's head starts, so that every Ray process that appears
    is the run's."""
    before = ray_processes()
    result = summary(
        run_script(SCRIPT, *SMOKE, "--total-timesteps", 800, cwd=tmp_path, timeout=300)
    )
    assert (result["total_timesteps"], result["episodes"], result["runner_restarts"]) == (800, 4, 0)
    time.sleep(2)
    assert ray_processes() - before == set(), "Ray processes of the local instance outlived the run"


@pytest.fixture(scope="module")
def ray_head():
    """host:port of a Ray head on loopback with 2 CPUs, for this module (the only one that needs
    Ray: one head per session), so the rest of the suite runs without it; its process group is
    killed at the end."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="lrt-")  # short: Ray's socket paths live under it
    # this interpreter's Ray, not the first `ray` on the PATH
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block"]
    cmd += ["--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2"]
    cmd += ["--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp_dir]
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    head = subprocess.Popen(cmd, env=script_env() | CLUSTER, **quiet)
    try:
        deadline = time.time() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None and time.time() < deadline, "no Ray head within 90 s"
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops what it started
        try:
            # its stop took over 30 s once in CI: after 5 s the whole group is killed instead
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
        time.sleep(1)
        try:
            os.killpg(head.pid, signal.SIGKILL)  # anything of the group still there
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def ray_here(ray_head):
    """This process joined to the session's head as the script joins it (`connect_ray`, which
    ships the run module to the workers); the script's module, whose runner Ray ships by value."""
    saved = {key: os.environ.get(key) for key in CLUSTER}
    os.environ.update(CLUSTER)
    module = load_script(SCRIPT)
    ray = module.connect_ray(ray_head)
    ray.cloudpickle.register_pickle_by_value(module)  # the workers cannot import it by name
    yield ray, module
    ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key)
        else:
            os.environ[key] = value


def policy(module, n_obs, n_act, seed=0):
    """Weights (an agent seeded `seed`) and observation statistics far from the identity, as the
    learner ships them."""
    torch.manual_seed(seed)
    agent = module.Agent(n_obs, n_act)
    obs_rms = {"mean": np.linspace(-0.5, 0.5, n_obs), "var": np.linspace(0.5, 2.0, n_obs)}
    return agent, {"agent": agent.state_dict(), "obs_rms": obs_rms}


def test_runners_import_the_run_modules_that_the_job_ships(ray_here):
    """A runner imports `vector_envs`, and it `flags`, by name. Ray puts the driver's folder on its
    workers' paths, which another machine may not have, and this driver's is not leanrl/: the
    modules the workers find are the copies that `connect_ray` ships with the job."""
    ray, _ = ray_here
    for name in ("vector_envs", "flags"):
        where = ray.get(ray.remote(lambda n: __import__(n).__file__).remote(name), timeout=120)
        assert os.path.basename(where) == f"{name}.py", where
        assert os.path.dirname(where) != str(SCRIPTS), where


def test_fragment_shapes_and_true_final_observations(ray_here):
    ray, module = ray_here
    runner = ray.remote(module.EnvRunner).options(num_cpus=0).remote("Pendulum-v1", 2, 3, 0.99)
    _, state = policy(module, 3, 1)
    fragment = ray.get(runner.sample.remote(state, 250), timeout=120)
    shapes = {
        key: tuple(value.shape)
        for key, value in fragment.items()
        if key not in ("episodes", "runner")
    }
    assert shapes == {
        "obs": (250, 2, 3),
        "raw_obs": (250, 2, 3),
        "final_obs": (250, 2, 3),
        "actions": (250, 2, 1),
        "logprobs": (250, 2),
        "rewards": (250, 2),
        "terminations": (250, 2),
        "truncations": (250, 2),
        "next_obs": (2, 3),
    }
    # both envs are cut at their 200th step (index 199), nowhere else; Pendulum never terminates
    assert fragment["truncations"].nonzero().tolist() == [[199, 0], [199, 1]]
    assert not fragment["terminations"].any()
    assert [step for step, _ in fragment["episodes"]] == [199, 199]
    ended = np.zeros(250, dtype=bool)
    ended[199] = True
    # inside an episode the true next observation is the next step's; at the cut it is the final
    # one, not the reset
    torch.testing.assert_close(fragment["final_obs"][~ended][:-1], fragment["obs"][1:][~ended[:-1]])
    assert not torch.allclose(fragment["final_obs"][199], fragment["obs"][200])
    torch.testing.assert_close(fragment["final_obs"][-1], fragment["next_obs"])
    normalized = module.normalize(fragment["raw_obs"].numpy(), state["obs_rms"])
    torch.testing.assert_close(fragment["obs"], torch.from_numpy(normalized))


def test_runner_yields_the_transitions_of_the_same_envs_stepped_here(ray_here):
    """Runner seeded 5 with 2 envs, two calls of 150 and 100 steps, against the same envs (seeds 5,
    6), the same weights and the same torch seed stepped in this process: equal actions,
    log-probabilities, observations, rewards, ends, final observations and episode returns."""
    ray, module = ray_here
    runner = ray.remote(module.EnvRunner).options(num_cpus=0).remote("Pendulum-v1", 2, 5, 0.99)
    agent, state = policy(module, 3, 1, seed=1)
    first = ray.get(runner.sample.remote(state, 150), timeout=120)
    second = ray.get(runner.sample.remote(state, 100), timeout=120)
    remote = {
        key: torch.cat([first[key], second[key]])
        for key in first
        if key not in ("episodes", "next_obs", "runner")
    }

    torch.manual_seed(5)
    envs = module.make_envs("Pendulum-v1", 2, 5, wrap=functools.partial(module.wrap, gamma=0.99))
    next_obs, _ = envs.reset(seed=5)
    local = {key: [] for key in remote}
    episodes = []
    for step in range(250):
        obs = module.normalize(next_obs, state["obs_rms"])
        with torch.no_grad():
            action, logprob, _ = agent.get_action(torch.from_numpy(obs))
        local["raw_obs"].append(next_obs)
        local["obs"].append(obs)
        local["actions"].append(action.numpy())
        local["logprobs"].append(logprob.numpy())
        next_obs, reward, terminated, truncated, infos = envs.step(action.numpy())
        local["rewards"].append(reward)
        local["terminations"].append(terminated)
        local["truncations"].append(truncated)
        local["final_obs"].append(
            module.normalize(module.true_next_obs(next_obs, infos), state["obs_rms"])
        )
        episodes += [(step, r) for r in module.finished_episodes(infos)]
    for key, values in local.items():
        expected = torch.as_tensor(np.stack(values)).to(remote[key].dtype)
        torch.testing.assert_close(remote[key], expected, msg=lambda m, key=key: f"{key}: {m}")
    remote_episodes = first["episodes"] + [(step + 150, r) for step, r in second["episodes"]]
    assert remote_episodes == pytest.approx(episodes) and len(episodes) == 2


@pytest.mark.parametrize(
    "flags",
    [(), ("--double-buffer", "--env-id", "gymnasium.envs.classic_control:Pendulum-v1")],
    ids=["batched", "double-buffer-module-env-id"],
)
def test_run_on_a_joined_cluster(ray_head, flags, tmp_path):
    """Learns on the cluster (the second run with gymnasium's `module:EnvId` form, which every
    runner imports), with the default --cuda: the learner on the GPU where there is one."""
    result = summary(
        run_script(
            SCRIPT,
            *SMOKE[1:],  # --cuda, the default
            "--ray-address",
            ray_head,
            "--save-model",
            "--eval-episodes",
            "1",
            *flags,
            cwd=tmp_path,
            timeout=300,
            env=CLUSTER,
        )
    )
    assert result["script"] == SCRIPT and result["double_buffer"] is bool(flags)
    assert result["device"] == "cpu"  # a script a test launches sees no GPU (conftest.script_env)
    assert (result["num_runners"], result["num_envs"], result["total_timesteps"]) == (2, 2, 1600)
    # 2 envs x 800 steps, 200 steps an episode
    assert result["episodes"] == 8 and result["runner_restarts"] == 0
    assert -2000 < result["return_mean"] < 0 and len(result["eval_returns"]) == 1
    assert 50 < result["runner_memory_mib"] < 2000
    saved = torch.load(result["model_file"], weights_only=True)
    assert saved["script"] == SCRIPT and set(saved["model"]) == {"agent", "obs_rms"}
    # the learner's statistics moved from their start (mean 0, variance 1) with the 1600
    # observations
    assert saved["model"]["obs_rms"]["count"] == pytest.approx(1600, abs=1)
    assert saved["model"]["obs_rms"]["var"].min() < 0.9


def runner_pids(title=b"ray::EnvRunner.sample"):
    """Pids of env runners busy sampling (Ray titles an actor's process with the method it runs),
    or of any process whose title starts with `title`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(title):
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def start_run(tmp_path, *flags):
    """The script started in the background, joined to the session's head with `flags`, its output
    piped."""
    cmd = [sys.executable, str(ROOT / "leanrl" / f"{SCRIPT}.py"), *flags]
    env = script_env() | CLUSTER
    return subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_sampling(proc, timeout=120):
    """The pids of the runners sampling, once one is (at most `timeout` s, and while `proc`
    runs)."""
    deadline = time.time() + timeout
    while not (sampling := runner_pids()):
        assert proc.poll() is None and time.time() < deadline, "no runner sampling"
        time.sleep(0.01)
    return sampling


def finish(proc, timeout):
    """`proc` waited for, at most `timeout` s, as a CompletedProcess."""
    stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def stop(proc):
    """`proc` killed if it still runs (a failed test leaves no learner behind; Ray then ends its
    runners)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def test_killed_runner_is_replaced_and_training_goes_on(ray_head, tmp_path):
    """A runner killed (SIGKILL) while it samples: Ray restarts it, its fragment is sampled again,
    the run ends with every step it asked for and one restart reported."""
    proc = start_run(
        tmp_path, *SMOKE, "--total-timesteps", "12000", "--double-buffer", "--ray-address", ray_head
    )
    try:
        wait_for_sampling(proc)
        time.sleep(1.0)  # a few iterations in (30 in all)
        os.kill(wait_for_sampling(proc)[0], signal.SIGKILL)
        result = summary(finish(proc, timeout=300))
    finally:
        stop(proc)
    assert result["runner_restarts"] == 1, "the kill must land during a run of 30 iterations"
    assert result["total_timesteps"] == 12000 and not result["interrupted"]
    assert -2000 < result["return_mean"] < 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_after_the_iteration_and_the_runners_end(
    ray_head, tmp_path, signum
):
    """SIGINT or SIGTERM to the learner while its runners sample: it ends the iteration, reports it
    (interrupted, whole iterations of 400 steps) and exits 130 or 143, and its runners end with it.
    (ray.init puts a SIGTERM handler of its own, an exit at once; the script puts its own back.)"""
    proc = start_run(tmp_path, *SMOKE, "--total-timesteps", "1000000", "--ray-address", ray_head)
    try:
        wait_for_sampling(proc)
        proc.send_signal(signum)
        result = summary(finish(proc, timeout=120), returncode=128 + signum)
    finally:
        stop(proc)
    assert result["interrupted"] is True and result["total_timesteps"] % 400 == 0
    deadline = time.time() + 30
    while runner_pids(b"ray::EnvRunner"):
        assert time.time() < deadline, "the runners outlived the run"
        time.sleep(0.5)


def test_a_resumed_run_restores_the_learner_and_its_runners_start_fresh_episodes(
    ray_head, tmp_path
):
    """SIGTERM while the runners sample: the checkpoint keeps the learner and the observation
    statistics. Resumed for 2 more iterations, the run ends there, its statistics and Adam's steps
    go on from the checkpoint's, and its runners' episodes start at the resumed step. (That the
    weights come back bit for bit is tested on the eager script, whose `Run` is this one.)"""
    flags = (*SMOKE, "--ray-address", ray_head, "--run-name", "job")
    proc = start_run(tmp_path, *flags, "--total-timesteps", "1000000")
    try:
        wait_for_sampling(proc)
        proc.send_signal(signal.SIGTERM)
        summary(finish(proc, timeout=120), returncode=143)
    finally:
        stop(proc)
    stopped = checkpoint(tmp_path / "runs/job")
    step, learner = stopped["step"], stopped["state"]["learner"]
    more = ("--total-timesteps", str(step + 800), "--resume", "runs/job")
    result = run_script(SCRIPT, *flags, *more, cwd=tmp_path, timeout=300, env=CLUSTER)
    assert summary(result)["total_timesteps"] == step + 800
    resumed = checkpoint(tmp_path / "runs/job")
    assert resumed["final"] and resumed["resumes"] == [dict(step=step, fresh_episodes=True)]
    statistics = stopped["state"]["obs_rms"]
    assert resumed["state"]["obs_rms"]["count"] == statistics["count"] + 800
    adam_steps = [s["step"] for s in resumed["state"]["learner"]["optimizer"]["state"].values()]
    assert adam_steps == [s["step"] + 2 * 2 * 4 for s in learner["optimizer"]["state"].values()]
    # 2 runners x 1 env, 200 steps an episode: fresh ones end 400 and 800 steps after the resume
    ends = [s for s, _, _ in resumed["curves"][0] if s > step]
    assert ends == [step + 400, step + 400, step + 800, step + 800]


def test_benchmark_tiny_budget(ray_head, tmp_path):
    cmd = [*BENCHMARK, "--quick", "--kinds", "sleep", "--durations", "0.002"]
    cmd += ["--ray-address", ray_head, "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=script_env() | CLUSTER, **CAPTURED | {"timeout": 300})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = result["rows"]
    envs = {"per-step": 1, "batched": 4, "double-buffered": 4}  # per runner
    cells = [(design, n, n * k) for n in (1, 2) for design, k in envs.items()]
    assert [(r["design"], r["runners"], r["envs"]) for r in rows] == cells
    for r in rows:
        # sleeping: one env at a time per runner
        assert r["ideal_sps"] == pytest.approx(r["runners"] / 0.002)
        assert r["efficiency"] == pytest.approx(r["sps"] / r["ideal_sps"])
        assert 0 < r["efficiency"] <= 1.02, r  # a sleeping env cannot step faster than its duration
        assert r["num_steps"] == 5  # T: 0.04 s of env time in a fragment of 4 envs of 2 ms
    assert 50 < result["worker_memory_mib"] < 2000
    assert (tmp_path / next(tmp_path.glob("*.png")).name).stat().st_size > 0
    assert "| sleep | double-buffered | 2 | 8 | 0.002 | 5 |" in proc.stdout


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--num-runners", "0"), ("--num-runners",)),
        (("--env-id", "NoSuchEnv-v0"), ("--env-id", "NoSuchEnv-v0")),
        (("--env-id", "no_such_module:Pendulum-v1"), ("--env-id", "no_such_module")),
        (("--capture-video",), ("--capture-video", "--eval-episodes")),
        (("--ray-address", "nonsense"), ("--ray-address", "host:port")),
    ],
    ids=[
        "zero-runners",
        "unknown-env",
        "missing-env-module",
        "video-without-eval",
        "address-not-host-port",
    ],
)
def test_bad_input_exits_2(flags, words, refused):
    refused(SCRIPT, flags, words)


def test_a_silent_runner_ends_the_run_in_one_line_naming_it_and_the_timeout():
    """`gather` waits --ray-timeout for each runner's fragment; past it the run ends with exit
    status 1 (a `sys.exit` with the line) and one line that names the runner and the flag, the
    contract for a timeout, which valid flags meet on a machine too busy to answer in time."""
    import ray

    module = load_script(SCRIPT)
    waited = []

    def get(call, timeout):
        waited.append((call, timeout))
        if call == "second":
            raise ray.exceptions.GetTimeoutError()
        return call

    fake = types.SimpleNamespace(get=get, exceptions=ray.exceptions)
    args = module.Args(ray_timeout=30.5)
    with pytest.raises(SystemExit) as stop:
        module.gather(fake, [None, None], ["first", "second"], None, args)
    assert stop.value.code == "error: runner 1 sent nothing in --ray-timeout 30.5 s"
    assert waited == [("first", 30.5), ("second", 30.5)]


@pytest.mark.slow  # waits out Ray's connection attempt (9 s here)
def test_unreachable_address_exits_2_at_once():
    """Nothing listens on the port: one line, exit 2, well within the 60 s timeout (Ray alone
    retries for minutes)."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = run_script(SCRIPT, "--ray-address", address, timeout=60)
    assert_user_error(proc, "--ray-address", str(port))
    bench = subprocess.run([*BENCHMARK, "--ray-address", address], env=script_env(), **CAPTURED)
    assert_user_error(bench, "--ray-address")


def test_more_runners_than_the_cluster_has_cpus_exits_2(ray_head):
    flags = (*SMOKE, "--num-runners", 3, "--ray-address", ray_head)
    proc = run_script(SCRIPT, *flags, env=CLUSTER, timeout=120)
    assert_user_error(proc, "--num-runners 3", "the Ray cluster has 2")


@pytest.mark.parametrize(
    "flags, words",
    [(("--kinds", "fast"), ("--kinds", "fast")), (("--runners", "0"), ("--runners",))],
    ids=["unknown-kind", "zero-runners"],
)
@pytest.mark.slow  # the benchmark imports Ray (5-6 s here)
def test_benchmark_bad_input_exits_2(flags, words):
    proc = subprocess.run([*BENCHMARK, *flags], env=script_env(), **CAPTURED)
    assert_user_error(proc, *words)
