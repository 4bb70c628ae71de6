"""CleanRL's TensorBoard scalars, written by torch's `SummaryWriter`: every run writes its
algorithm's tags as CleanRL's script writes them, and the hyperparameters' table, to
`runs/<run_name>/` (a seeds script: one folder per member under it), read back here with
TensorBoard's own reader and from TensorBoard's server over HTTP; `--no-tensorboard` writes no event
file and imports no TensorBoard."""

import json
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import SCRIPTS, run_script, script_env, slow_unless, summary
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# DQN on CartPole past its first updates, eagerly: short episodes, losses logged every 100 steps
DQN = ("--total-timesteps", 1500, "--learning-starts", 1000, "--no-compile")
# CleanRL's tags, each `writer.add_scalar` of its script (cleanrl/<script>.py of vwxyzjn/cleanrl
# at fe8d8a0, 2026-04-20); `eval/episodic_return` where it evaluates the trained policy
CHARTS = ("charts/episodic_return", "charts/episodic_length", "charts/SPS")
QF = ("losses/qf1_values", "losses/qf2_values", "losses/qf1_loss", "losses/qf2_loss")
QF += ("losses/qf_loss", "losses/actor_loss")
CLEANRL_TAGS = {
    "sac_continuous_action": (*CHARTS, *QF, "losses/alpha", "losses/alpha_loss"),
    "td3_continuous_action": (*CHARTS, *QF, "eval/episodic_return"),
    "dqn": (*CHARTS, "losses/td_loss", "losses/q_values", "eval/episodic_return"),
    "pqn": (*CHARTS, "losses/td_loss", "losses/q_values"),
    "ppo_continuous_action": (
        *CHARTS,
        "charts/learning_rate",
        *("losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl"),
        *("losses/approx_kl", "losses/clipfrac", "losses/explained_variance"),
        "eval/episodic_return",
    ),
}
PENDULUM = ("--env-id", "Pendulum-v1", "--total-timesteps", 300, "--learning-starts", 100)
# runs that reach the updates, log with the sps clock started, end an episode and, where CleanRL
# evaluates, evaluate one episode
TINY = {
    "sac_continuous_action": (*PENDULUM, "--batch-size", 32),
    "td3_continuous_action": (*PENDULUM, "--batch-size", 32, "--eval-episodes", 1),
    "dqn": (*DQN[:4], "--eval-episodes", 1),
    "pqn": ("--total-timesteps", 512, "--num-envs", 4, "--num-steps", 32),
    "ppo_continuous_action": ("--env-id", "Pendulum-v1", "--total-timesteps", 1024)
    + ("--num-steps", 64, "--num-minibatches", 2, "--eval-episodes", 1),
}
SCRIPT_TAGS = [(algo + variant, algo) for algo in TINY for variant in ("", "_torchcompile", "_cpu")]


def events(folder):
    """Every scalar and text summary of the event files in `folder` (all of them: no sampling)."""
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def scalars(accumulator, tag):
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def assert_cleanrl_charts(accumulator, curve, losses, flags):
    """CleanRL's tags; the episodes as the summary's curve has them (CartPole's returns and lengths
    are whole numbers: float32 holds them exactly), and the flags' table."""
    tags = set(accumulator.Tags()["scalars"])
    assert {"charts/episodic_return", "charts/episodic_length", "charts/SPS"} <= tags
    assert {f"losses/{name}" for name in losses} <= tags
    returns = scalars(accumulator, "charts/episodic_return")
    assert returns == [(step, episodic_return) for step, _, episodic_return in curve]
    # an episode of CartPole has a step per point of return
    assert scalars(accumulator, "charts/episodic_length") == returns
    # from the end of the burn-in (a resumed run's: from its start), as the summary's sps
    sps = [value for _, value in scalars(accumulator, "charts/SPS")]
    assert sps and sps[-1] > 0 and min(sps) >= 0
    text = accumulator.Tensors("hyperparameters/text_summary")[-1]  # a resumed run's: its own
    table = text.tensor_proto.string_val[0].decode()
    assert table.startswith("|param|value|\n|-|-|\n")
    assert all(f"|{flag}|{value}|" in table for flag, value in flags.items())


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory):
    """A short dqn_cpu run's summary and folder."""
    cwd = tmp_path_factory.mktemp("tensorboard")
    result = summary(run_script("dqn_cpu", *DQN, "--run-name", "tb", cwd=cwd))
    return result, cwd / "runs" / "tb"


