"""The run plumbing of the four seeds scripts (the same in each: tests/test_plumbing.py). A bad env
is refused before a run folder exists; member k is seeded `seed + k * num_envs`; a member whose loss
or weights turn non-finite is recorded once, with one line on stderr, and left out of the results
while the others go on; a run exits 3 only when every member diverged; the summary is written before
evaluation, and a signal skips evaluation. `Run` is driven by hand in the test's process, without
training, except in one short dqn_seeds run in which every member diverges. About 15 s."""

import functools
import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import load_script, run_script, summary

SCRIPTS = ["dqn_seeds", "ppo_continuous_action_seeds", "sac_continuous_action_seeds"]
SCRIPTS += ["td3_continuous_action_seeds"]
# the learning-rate flags at their defaults, which a diverged member's line names
RATES = {"dqn_seeds": "--learning-rate 0.00025"}  # the others': --learning-rate 0.0003
RATES["sac_continuous_action_seeds"] = "--policy-lr 0.0003 --q-lr 0.001"
NAN, INF = float("nan"), float("inf")
CPU = torch.device("cpu")
load = functools.cache(load_script)


def strict_json(text):
    """JSON as the standard has it: no NaN or Infinity (Python's json writes and reads them)."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))


def summary_line(out):
    """The SUMMARY line of a run's stdout, as strict JSON."""
    return strict_json(out.strip().removeprefix("SUMMARY "))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bad_env_id_exits_2_before_any_run_folder(script, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    mod = load(script)
    with pytest.raises(SystemExit) as stop:
        mod.main(mod.Args(env_id="NoSuchEnv-v0", num_seeds=2))
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and "--env-id" in lines[0], lines
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_member_k_is_seeded_k_times_num_envs_after_the_first(script, make_run):
    """Member k is the single-seed script with `--seed seed + k * num_envs`, its envs seeded from
    there on: no env seed is another member's (with `seed + k`, member 0's env 1 was member 1's
    env 0). With one env per member, as before."""
    assert make_run(script, seed=5, num_seeds=3, num_envs=2).seeds == [5, 7, 9]
    assert make_run(script, seed=5, num_seeds=3).seeds == [5, 6, 7]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_diverged_member_is_recorded_once_and_left_out(script, make_run, capsys):
    """Four members: member 1's logged loss turns nan at step 100 (inf later), member 2's weights
    are nan at the end though no logged loss was, members 0 and 3 train on. A nan explained variance
    (PPO's may be) is no loss: no divergence. One stderr line per diverged member names it, its
    seed, the step, the loss and the script's learning-rate flags. The summary (strict JSON) lists
    both, leaves them out of `return_mean`, evaluates neither and saves no file of theirs; exit
    status 0. The summary is on disk before the first evaluation."""
    run = make_run(script, seed=10, num_seeds=4, save_model=True, eval_episodes=2)
    run.log_episodes(50, [[1.0], [NAN], [3.0], [5.0]])  # a diverged policy's return
    for step, bad in ((100, NAN), (200, INF)):
        losses, explained = torch.tensor([0.5, bad, 0.5, 0.5]), torch.tensor([NAN, 0.0, 0.0, 0.0])
        run.log_progress(step, dict(qf_loss=losses, alpha=1.0, explained_variance=explained))
    tail = f"; the others go on; maybe too large: {RATES.get(script, '--learning-rate 0.0003')}"
    message = "error: member 1 (seed 11) diverged at step 100: qf_loss is nan" + tail
    assert capsys.readouterr().err.strip().splitlines() == [message]
    run.steps = 300
    models = [{"w": torch.ones(3), "stats": {"count": torch.tensor(1.0)}} for _ in range(4)]
    models[1]["w"][0], models[2]["stats"]["count"] = NAN, torch.tensor(NAN)  # PPO's: nested
    evaluated = []

    def evaluate(member, episodes, videos):
        written = strict_json((Path(run.dir) / "summary.json").read_text())
        assert written["eval_returns"] == [] and len(written["diverged"]) == 2
        evaluated.append(member)
        return [10.0 * member] * episodes

    run.finish(CPU, models, evaluate)  # exit status 0: no SystemExit
    out, err = capsys.readouterr()
    assert err.strip() == "error: member 2 (seed 12) diverged at step 300: weight_sum is nan" + tail
    s = strict_json(Path(summary_line(out)["summary_file"]).read_text())
    assert s["diverged"] == [
        dict(seed=11, member=1, step=100, metric="qf_loss", value="nan"),
        dict(seed=12, member=2, step=300, metric="weight_sum", value="nan"),
    ]
    assert s["return_means"] == [1.0, None, None, 5.0] and s["return_mean"] == 3.0
    assert s["curves"][1][0][2] == "nan" and s["episodes"] == 4
    assert evaluated == [0, 3] and s["eval_returns"] == [[0.0, 0.0], None, None, [30.0, 30.0]]
    assert s["eval_return_means"] == [0.0, None, None, 30.0] and s["eval_return_mean"] == 15.0
    files = [f"{script}_seed10.pt", None, None, f"{script}_seed13.pt"]
    assert [path and Path(path).name for path in s["model_files"]] == files
    assert s["model_file"] == s["model_files"][0] and not s["interrupted"]
    assert sorted(path.name for path in Path(run.dir).glob("*.pt")) == [files[0], files[3]]


def never_evaluate(member, episodes, videos):
    pytest.fail(f"member {member} was evaluated")


def test_a_run_whose_every_member_diverged_exits_3_without_files_or_evaluation(make_run, capsys):
    run = make_run("dqn_seeds", num_seeds=2, save_model=True, eval_episodes=1)
    run.log_progress(100, dict(td_loss=torch.tensor([NAN, 1.0]), q_values=torch.zeros(2)))
    run.log_progress(200, dict(td_loss=torch.tensor([NAN, -INF]), q_values=torch.zeros(2)))
    assert len(run.diverged) == 2  # what the training loops stop on
    with pytest.raises(SystemExit) as stop:
        run.finish(CPU, [{"w": torch.ones(1)}] * 2, never_evaluate)
    out, err = capsys.readouterr()
    assert stop.value.code == 3 and len(err.strip().splitlines()) == 2
    s = summary_line(out)
    assert [d["step"] for d in s["diverged"]] == [100, 200] and s["diverged"][1]["value"] == "-inf"
    assert s["return_means"] == [None, None] and s["return_mean"] is None
    assert s["model_files"] == [None, None] and s["model_file"] is None
    assert s["eval_returns"] == [None, None] and s["eval_return_mean"] is None
    assert not list(Path(run.dir).glob("*.pt"))


def test_after_a_signal_the_summary_is_written_without_evaluating(make_run, capsys):
    """A first SIGTERM (Slurm's, 30 s before its SIGKILL): the models are saved, the summary written
    and printed without evaluating, and the run exits 143."""
    run = make_run("dqn_seeds", num_seeds=2, save_model=True, eval_episodes=5)
    run.log_episodes(10, [[1.0], [2.0]])
    run.stop_signal = signal.SIGTERM
    with pytest.raises(SystemExit) as stop:
        run.finish(CPU, [{"w": torch.ones(1)}] * 2, never_evaluate)
    s = summary_line(capsys.readouterr().out)
    assert stop.value.code == 143 and s["interrupted"] and s["diverged"] == []
    assert s["eval_returns"] == [] and s["return_mean"] == 1.5
    assert all(Path(path).exists() for path in s["model_files"])


def test_a_run_in_which_every_member_diverges_stops_and_exits_3():
    """dqn_seeds, two members at a learning rate of 1e30: each diverges, on a line of its own; the
    run stops at the log that finds the last, writes its summary, saves no model and exits 3."""
    flags = ("--num-seeds", 2, "--no-compile", "--total-timesteps", 3000, "--learning-starts", 100)
    flags += ("--train-frequency", 1, "--learning-rate", 1e30, "--save-model")
    proc = run_script("dqn_seeds", *flags)
    s = summary(proc, returncode=3)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    rates = "maybe too large: --learning-rate 1e+30"
    assert len(lines) == 2 and all(rates in line for line in lines), lines
    assert [d["seed"] for d in s["diverged"]] == [1, 2] and s["model_files"] == [None, None]
    assert s["total_timesteps"] < 3000 and s["return_mean"] is None
