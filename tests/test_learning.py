"""benchmarks.learning: the harness resumes after a kill (two 1,000-step DQN runs, a few seconds
each), and its table reads the summaries of one-seed and `_seeds` scripts alike (made-up
summaries, no training)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, script_env

from benchmarks import learning

SMOKE = learning.learning_set("smoke")


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {seconds} s")
        time.sleep(0.2)


def processes_in(folder):
    """The pids of live processes whose working directory is inside `folder` (a run's process runs
    in its own)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # it ended meanwhile, or is not ours to read
        if cwd.startswith(str(folder)) and state != "Z":
            pids.append(int(entry))
    return pids


def harness(out_dir, *flags):
    return [
        sys.executable,
        "-m",
        "benchmarks.learning",
        "--set",
        "smoke",
        "--out-dir",
        str(out_dir),
        *flags,
    ]


@pytest.mark.slow  # three processes, two of them training (13 s here)
def test_a_harness_killed_between_runs_skips_the_done_run_and_completes_the_other(tmp_path):
    first, second = (tmp_path / run.name for run in SMOKE)
    killed = subprocess.Popen(
        harness(tmp_path), cwd=ROOT, env=script_env(), stderr=subprocess.DEVNULL
    )
    try:
        wait_for((first / "summary.json").exists, 120, "summary of the first run")
    finally:
        killed.kill()  # SIGKILL: no cleanup of its own
        killed.wait(timeout=30)
    done = (first / "summary.json").read_bytes(), (first / "summary.json").stat().st_mtime_ns
    wait_for(lambda: not processes_in(tmp_path), 30, "end of the runs the killed harness left")
    # the kernel stopped the run in flight before its end
    assert not list(second.glob("runs/*/summary.json"))
    assert not (second / "summary.json").exists()

    kwargs = dict(cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=300)
    resumed = subprocess.run(harness(tmp_path, "--threads", "1"), **kwargs)
    assert resumed.returncode == 0, resumed.stderr
    assert "2 runs in the set, 1 done, 1 to run" in resumed.stderr
    assert f"started {SMOKE[0].name}" not in resumed.stderr
    assert (
        (first / "summary.json").read_bytes(),
        (first / "summary.json").stat().st_mtime_ns,
    ) == done
    record = json.loads((second / "summary.json").read_text())
    assert record["summary"]["total_timesteps"] == 1000 and record["summary"]["seed"] == 2
    assert record["command"][:2] == ["python", "leanrl/dqn_cpu.py"]
    assert "--eval-episodes" in record["command"]
    assert len(record["summary"]["eval_returns"]) == 10
    assert record["omp_num_threads"] == 1 and record["summary"]["threads"] == 1
    assert "| dqn_cpu | CartPole-v1 | 1k | 2/2 |" in resumed.stdout
    assert (tmp_path / "smoke.md").read_text() == resumed.stdout
    assert (tmp_path / "smoke-CartPole-v1.png").stat().st_size > 0


def test_a_harness_stopped_by_sigterm_kills_its_run_and_exits_143(tmp_path):
    first = tmp_path / SMOKE[0].name
    stopped = subprocess.Popen(
        harness(tmp_path), cwd=ROOT, env=script_env(), stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: processes_in(first), 60, "process of the first run")
    finally:
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=60) == 128 + signal.SIGTERM
    wait_for(lambda: not processes_in(tmp_path), 30, "end of the run")
    assert not (first / "summary.json").exists()


def curve(returns, start_step=1000):
    return [[start_step * (i + 1), float(i), r] for i, r in enumerate(returns)]


def record(summary):
    return dict(
        run="x", started="2026-01-01T00:00:00", finished="2026-01-01T00:10:00", summary=summary
    )


def write_record(out_dir, run, summary):
    (out_dir / run.name).mkdir(parents=True)
    (out_dir / run.name / "summary.json").write_text(json.dumps(record(summary)))


