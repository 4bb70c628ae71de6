"""benchmarks.time_to_solve: its stopping rule, its reading of a run's episodes (TensorBoard's
events of ours, the printed lines of CleanRL's) on made-up runs, a whole call on tiny fake scripts
that solve, hang or fail, and its refusals."""

import io
import json
import subprocess
import sys
import time

import pytest
from conftest import ROOT, assert_user_error

from benchmarks import time_to_solve as tts

# A fake script: it logs `--returns` (one episode a second, at step 100 x its index x the seed) to
# TensorBoard's events with TensorBoard's own writer, one event file per member (member m's returns
# raised by m x `--member-step`), then hangs with `--hang` or exits with `--status`.
FAKE_RUN = """
import sys, time
from pathlib import Path
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

argv = sys.argv[1:]
def flag(name, default):
    return argv[argv.index(name) + 1] if name in argv else default
seed, members = int(flag("--seed", 1)), int(flag("--members", 1))
returns = [float(r) for r in flag("--returns", "0").split(",")]
folders = [Path(f"runs/fake/seed{m}") for m in range(members)]
folders = folders if members > 1 else [Path("runs/fake")]
writers = [EventFileWriter(str(folder)) for folder in folders]
start = time.time()
for k, r in enumerate(returns):
    for m, writer in enumerate(writers):
        value = r + m * float(flag("--member-step", 0))
        tag = summary_pb2.Summary.Value(tag="charts/episodic_return", simple_value=value)
        summary = summary_pb2.Summary(value=[tag])
        writer.add_event(event_pb2.Event(step=100 * k * seed, wall_time=start + k, summary=summary))
for writer in writers:
    writer.flush()
if "--hang" in argv:
    time.sleep(600)
sys.exit(int(flag("--status", 0)))
"""
# CleanRL's script, faked: the lines the study's patches replace, then its episodes as it prints
FAKE_CLEANRL = """
import sys, time
PATCHED = '''from torch.utils.tensorboard import SummaryWriter
gym.vector.SyncVectorEnv(
for info in infos["final_info"]:
'''
returns = [480, 490, 500] if "--fast" in sys.argv else [10, 20, 480, 490, 500]
for k, r in enumerate(returns):
    print(f"global_step={k * 4}, episodic_return=[{r}.]")
print("SPS: 100")
time.sleep(600)
"""


def test_the_stopping_rule_is_the_first_full_window_whose_mean_reaches_the_threshold():
    episodes = [(k / 10, 100 * k, r) for k, r in enumerate([0, 10, 20, 30, 40, 50])]
    assert tts.solve_point(episodes, 20, 3) == (0.3, 300)  # (10 + 20 + 30) / 3 = 20: reached
    assert tts.solve_point(episodes, 30.5, 3) == (0.5, 500)  # (30 + 40 + 50) / 3 = 40
    assert tts.solve_point(episodes, 41, 3) is None  # never reached
    assert tts.solve_point(episodes[:2], 0, 3) is None  # fewer episodes than the window
    assert tts.solve_point([(1.0, 4, 500.0)] * 19, 475, 20) is None  # 19 of 20
    spike = [(k, k, 500.0 if k == 5 else 0.0) for k in range(30)]
    assert tts.solve_point(spike, 25, 20) == (19, 19)  # 500 / 20 = 25 once 20 episodes ended
    assert tts.solve_point(spike, 25.1, 20) is None


