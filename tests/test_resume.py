"""Checkpoints and `--resume`: a run stopped by SIGTERM at step k and resumed ends where a run that
went through ends, bit for bit on the CPU where the envs can be saved; and the faults: a truncated,
foreign or mismatched checkpoint exits 2 in one line, a finished run is not run again."""

import copy
import json
import signal
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from envpool.python.envpool import EnvPoolMixin
from test_ppo_continuous_action_distributed import (
    GLOO,
    LAUNCH_TIMEOUT,
    RUNS_CWD,  # where its launches run (`conftest`'s, not `tests.conftest`'s)
    TINY,
    Finished,
    launches,  # noqa: F401 (a fixture)
    standalone,
    torchrun_command,
)

from tests.conftest import assert_same_state, checkpoint, summary

# script -> a short run's flags and the vector step at which the stopped run gets its SIGTERM
EXACT = {
    "sac_continuous_action": (
        ("--env-id", "Pendulum-v1", "--total-timesteps", 500, "--learning-starts", 200),
        ("--batch-size", 32, "--buffer-size", 1000),
        350,
    ),
    # one process, without torchrun: its envs travel in the checkpoint's `ranks`; stopped in the
    # last step of its 2nd iteration
    "ppo_continuous_action_distributed": (
        ("--no-cuda", "--env-id", "Pendulum-v1", "--total-timesteps", 384, "--num-steps", 64),
        ("--num-minibatches", 2, "--update-epochs", 2),
        128,
    ),
}


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


# script -> a tiny run's flags, for the smoke test: stopped by a SIGTERM in its STOP_AT-th vector
# step, resumed, it reaches its end
STOP_AT = 2
ATARI = ("--num-envs", 2, "--num-steps", 16, "--total-timesteps", 96, "--num-minibatches", 2)
ATARI += ("--update-epochs", 1)
SMOKE = {
    "ppo_atari_envpool": ATARI,
    "ppo_atari_envpool_torchcompile": ATARI,
    "ppo_atari_envpool_async": ATARI,
}
# what a vector step is where it is not gymnasium's SyncVectorEnv.step: envpool's step, and the
# async script's recv of a batch
COUNTED = {
    "ppo_atari_envpool": (EnvPoolMixin, "step"),
    "ppo_atari_envpool_torchcompile": (EnvPoolMixin, "step"),
    "ppo_atari_envpool_async": (EnvPoolMixin, "recv"),
}


@pytest.mark.parametrize("script", SMOKE)
def test_a_stopped_run_resumes_to_its_end(script, train, tmp_path):
    counted = COUNTED.get(script, (gym.vector.SyncVectorEnv, "step"))
    flags = (*SMOKE[script], "--run-name", "job")
    assert train(script, *flags, stop_at=STOP_AT, counted=counted) == 143
    stopped = checkpoint(tmp_path / "runs" / "job")
    assert not stopped["final"] and 0 < stopped["step"]
    assert train(script, *flags, "--resume", "auto", counted=counted) == 0
    resumed = checkpoint(tmp_path / "runs" / "job")
    total = SMOKE[script][SMOKE[script].index("--total-timesteps") + 1]
    assert resumed["final"] and resumed["step"] == total
    assert [entry["step"] for entry in resumed["resumes"]] == [stopped["step"]]
    summary = json.loads((tmp_path / "runs" / "job" / "summary.json").read_text())
    assert summary["total_timesteps"] == total and summary["resumes"] == resumed["resumes"]


def test_a_resumed_atari_run_gets_its_learner_back_and_fresh_games(train, tmp_path, monkeypatch):
    """envpool's envs cannot be saved: the resumed run loads the checkpoint's network and optimizer
    (recorded as their `load_state_dict` leaves them), goes on from the checkpoint's step, curve and
    learning-rate schedule, and says that its games started fresh."""
    script, counted = "ppo_atari_envpool_torchcompile", (EnvPoolMixin, "step")
    flags = (*ATARI, "--total-timesteps", 128, "--run-name", "job")
    assert train(script, *flags, stop_at=40, counted=counted) == 143  # in the 3rd of 4 iterations
    stopped = checkpoint(tmp_path / "runs" / "job")
    assert stopped["step"] == 96 and stopped["iteration"] == 4
    loaded = {}
    for cls in (torch.nn.Module, torch.optim.Optimizer):
        load = cls.load_state_dict

        def recorded(obj, state, *args, load=load, **kwargs):
            out = load(obj, state, *args, **kwargs)
            loaded[type(obj).__name__] = copy.deepcopy(obj.state_dict())
            return out

        monkeypatch.setattr(cls, "load_state_dict", recorded)
    assert train(script, *flags, "--resume", "auto", counted=counted) == 0
    learner = stopped["state"]["learner"]
    assert_same_state(loaded["Agent"], learner["agent"])
    assert_same_state(loaded["Adam"], learner["optimizer"])
    assert loaded["Adam"]["state"][0]["step"] == 6  # 3 iterations of 1 epoch of 2 minibatches
    resumed = checkpoint(tmp_path / "runs" / "job")
    assert resumed["resumes"] == [dict(step=96, fresh_episodes=True)]
    assert resumed["step"] == 128 and resumed["curve"][: len(stopped["curve"])] == stopped["curve"]
    # the last of 4 iterations anneals the learning rate to a quarter
    lr = resumed["state"]["learner"]["optimizer"]["param_groups"][0]["lr"]
    assert float(lr) == pytest.approx(2.5e-4 / 4)


def test_two_ranks_stopped_by_sigterm_resume_to_their_end(launches):  # noqa: F811
    """torchrun forwards a SIGTERM to both ranks, which stop after the same iteration; rank 0 alone
    writes the checkpoint, with each rank's generators and envs. The same command line, with more
    steps, goes on from there on both ranks, in lockstep, to its end."""
    name = "two-ranks-resumed"
    flags = (*TINY, *GLOO, "--dist-timeout", 30, "--run-name", name, "--resume", "auto")
    run = launches(torchrun_command(*standalone(2), *flags, "--total-timesteps", 10_000_000))
    assert run.wait_for(r"sps +\d+", timeout=LAUNCH_TIMEOUT), run.output[-3000:]
    run.proc.send_signal(signal.SIGTERM)
    run.finish(timeout=90)
    stopped = checkpoint(Path(RUNS_CWD) / "runs" / name)
    # whole iterations of 2 ranks x 64 steps
    assert not stopped["final"] and stopped["step"] > 0 and stopped["step"] % 128 == 0
    assert [type(envs) for _, (envs, _) in stopped["ranks"]] == [bytes, bytes]
    total = stopped["step"] + 2 * 128
    run = launches(torchrun_command(*standalone(2), *flags, "--total-timesteps", total))
    assert run.finish() == 0, run.output[-3000:]
    result = summary(Finished(0, run.output))
    assert result["total_timesteps"] == total and result["parameter_spread"] == 0.0
    assert result["resumes"] == [dict(step=stopped["step"], fresh_episodes=False)]
