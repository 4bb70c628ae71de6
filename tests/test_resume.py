"""Checkpoints and `--resume`: a run stopped by SIGTERM at step k and resumed ends where a run that
went through ends, bit for bit on the CPU where the envs can be saved; and the faults: a truncated,
foreign or mismatched checkpoint exits 2 in one line, a finished run is not run again."""

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import assert_same_state, checkpoint

# script -> a short run's flags and the vector step at which the stopped run gets its SIGTERM
EXACT = {
    "sac_continuous_action": (
        ("--env-id", "Pendulum-v1", "--total-timesteps", 500, "--learning-starts", 200),
        ("--batch-size", 32, "--buffer-size", 1000),
        350,
    ),
    # 2 members; the stop leaves 4 transitions waiting for the buffer's next write
    "dqn_seeds": (
        ("--total-timesteps", 500, "--learning-starts", 200, "--num-seeds", 2, "--no-compile"),
        ("--batch-size", 32, "--buffer-size", 1000, "--target-network-frequency", 50),
        355,
    ),
}


def same_runs(a, b):
    """Runs that end in the same state: the final checkpoints' training states (but the pickled
    envs, whose episode statistics hold clock times), steps, curves (steps and returns; a seeds
    script's: one per member) and last returns."""
    assert a["final"] and b["final"]
    for saved in (a, b):
        envs = saved["state"].get("envs")
        saved["state"]["envs"] = envs and (type(envs[0]), *envs[1:])
    assert_same_state(a["state"], b["state"])
    assert (a["step"], a["returns"]) == (b["step"], b["returns"])
    curves = [saved.get("curves", [saved.get("curve")]) for saved in (a, b)]
    assert [[(s, r) for s, _, r in curve] for curve in curves[0]] == [
        [(s, r) for s, _, r in curve] for curve in curves[1]
    ]


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


# script -> a tiny run's flags: stopped by a SIGTERM at its 20th vector step, then resumed
TINY_SEEDS = ("--num-seeds", 2, "--no-compile", "--batch-size", 8, "--buffer-size", 100)
TINY_PENDULUM = ("--env-id", "Pendulum-v1", "--total-timesteps", 50, "--learning-starts", 30)
TINY_PPO_SEEDS = ("--num-seeds", 2, "--no-compile", "--env-id", "Pendulum-v1", "--num-steps", 16)
TINY_PPO_SEEDS += ("--num-minibatches", 2, "--update-epochs", 1)
SMOKE = {
    "dqn_seeds": (*TINY_SEEDS, "--total-timesteps", 60, "--learning-starts", 10),
    "sac_continuous_action_seeds": (*TINY_SEEDS, *TINY_PENDULUM),
    "td3_continuous_action_seeds": (*TINY_SEEDS, *TINY_PENDULUM),
    "ppo_continuous_action_seeds": (*TINY_PPO_SEEDS, "--total-timesteps", 64),
}
# what the `train` fixture counts where it is not gymnasium's SyncVectorEnv, and scripts whose
# envs cannot be saved
COUNTED = {"ppo_continuous_action_seeds": "EnvpoolWrappers"}
FRESH_EPISODES = ("ppo_continuous_action_seeds",)


@pytest.mark.parametrize("script", SMOKE)
def test_a_run_stopped_by_sigterm_resumes_to_its_end(script, train):
    """Stopped between its first and last step, resumed with --resume auto, the run reaches its
    end with one entry in `resumes`, which says whether its episodes started fresh."""
    counted = COUNTED.get(script)
    flags = (*SMOKE[script], "--run-name", "run")
    assert train(script, *flags, stop_at=20, counted=counted) == 143
    stopped = checkpoint("runs/run")
    assert not stopped["final"] and 20 <= stopped["step"] < stopped["args"]["total_timesteps"]
    assert train(script, *flags, "--resume", "auto", counted=counted) == 0
    resumed = checkpoint("runs/run")
    assert resumed["final"] and resumed["step"] == resumed["args"]["total_timesteps"]
    fresh = script in FRESH_EPISODES
    assert resumed["resumes"] == [dict(step=stopped["step"], fresh_episodes=fresh)]


def test_an_envpool_run_resumes_its_learner_and_statistics_with_fresh_episodes(train):
    """ppo_continuous_action_seeds: resumed with --total-timesteps at the checkpoint's step, no
    iteration is left and the saved models are the learner as the checkpoint restored it; each
    member's observation statistics went on from the checkpoint's by the fresh episodes' first
    observation."""
    script, flags = "ppo_continuous_action_seeds", (*TINY_PPO_SEEDS, "--total-timesteps")
    stop = dict(stop_at=20, counted="EnvpoolWrappers")  # in the second 16-step rollout
    assert train(script, *flags, 64, "--run-name", "run", **stop) == 143
    stopped = checkpoint("runs/run")
    assert stopped["step"] == 32 and stopped["state"]["envs"][0] is None
    resume = ("--save-model", "--resume", "runs/run")
    assert train(script, *flags, 32, *resume, counted="EnvpoolWrappers") == 0
    summary = json.loads(Path("runs/run/summary.json").read_text())
    assert summary["resumes"] == [dict(step=32, fresh_episodes=True)]
    params = stopped["state"]["learner"]["params"]
    count = stopped["state"]["normalization"]["obs_rms"][2]
    assert len(summary["model_files"]) == 2
    for member, model_file in enumerate(summary["model_files"]):
        model = torch.load(model_file, weights_only=True)["model"]
        assert_same_state(model["agent"], {name: p[member] for name, p in params.items()})
        assert float(model["obs_rms"]["count"]) == pytest.approx(count + 1)  # float32


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
