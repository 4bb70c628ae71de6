"""Divergence is an outcome. A loss (a metric named `*loss*`) or a weight norm that is not finite
stops a single-run script: one line on stderr names the step, the metric and the learning-rate
flags, the summary says `"diverged"`, no model file is written, no evaluation is played, and the
exit status is 3. A run that does not diverge says `"diverged": null`. `Run` is driven directly in
one script of each family (it is byte-identical in all), then three scripts diverge end to end.
About 25 s here."""

import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import run_script, summary

NAN, INF = float("nan"), float("inf")


def not_called(episodes, videos):
    raise AssertionError("a diverged run evaluated its policy")


def strict_json(text):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"not valid JSON: {c}"))


def error_lines(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


def finish(run, model, capsys):
    """`run.finish` on `model`: its exit status (None if it returned), the SUMMARY printed and
    summary.json (read by a parser that refuses NaN), the run folder's files, the error lines."""
    try:
        run.finish("cpu", model, not_called)
        status = None
    except SystemExit as stop:
        status = stop.code
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("SUMMARY ")]
    assert len(lines) == 1
    printed = strict_json(lines[0][len("SUMMARY ") :])
    written = strict_json(Path(printed.pop("summary_file")).read_text())
    files = sorted(path.name for path in Path(run.folder.dir).iterdir())
    return status, printed, written, files, error_lines(err)


@pytest.mark.parametrize("script", ["dqn", "ppo_atari_envpool", "ppo_lstm"])
def test_a_loss_not_finite_stops_the_run_with_exit_3(script, make_run, capsys):
    run = make_run(script, save_model=True, eval_episodes=1)
    # explained_variance is nan where the returns all tie: a diagnostic, not a divergence
    tie = torch.tensor(NAN)
    run.log_progress(100, dict(policy_loss=torch.tensor(1.0), explained_variance=tie))
    assert run.logs[0].diverged is None and capsys.readouterr().err == ""
    losses = dict(policy_loss=torch.tensor(1.0), value_loss=torch.tensor(INF))
    run.log_progress(1200, losses | dict(explained_variance=tie, learning_rate=2.5e-4))
    run.log_progress(1300, dict(policy_loss=torch.tensor(NAN)))  # the first one is kept
    assert run.logs[0].diverged == {"step": 1200, "metric": "value_loss", "value": "inf"}
    rate = f"--learning-rate {run.args.learning_rate}"  # the only rate: --anneal-lr is a switch
    line = f"error: diverged at step 1200: value_loss is inf; maybe too large: {rate}"
    assert error_lines(capsys.readouterr().err) == [line]

    run.steps = 1300
    run.log_episodes(1000, [NAN])  # a return after divergence: written "nan", still valid JSON
    status, printed, written, files, errors = finish(run, {"agent": {"w": torch.ones(2)}}, capsys)
    assert status == 3 and files == ["summary.json"] and errors == []
    assert printed["diverged"] == {"step": 1200, "metric": "value_loss", "value": "inf"}
    assert printed["model_file"] is None and printed["eval_returns"] == []
    assert printed["return_mean"] == "nan"
    assert written == printed | {"curve": [[1000, written["curve"][0][1], "nan"]]}


def test_the_weight_norm_is_checked_and_the_line_names_every_rate(make_run, capsys):
    run = make_run("sac_continuous_action")
    run.log_progress(300, dict(qf_loss=torch.tensor(2.0), alpha=torch.tensor(NAN)))
    assert run.logs[0].diverged is None
    run.log_progress(400, dict(qf_loss=torch.tensor(2.0), weight_norm=torch.tensor(NAN)))
    assert run.logs[0].diverged == {"step": 400, "metric": "weight_norm", "value": "nan"}
    rates = "--policy-lr 0.0003 --q-lr 0.001"
    line = f"error: diverged at step 400: weight_norm is nan; maybe too large: {rates}"
    assert error_lines(capsys.readouterr().err) == [line]


def test_weights_not_finite_at_the_end_diverge_the_run(make_run, capsys):
    """A weight that diverged after the last check: the end of the run finds it (the sum of the
    weights is not finite), and saves and evaluates nothing."""
    run = make_run("td3_continuous_action", save_model=True, eval_episodes=1)
    run.log_progress(500, dict(qf_loss=torch.tensor(1.0), actor_loss=torch.tensor(-1.0)))
    run.steps = 600
    model = {"fc1.weight": torch.tensor([[1.0, INF]]), "obs_rms": {"mean": torch.tensor([-INF])}}
    status, printed, _, files, errors = finish(run, model, capsys)
    assert status == 3 and files == ["summary.json"]
    assert printed["diverged"] == {"step": 600, "metric": "weight_sum", "value": "nan"}
    line = "error: diverged at step 600: weight_sum is nan; maybe too large: --learning-rate 0.0003"
    assert errors == [line]


def test_a_run_that_does_not_diverge_says_null_and_saves(make_run, capsys):
    run = make_run("dqn_cpu", save_model=True)
    run.log_progress(100, dict(td_loss=torch.tensor(0.5), epsilon=0.9))
    run.steps = 100
    status, printed, _, files, errors = finish(run, {"w": torch.ones(3)}, capsys)
    assert status is None and printed["diverged"] is None and errors == []
    assert files == ["dqn_cpu.pt", "summary.json"] and printed["model_file"].endswith("dqn_cpu.pt")