def test_the_events_of_a_made_up_run_are_read_as_they_are_written(tmp_path):
    """Episodes as the runs log them (torch's SummaryWriter, each stamped with its wall time),
    read once they reach the file, the new ones appended; a record written in part waits."""
    from torch.utils.tensorboard import SummaryWriter

    folder = tmp_path / "runs" / "made_up"
    writer = SummaryWriter(folder)
    reader = tts.EventEpisodes(tmp_path, launched=90.0)
    writer.add_scalar("charts/episodic_return", 10.0, 4, walltime=100.0)
    for value in (20.0, 30.0):  # two episodes that ended on one step
        writer.add_scalar("charts/episodic_return", value, 8, walltime=101.5)
    writer.add_scalar("losses/td_loss", 1.0, 8, walltime=101.5)  # not an episode
    writer.flush()
    assert reader.read() == {"runs/made_up": [(10.0, 4, 10.0), (11.5, 8, 20.0), (11.5, 8, 30.0)]}
    (path,) = folder.glob("events.out.tfevents.*")
    written = path.read_bytes()
    writer.add_scalar("charts/episodic_return", 40.0, 12, walltime=107.25)
    writer.close()
    whole = path.read_bytes()
    path.write_bytes(whole[: len(written) + (len(whole) - len(written)) // 2])
    assert reader.read()["runs/made_up"][3:] == []
    path.write_bytes(whole)
    assert reader.read()["runs/made_up"][3:] == [(17.25, 12, 40.0)]


def test_cleanrls_printed_episodes_are_stamped_as_they_arrive():
    lines = (
        "SPS: 12\nglobal_step=512, episodic_return=[23.]\nglobal_step=640, episodic_return=-1.5e2\n"
    )
    reader = tts.PrintedEpisodes(io.StringIO(lines), launched=time.time())
    reader.thread.join(timeout=10)
    episodes = reader.read()["cleanrl"]
    assert [(step, r) for _, step, r in episodes] == [(512, 23.0), (640, -150.0)]
    assert all(0 <= seconds < 10 for seconds, _, _ in episodes)


def call(tmp_path, capsys, *flags):
    """A whole call of the benchmark on the fake scripts in `tmp_path`: its exit status, result
    (None without one), stdout and stderr."""
    (tmp_path / "fake.py").write_text(FAKE_RUN)
    out = tmp_path / "out"
    argv = ["--scripts-dir", str(tmp_path), "--out-dir", str(out), "--device", "cpu", *flags]
    status = tts.main(argv)
    results = sorted(out.glob("*.json"))
    output = capsys.readouterr()
    return status, json.loads(results[0].read_text()) if results else None, output


@pytest.mark.slow  # about 11 s: 11 launches of a small interpreter
def test_a_call_kills_runs_once_solved_counts_from_launch_and_keeps_unsolved_ones(tmp_path, capsys):
    checkout = tmp_path / "cleanrl"
    (checkout / "cleanrl").mkdir(parents=True)
    (checkout / "cleanrl_utils").mkdir()
    (checkout / "cleanrl" / "fake.py").write_text(FAKE_CLEANRL)
    solving = "fake --hang --returns 0,0,500,500,600"  # the mean of the last 2 reaches 475 at 3
    members = "fake --returns 0,500,600,600 --members 3 --member-step -100"  # one never solves
    unsolved = "fake --returns 10,20"
    flags = ["--threshold", "475", "--window", "2", "--seeds", "2", "--timeout", "60"]
    variants = ["--variants", solving, members, unsolved]
    cleanrl = ["--cleanrl", str(checkout), "--cleanrl-flags=--fast"]
    status, result, output = call(tmp_path, capsys, *flags, *cleanrl, *variants)
    assert status == 0, output.err
    rows = {r["variant"]: r for r in result["rows"]}
    assert list(rows) == ["CleanRL fake.py", "CleanRL fake.py --fast", solving, members, unsolved]
    # fill runs aside, each variant ran once per seed, in turn
    assert {key: len(runs) for key, runs in result["runs"].items()} == {
        f"{v} (warm)": 2 for v in rows
    }
    row = rows[solving]
    assert (row["solved"], row["members"], row["steps_median"]) == (1.0, 2, 450)  # 300, 600
    # the solving episode was stamped 3 s after the fake's start, which came after its launch
    assert 3 <= row["seconds_min"] <= row["seconds_max"] < 3 + 20
    for run in result["runs"][f"{solving} (warm)"]:
        assert run["status"] is None and run["run_seconds"] < 30  # killed, not waited for
    # member m's returns 100 m lower: member 0 solves at episode 2, member 1 at 3, member 2 never
    row = rows[members]
    assert (row["solved"], row["members"]) == (pytest.approx(2 / 3), 6)
    assert row["all_members_median"] is None  # one member never solved
    for run in result["runs"][f"{members} (warm)"]:
        steps = sorted(point[1] for point in run["members"].values() if point)
        assert steps == [200 * run["seed"], 300 * run["seed"]] and len(run["members"]) == 3
    row = rows[unsolved]
    assert (row["solved"], row["seconds_median"], row["steps_median"]) == (0.0, None, None)
    assert all(run["status"] == 0 for run in result["runs"][f"{unsolved} (warm)"])
    row = rows["CleanRL fake.py"]  # its 480 and 490 solve at step 12
    assert (row["solved"], row["steps_median"]) == (1.0, 12)
    assert rows[solving]["vs_cleanrl"] == pytest.approx(
        row["seconds_median"] / rows[solving]["seconds_median"]
    )
    # with flags, CleanRL's script solves at step 4, and ours are still compared with its defaults
    assert rows["CleanRL fake.py --fast"]["steps_median"] == 4
    assert rows["CleanRL fake.py --fast"]["vs_cleanrl"] == pytest.approx(
        row["seconds_median"] / rows["CleanRL fake.py --fast"]["seconds_median"]
    )
    assert "| `fake --returns 10,20` | warm | 0% of 2 | n/a |" in output.out


def test_a_run_that_fails_fails_the_call(tmp_path, capsys):
    flags = ["--seeds", "1", "--cache", "cold", "--variants", "fake --status 4"]
    status, result, output = call(tmp_path, capsys, *flags)
    assert status == 1 and result is None
    assert "fake.py --status 4 --env-id CartPole-v1 --seed 1 exited with status 4" in output.err


def assert_refused(argv, words, capsys):
    """`main(argv)` exits 2 with one line on stderr that holds each of `words`."""
    with pytest.raises(SystemExit) as exit:
        tts.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and len(lines) == 1
    assert all(word in lines[0] for word in words), lines[0]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--env-id", "Hopper-v4", "--variants", "pqn_cpu"], ["--env-id Hopper-v4", "threshold"]),
        (["--variants", "no_such_script"], ["--variants", "no_such_script"]),
        (["--variants", "pqn_cpu --seed 3"], ["--seed", "benchmark's"]),
        (["--variants", "pqn_cpu", "--cleanrl", "/nonexistent"], ["--cleanrl"]),
        (["--variants", "pqn_cpu", "--window", "0"], ["--window"]),
        (["--variants", "pqn_cpu", "--cleanrl-flags=--fast"], ["--cleanrl-flags", "--cleanrl"]),
        ([], ["either --variants or --merge"]),
        (["--variants", "pqn_cpu", "--merge", "a.json"], ["either --variants or --merge"]),
    ],
)
def test_bad_input_exits_2_with_one_line(flags, words, capsys):
    assert_refused(flags, words, capsys)