def one_seed(seed, final, evaluation):
    return dict(
        seed=seed, return_mean=final, eval_return_mean=evaluation, curve=curve([10.0, final])
    )


def test_the_table_reads_one_seed_and_seeds_summaries_marks_pending_runs_and_compares_at_the_budget(
    tmp_path,
):
    dqn = learning.runs("dqn_cpu", "CartPole-v1", 500_000, (1, 2, 3))
    ppo = learning.runs("ppo_continuous_action_seeds", "Hopper-v4", 1_000_000, (1, 2, 3))
    td3 = learning.runs("td3_continuous_action_seeds", "Hopper-v4", 300_000, (1, 2, 3))
    walker = learning.runs("ppo_continuous_action_cpu", "Walker2d-v4", 1_000_000, (1,))
    assert len(ppo) == 1 and ppo[0].command(Path("s"), 10)[2:] == [
        *"--env-id Hopper-v4 --total-timesteps 1000000 --seed 1 --num-seeds 3".split(),
        *("--eval-episodes", "10"),
    ]
    write_record(tmp_path, dqn[0], one_seed(1, 500.0, 500.0))
    write_record(tmp_path, dqn[1], one_seed(2, 480.0, 490.0))
    seeds = dict(seeds=[1, 2, 3], return_means=[2300.0, 2400.0, 2500.0], curves=[curve([1, 2])] * 3)
    write_record(tmp_path, ppo[0], seeds | {"eval_returns": [[1900.0, 2100.0], [2200.0], [2300.0]]})
    write_record(tmp_path, td3[0], seeds | {"eval_returns": [[], [], []]})
    write_record(tmp_path, walker[0], one_seed(1, 1000.0, None))
    sac = learning.runs("sac_continuous_action_cpu", "Hopper-v4", 300_000, (1, 2))
    plan = [*dqn, *ppo, *td3, *walker, *sac]

    table_md = learning.report(plan, tmp_path, "test")
    rows = json.loads((tmp_path / "test.json").read_text())["table"]
    table = {row["script"]: row for row in rows}
    dqn_row = dict(seeds_planned=3, seeds_done=2, return_mean=490.0, return_std=10.0)
    dqn_row |= dict(eval_mean=495.0, eval_std=5.0, seconds_per_run=600.0, reference=None)
    # a seed is pending: no comparison
    assert table["dqn_cpu"] | {"reference": None} == table["dqn_cpu"] | dqn_row | {
        "within_reference": None
    }
    assert table["ppo_continuous_action_seeds"]["seeds_done"] == 3
    assert table["ppo_continuous_action_seeds"]["return_mean"] == pytest.approx(2400.0)
    evaluation = (2000.0 + 2200.0 + 2300.0) / 3
    assert table["ppo_continuous_action_seeds"]["eval_mean"] == pytest.approx(evaluation)
    assert table["ppo_continuous_action_seeds"]["within_reference"] is True  # 2382.86 ± 271.74
    assert table["td3_continuous_action_seeds"]["eval_mean"] is None
    # 300k steps, CleanRL's value is at 1M
    assert table["td3_continuous_action_seeds"]["within_reference"] is None
    # 1000 against 2287.95 ± 571.78
    assert table["ppo_continuous_action_cpu"]["within_reference"] is False
    assert table["sac_continuous_action_cpu"]["seeds_done"] == 0
    assert (
        "| dqn_cpu | CartPole-v1 | 500k | 2/3 | 490.0 ± 10.0 | 495.0 ± 5.0 | 488.7 ± 16.1 at 500k "
        "| n/a |" in table_md
    )
    assert "| sac_continuous_action_cpu | Hopper-v4 | 300k | 0/2 | pending | pending |" in table_md
    assert (
        "| ppo_continuous_action_cpu | Walker2d-v4 | 1M | 1/1 | 1000.0 ± 0.0 | pending |"
        in table_md
    )
    assert (
        "**no**" in table_md
        and learning.REFERENCES["sac_continuous_action", "Hopper-v4"].source in table_md
    )
    pending = json.loads((tmp_path / "test.json").read_text())["pending"]
    assert pending == [dqn[2].name, *(run.name for run in plan[-2:])]
    assert {path.name for path in tmp_path.glob("test-*.png")} == {
        "test-CartPole-v1.png",
        "test-Hopper-v4.png",
        "test-Walker2d-v4.png",
    }