def test_returns_not_finite_at_the_end_diverge_the_run(make_run, capsys):
    """Finite weights that act with non-finite actions (an env's reward is then nan): the end of
    the run finds the mean return not finite, and the run does not report success."""
    run = make_run("sac_continuous_action_cpu", save_model=True)
    run.log_episodes(50, [-10.0, NAN])
    run.steps = 60
    status, printed, _, files, errors = finish(run, {"w": torch.ones(3)}, capsys)
    assert status == 3 and files == ["summary.json"] and len(errors) == 1
    assert printed["diverged"] == {"step": 60, "metric": "return_mean", "value": "nan"}


def test_the_summary_is_on_disk_before_the_evaluation_starts(make_run, capsys):
    """A job killed while it evaluates (Slurm's SIGKILL, 30 s after its SIGTERM) keeps its summary:
    it is written before the first episode, then again with the evaluation's returns."""
    run = make_run("td3_continuous_action", eval_episodes=2)
    run.log_episodes(10, [-5.0])
    run.steps, run.signals.received = 20, signal.SIGTERM
    seen = []

    def evaluate(episodes, videos):
        seen.append(strict_json((Path(run.folder.dir) / "summary.json").read_text()))
        return [1.0, 3.0]

    with pytest.raises(SystemExit) as stop:
        run.finish("cpu", {"w": torch.ones(1)}, evaluate)
    assert stop.value.code == 128 + signal.SIGTERM
    assert len(seen) == 1 and seen[0]["eval_returns"] == [] and seen[0]["return_mean"] == -5.0
    written = strict_json((Path(run.folder.dir) / "summary.json").read_text())
    assert written["eval_returns"] == [1.0, 3.0] and written["eval_return_mean"] == 2.0
    assert written["interrupted"] is True


def assert_diverged(proc, line, diverged):
    """Exit 3, the one line on stderr, no traceback, `diverged` in the summary, no model file, no
    checkpoint and no evaluation."""
    assert "Traceback" not in proc.stderr
    assert error_lines(proc.stderr.replace("\r", "\n")) == [line]
    result = summary(proc, returncode=3)
    assert result["diverged"] == diverged
    assert result["model_file"] is None and result["eval_returns"] == []
    assert result["eval_return_mean"] is None
    # no model and no checkpoint: the summary, and TensorBoard's event file of what led there
    files = [path.name for path in Path(result["summary_file"]).parent.iterdir()]
    assert sorted(f for f in files if not f.startswith("events.out.tfevents.")) == ["summary.json"]
    return result


def test_dqn_diverges_end_to_end():
    """A learning rate far too large: the TD loss is nan at the first log after updates start."""
    flags = ("--env-id", "CartPole-v1", "--total-timesteps", 2000, "--learning-starts", 1000)
    flags += ("--learning-rate", 1e8, "--no-compile", "--save-model", "--eval-episodes", 1)
    rate = "--learning-rate 100000000.0"
    line = f"error: diverged at step 1100: td_loss is nan; maybe too large: {rate}"
    diverged = {"step": 1100, "metric": "td_loss", "value": "nan"}
    result = assert_diverged(run_script("dqn_cpu", *flags), line, diverged)
    assert result["total_timesteps"] == 1101  # it stopped after the step it logged


def test_sac_diverges_end_to_end_instead_of_raising_in_normal():
    """The actor's Normal is built unchecked: nan means no longer raise (exit 1) before the losses
    are logged."""
    flags = ("--env-id", "Pendulum-v1", "--total-timesteps", 1500, "--learning-starts", 200)
    flags += ("--batch-size", 32, "--q-lr", 1e4, "--policy-lr", 1e4, "--save-model")
    rates = "--policy-lr 10000.0 --q-lr 10000.0"
    line = f"error: diverged at step 200: actor_loss is inf; maybe too large: {rates}"
    diverged = {"step": 200, "metric": "actor_loss", "value": "inf"}
    result = assert_diverged(run_script("sac_continuous_action", *flags), line, diverged)
    assert result["total_timesteps"] == 201


def test_eager_discrete_ppo_stops_before_sampling_from_weights_not_finite():
    """PPO-LSTM, one update per iteration: the update leaves weights whose norm overflows while its
    loss is finite. The check of the weights stops the run before the next rollout, where
    `Categorical.sample` would raise on nan probabilities (exit 1)."""
    flags = ("--total-timesteps", 128, "--num-envs", 2, "--num-steps", 8, "--num-minibatches", 1)
    flags += ("--update-epochs", 1, "--learning-rate", 1e20, "--save-model", "--eval-episodes", 1)
    line = "error: diverged at step 16: weight_norm is inf; maybe too large: --learning-rate 1e+20"
    diverged = {"step": 16, "metric": "weight_norm", "value": "inf"}
    result = assert_diverged(run_script("ppo_lstm", *flags), line, diverged)
    assert result["total_timesteps"] == 16
