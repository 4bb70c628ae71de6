"""Checkpoints and `--resume`: a run stopped by SIGTERM at step k and resumed ends where a run that
went through ends, bit for bit on the CPU where the envs can be saved; and the faults: a truncated,
foreign or mismatched checkpoint exits 2 in one line, a finished run is not run again."""

import pytest
import torch

from tests.conftest import assert_same_state, checkpoint

# the DQN scripts on CartPole, their target networks updated after the stop too
DQN = (
    ("--env-id", "CartPole-v1", "--total-timesteps", 500, "--learning-starts", 200),
    ("--batch-size", 32, "--buffer-size", 1000, "--target-network-frequency", 50),
)
# script -> a short run's flags and the vector step at which the stopped run gets its SIGTERM
EXACT = {
    "sac_continuous_action": (
        ("--env-id", "Pendulum-v1", "--total-timesteps", 500, "--learning-starts", 200),
        ("--batch-size", 32, "--buffer-size", 1000),
        350,
    ),
    "td3_continuous_action_cpu": (
        ("--env-id", "Pendulum-v1", "--total-timesteps", 500, "--learning-starts", 200),
        ("--batch-size", 32, "--buffer-size", 1000, "--no-compile"),
        350,
    ),
    # what each hides: the pending buffer writes (one per 10 steps, 4 due at the stop) of the twin
    # and the CPU script, the random actions' generator of the eager script, the CPU script's step
    "dqn": (*DQN, 355),
    "dqn_torchcompile": (*DQN, 355),
    "dqn_cpu": (*DQN, ("--no-compile",), 355),
}
PENDULUM = ("--env-id", "Pendulum-v1", "--total-timesteps", 200, "--learning-starts", 100)
PENDULUM += ("--batch-size", 32, "--buffer-size", 1000)
CARTPOLE = ("--env-id", "CartPole-v1", "--total-timesteps", 200, "--learning-starts", 100)
CARTPOLE += ("--batch-size", 32, "--buffer-size", 1000)
# script -> a tiny run's flags: more than SMOKE_STOP vector steps, no compiling
SMOKE = {
    "sac_continuous_action_torchcompile": PENDULUM,
    "sac_continuous_action_cpu": (*PENDULUM, "--no-compile"),
    "td3_continuous_action": PENDULUM,
    "td3_continuous_action_torchcompile": PENDULUM,
    "td3_continuous_action_cpu": (*PENDULUM, "--no-compile"),
    "dqn": CARTPOLE,
    "dqn_torchcompile": CARTPOLE,
    "dqn_cpu": (*CARTPOLE, "--no-compile"),
}
SMOKE_STOP = 150  # the vector step during which the first run gets its SIGTERM


def same_runs(a, b):
    """Runs that end in the same state: the final checkpoints' training states (but the pickled
    envs, whose episode statistics hold clock times), steps, curves (steps and returns) and last
    returns."""
    assert a["final"] and b["final"]
    for saved in (a, b):
        envs = saved["state"].get("envs")
        saved["state"]["envs"] = envs and (type(envs[0]), *envs[1:])
    assert_same_state(a["state"], b["state"])
    assert (a["step"], a["returns"]) == (b["step"], b["returns"])
    assert [(s, r) for s, _, r in a["curve"]] == [(s, r) for s, _, r in b["curve"]]


@pytest.mark.parametrize("script", EXACT)
def test_a_resumed_run_ends_as_one_that_went_through(script, train, tmp_path):
    *flags, stop_at = EXACT[script]
    flags = [flag for group in flags for flag in group]
    assert train(script, *flags, "--run-name", "through") == 0
    assert train(script, *flags, "--run-name", "stopped", stop_at=stop_at) == 143
    stopped = checkpoint(tmp_path / "runs" / "stopped")
    assert not stopped["final"] and stopped["step"] == stop_at * 1
    assert train(script, *flags, "--resume", tmp_path / "runs" / "stopped") == 0
    resumed = checkpoint(tmp_path / "runs" / "stopped")
    assert resumed["resumes"] == [dict(step=stop_at, fresh_episodes=False)]
    same_runs(checkpoint(tmp_path / "runs" / "through"), resumed)