def test_a_run_writes_cleanrls_scalars_and_its_returns_are_the_summarys_curve(dqn_run):
    result, folder = dqn_run
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    assert result["episodes"] > 10
    flags = dict(env_id="CartPole-v1", seed=1, learning_starts=1000, tensorboard=True)
    assert_cleanrl_charts(events(folder), result["curve"], ["td_loss", "q_values"], flags)


# the quick tier keeps each algorithm's eager script
@pytest.mark.parametrize(
    "script, algo",
    slow_unless(lambda case: case[0] == case[1], SCRIPT_TAGS, [s for s, _ in SCRIPT_TAGS]),
)
def test_every_script_writes_the_tags_of_cleanrls_script(script, algo, tmp_path):
    """Each script of SAC, TD3, DQN, PQN and PPO continuous writes every tag that CleanRL's script
    of its algorithm writes (more of its own may come beside them)."""
    flags = (*TINY[algo], "--no-compile") if script.endswith("_cpu") else TINY[algo]
    summary(run_script(script, *flags, "--run-name", "tags", cwd=tmp_path))
    tags = set(events(tmp_path / "runs" / "tags").Tags()["scalars"])
    assert not set(CLEANRL_TAGS[algo]) - tags, sorted(tags)


def tensorboard_url(proc, timeout):
    """The address that a starting `tensorboard` prints on stderr: it chose a free port itself."""
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if found:
            return found.group(0)
    pytest.fail(f"tensorboard printed no address in {timeout} s")


def test_tensorboard_serves_a_runs_tags_over_http(dqn_run):
    """The pinned tensorboard starts (2.20.0 did not beside today's setuptools) on the run folder,
    on loopback and a free port, and its scalars API lists the run's tags; it is killed at the
    end, whatever happens."""
    _, folder = dqn_run
    command = [str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(folder)]
    command += ["--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=script_env())
    try:
        url = tensorboard_url(proc, timeout=60) + "/data/plugin/scalars/tags"
        deadline, tags = time.monotonic() + 60, {}
        while time.monotonic() < deadline and "losses/td_loss" not in tags:
            with urllib.request.urlopen(url, timeout=10) as response:
                tags = json.load(response).get(".", {})
            time.sleep(0.5)
        assert {"charts/episodic_return", "charts/SPS", "losses/td_loss"} <= set(tags), tags
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_seeds_run_writes_one_series_per_member(tmp_path):
    flags = ("--num-seeds", 2, "--learning-starts", 1000, "--total-timesteps", 1500)
    result = summary(
        run_script("dqn_seeds", *flags, "--no-compile", "--run-name", "tb", cwd=tmp_path)
    )
    folder = tmp_path / "runs" / "tb"
    assert not list(folder.glob("events.out.tfevents.*"))
    for seed, curve in zip(result["seeds"], result["curves"]):
        member = folder / f"seed{seed}"
        assert len(list(member.glob("events.out.tfevents.*"))) == 1
        assert len(curve) > 5
        assert_cleanrl_charts(events(member), curve, ["td_loss"], dict(seed=seed, num_seeds=2))


def test_no_tensorboard_writes_no_event_file_and_imports_no_tensorboard(tmp_path):
    """The script run as `python dqn_cpu.py`, which says at its exit whether anything imported
    TensorBoard."""
    script = str(SCRIPTS / "dqn_cpu.py")
    argv = [script, *map(str, DQN), "--run-name", "off", "--no-tensorboard"]
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('IMPORTED', 'tensorboard' in sys.modules))\n"
        f"sys.argv = {argv!r}\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    kwargs = dict(capture_output=True, text=True, env=script_env(), cwd=tmp_path)
    proc = subprocess.run([sys.executable, "-c", code], timeout=900, **kwargs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "IMPORTED False" in proc.stdout
    folder = tmp_path / "runs" / "off"
    assert (folder / "summary.json").exists()
    assert not list(Path(folder).rglob("events.out.tfevents.*"))


def test_a_resumed_run_continues_the_series_without_repeating_a_step(train, tmp_path):
    """Stopped by SIGTERM, then resumed: one series, the whole run's curve once (what the first
    process logged past its checkpoint is hidden: `purge_step`)."""
    assert train("dqn_cpu", *DQN, "--run-name", "job", stop_at=1200) == 143
    assert train("dqn_cpu", *DQN, "--run-name", "job", "--resume", "auto") == 0
    folder = tmp_path / "runs" / "job"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2
    result = json.loads((folder / "summary.json").read_text())
    assert len(result["resumes"]) == 1
    assert_cleanrl_charts(events(folder), result["curve"], ["td_loss"], dict(seed=1))