def test_a_run_with_flags_of_its_own_has_its_own_folder_command_and_row(tmp_path):
    compiled = learning.runs("td3_continuous_action_cpu", "Hopper-v4", 200_000, (1, 2))
    uncompiled = learning.runs(
        "td3_continuous_action_cpu", "Hopper-v4", 200_000, (1, 2), ("--no-compile",)
    )
    assert uncompiled[0].name == "td3_continuous_action_cpu_no-compile__Hopper-v4__200k__1"
    assert uncompiled[0].command(Path("s"), 10)[-3:] == ["--eval-episodes", "10", "--no-compile"]
    assert compiled[0].name == "td3_continuous_action_cpu__Hopper-v4__200k__1"
    for run, final in zip([*compiled, *uncompiled], (300.0, 400.0, 900.0, 1100.0)):
        write_record(tmp_path, run, one_seed(run.seed, final, None))
    learning.report([*compiled, *uncompiled], tmp_path, "test")
    rows = json.loads((tmp_path / "test.json").read_text())["table"]
    means = {row["script"]: row["return_mean"] for row in rows}
    assert means == {
        "td3_continuous_action_cpu": 350.0,
        "td3_continuous_action_cpu --no-compile": 1000.0,
    }
    plateau = learning.learning_set("td3_plateau")
    assert [run.name for run in plateau[:2]] == [compiled[0].name, uncompiled[0].name]
    assert len(plateau) == 20 and {run.steps for run in plateau} == {200_000}


def test_thin_averages_consecutive_episodes_into_at_most_the_given_points():
    episodes = curve([float(i) for i in range(1200)], start_step=10)
    thinned = learning.thin(episodes, points=500)
    assert len(thinned) == 400  # chunks of 3
    assert thinned[0] == [30, 2.0, 1.0] and thinned[-1] == [12000, 1199.0, 1198.0]
    assert learning.thin(episodes[:5], points=500) == [
        [10 * (i + 1), float(i), float(i)] for i in range(5)
    ]


def test_the_reported_sets_hold_every_committed_run_and_a_seeds_script_runs_them_in_one_process():
    names = [run.name for run in learning.learning_set("default")]
    assert names[:2] == ["dqn_seeds__CartPole-v1__500k__1x3", "dqn_cpu__CartPole-v1__500k__1"]
    assert "sac_continuous_action_seeds__Hopper-v4__300k__1x3" in names
    assert len(names) == len(set(names))
    # the sets docs/results.md shows
    reported = set(names) | {
        run.name for name in ("atari", "pqn", "pqn_atari") for run in learning.learning_set(name)
    }
    committed = {
        path.parent.name
        for path in (ROOT / "benchmarks" / "results" / "learning").glob("*/summary.json")
    }
    # a committed run outside them would drop out of every report
    assert committed and committed <= reported


def test_a_second_harness_on_the_same_folder_exits_2_and_deletes_nothing(tmp_path, capsys):
    partial = tmp_path / SMOKE[0].name
    partial.mkdir()
    # as a running harness holds it (flock: each open of the folder is apart)
    held = learning.lock(tmp_path)
    try:
        with pytest.raises(SystemExit) as exit_info:
            learning.main(["--set", "smoke", "--out-dir", str(tmp_path)])
    finally:
        os.close(held)
    assert exit_info.value.code == 2
    assert "another harness is running there" in capsys.readouterr().err
    assert partial.is_dir()


def test_only_matching_no_run_exits_2_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        learning.main(["--set", "smoke", "--only", "ppo", "--out-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--only ppo matches no run of the set smoke" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