def stored(path, seeds, ours, theirs, **changed):
    """A result as `main` writes it, of `pqn_cpu` and CleanRL's pqn.py, a run per seed that solved
    at (seconds, steps) or did not (None); its path."""
    settings = dict(env_id="CartPole-v1", threshold=475, window=20, device="cpu", timeout=60)
    settings |= dict(seeds=seeds, started=f"at {seeds[0]}", load=[seeds[0], seeds[-1]]) | changed

    def runs(points):
        return [
            dict(members={f"runs/{s}": p}, status=None, run_seconds=50, seed=s)
            for s, p in zip(seeds, points)
        ]

    machine = dict(cpu="test", cores=2, gpu=None, versions={"torch": "2.13.0+cpu"})
    result = dict(machine=machine, settings=settings)
    result["runs"] = {"CleanRL pqn.py (warm)": runs(theirs), "pqn_cpu (warm)": runs(ours)}
    path.write_text(json.dumps(result))
    return str(path)


def test_merge_joins_results_of_other_seeds_and_computes_their_rows_again(tmp_path, capsys):
    points = dict(ours=[[2, 200], None], theirs=[[10, 1], [20, 1]])
    a = stored(tmp_path / "a.json", [1, 2], **points, timeout=100)
    b = stored(tmp_path / "b.json", [3], ours=[[4, 400]], theirs=[[30, 1]])
    assert tts.main(["--merge", a, b, "--out-dir", str(tmp_path / "out")]) == 0
    result = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert result["settings"]["seeds"] == [1, 2, 3] and result["settings"]["load"] == [1, 3]
    assert result["settings"]["timeout"] == 60  # a's runs all ended within b's 60 s
    assert [part["started"] for part in result["settings"]["parts"]] == ["at 1", "at 3"]
    assert [run["seed"] for run in result["runs"]["pqn_cpu (warm)"]] == [1, 2, 3]
    rows = {r["variant"]: r for r in result["rows"]}
    ours, cleanrl = rows["pqn_cpu"], rows["CleanRL pqn.py"]
    # seconds 2, infinite, 4: the median is 4 s, at 400 steps
    assert (ours["solved"], ours["seconds_median"], ours["steps_median"]) == (2 / 3, 4, 400)
    assert (cleanrl["seconds_median"], ours["vs_cleanrl"]) == (20, 5)
    assert "seeds 1-3" in capsys.readouterr().out


@pytest.mark.parametrize(
    "second, words",
    [
        (dict(seeds=[2]), ["a seed is in two"]),
        (dict(seeds=[3], threshold=400), ["b.json", "threshold differs"]),
        (dict(seeds=[3], timeout=30), ["a.json", "longer than another's timeout, 30 s"]),
    ],
)
def test_merge_refuses_results_that_share_a_seed_or_differ_in_one_line(
    tmp_path, capsys, second, words
):
    a = stored(tmp_path / "a.json", [1, 2], ours=[None, None], theirs=[None, None])
    b = stored(tmp_path / "b.json", ours=[None], theirs=[None], **second)
    assert_refused(["--merge", a, b], words, capsys)


def test_a_whole_process_refuses_with_one_line():
    command = [sys.executable, "-m", "benchmarks.time_to_solve", "--env-id", "Hopper-v4"]
    proc = subprocess.run(
        [*command, "--variants", "pqn_cpu"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert_user_error(proc, "--env-id Hopper-v4", "threshold")


def test_every_known_task_has_its_threshold():
    assert tts.THRESHOLDS == {
        "CartPole-v1": 475,
        "Acrobot-v1": -100,
        "MountainCar-v0": -110,
        "Pendulum-v1": -200,
        "InvertedDoublePendulum-v5": 9100,
        "HalfCheetah-v5": 4800,
        "Hopper-v5": 3000,
        "Walker2d-v5": 3000,
    }