@pytest.mark.parametrize("script", SMOKE)
def test_a_run_stopped_by_sigterm_resumes_to_its_end(script, train):
    flags = (*SMOKE[script], "--run-name", "smoke")
    assert train(script, *flags, stop_at=SMOKE_STOP) == 143
    stopped = checkpoint("runs/smoke")
    assert not stopped["final"] and stopped["iteration"] == SMOKE_STOP
    assert train(script, *flags, "--resume", "auto") == 0
    resumed = checkpoint("runs/smoke")
    total_timesteps = flags[flags.index("--total-timesteps") + 1]
    assert resumed["final"] and resumed["step"] == total_timesteps
    assert [resume["step"] for resume in resumed["resumes"]] == [stopped["step"]]


SHORT = ("--env-id", "Pendulum-v1", "--total-timesteps", 300, "--learning-starts", 100)
SHORT += ("--batch-size", 32, "--buffer-size", 1000)


def assert_one_error_line(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for word in words:
        assert word in err[0], err[0]


def test_resume_auto_starts_then_continues_and_a_finished_run_is_not_run_again(train, capsys):
    """The cluster's requeue: the same command line starts the run, then continues it after a
    SIGTERM; once finished, it says so and exits 0. A named folder that holds a checkpoint is not
    overwritten by a run without --resume."""
    flags = (*SHORT, "--run-name", "job", "--resume", "auto")
    assert train("sac_continuous_action", *flags, stop_at=150) == 143
    assert checkpoint("runs/job")["step"] == 150
    assert train("sac_continuous_action", *flags) == 0
    saved = checkpoint("runs/job")
    assert saved["final"] and saved["step"] == 300 and len(saved["resumes"]) == 1
    capsys.readouterr()
    assert train("sac_continuous_action", *flags) == 0
    assert "the run finished at step 300; nothing to resume" in capsys.readouterr().out
    assert train("sac_continuous_action", *SHORT, "--run-name", "job") == 2
    assert_one_error_line(capsys, "runs/job/checkpoint.pt exists", "--resume auto")
    # --total-timesteps may grow: the finished run goes on from its last step
    assert train("sac_continuous_action", *flags[:3], 400, *flags[4:]) == 0
    assert checkpoint("runs/job")["step"] == 400
    assert checkpoint("runs/job")["resumes"][-1] == dict(step=300, fresh_episodes=False)


def test_bad_checkpoints_exit_2_in_one_line(train, capsys, tmp_path):
    """A truncated, foreign or mismatched checkpoint, and --resume auto without a name, exit 2
    before training; a temporary file left by a write that was killed is ignored."""
    assert train("sac_continuous_action", *SHORT, "--run-name", "a", stop_at=150) == 143
    good = (tmp_path / "runs/a/checkpoint.pt").read_bytes()
    (tmp_path / "runs/a/checkpoint.pt.tmp").write_bytes(good[: len(good) // 2])
    capsys.readouterr()
    mismatched = [*SHORT[:-1], 999]
    assert train("sac_continuous_action", *mismatched, "--resume", "runs/a") == 2
    assert_one_error_line(capsys, "--buffer-size 1000")
    torch.save(checkpoint("runs/a") | dict(script="td3_continuous_action"), "td3.pt")
    assert train("sac_continuous_action", *SHORT, "--resume", "td3.pt") == 2
    assert_one_error_line(capsys, "written by td3_continuous_action")
    assert train("sac_continuous_action", *SHORT, "--resume", "auto") == 2
    assert_one_error_line(capsys, "--resume auto needs --run-name")
    (tmp_path / "truncated.pt").write_bytes(good[: len(good) // 2])
    (tmp_path / "foreign.pt").write_bytes(b"not a checkpoint")
    for path in ("truncated.pt", "foreign.pt", "missing.pt"):
        assert train("sac_continuous_action", *SHORT, "--resume", path) == 2
        assert_one_error_line(capsys, f"--resume {path} is not a checkpoint")
    assert train("sac_continuous_action", *SHORT, "--resume", "runs/a/checkpoint.pt") == 0
    assert checkpoint("runs/a")["step"] == 300
