"""CleanRL's TensorBoard scalars: every run writes `charts/episodic_return`,
`charts/episodic_length`, `charts/SPS`, `losses/<metric>` and the hyperparameters' table to
`runs/<run_name>/` (a seeds script: one folder per member under it), read back here with
TensorBoard's own reader; `--no-tensorboard` writes no event file and imports no TensorBoard."""

import json
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from conftest import SCRIPTS, load_script, run_script, script_env, summary
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# DQN on CartPole past its first updates, eagerly: short episodes, losses logged every 100 steps
DQN = ("--total-timesteps", 1500, "--learning-starts", 1000, "--no-compile")


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


def test_a_run_writes_cleanrls_scalars_and_its_returns_are_the_summarys_curve(tmp_path):
    result = summary(run_script("dqn_cpu", *DQN, "--run-name", "tb", cwd=tmp_path))
    folder = tmp_path / "runs" / "tb"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    assert result["episodes"] > 10
    flags = dict(env_id="CartPole-v1", seed=1, learning_starts=1000, tensorboard=True)
    assert_cleanrl_charts(events(folder), result["curve"], ["td_loss", "q_values"], flags)


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
    process logged past its checkpoint would be hidden: `purge_step`)."""
    assert train("dqn_cpu", *DQN, "--run-name", "job", stop_at=1200) == 143
    assert train("dqn_cpu", *DQN, "--run-name", "job", "--resume", "auto") == 0
    folder = tmp_path / "runs" / "job"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2
    result = json.loads((folder / "summary.json").read_text())
    assert len(result["resumes"]) == 1
    assert_cleanrl_charts(events(folder), result["curve"], ["td_loss"], dict(seed=1))


def test_events_are_flushed_once_a_second_and_all_of_them_at_close(tmp_path, monkeypatch):
    """`Scalars` writes the events once a second and at close, in their order, each with its step
    and the time it came (not the time it was written); the flags' table is the one torch's
    `add_text` writes. Each record's checksum (google-crc32c's, not TensorBoard's pure-Python one)
    is TensorBoard's: its reader checks them."""
    runs = load_script("runs")
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    from torch.utils.tensorboard.summary import text

    for data in (b"", b"x", bytes(range(256)) * 3):
        assert runs.masked_crc32c(data) == struct.pack("<I", masked_crc32c(data))
    flags = {"seed": 1, "env_id": "CartPole-v1"}
    table = "|param|value|\n|-|-|\n|seed|1|\n|env_id|CartPole-v1|"
    writer = runs.Scalars(str(tmp_path / "table"), flags)
    assert writer.table("hyperparameters", flags) == text("hyperparameters", table)  # add_text's
    writer.close()
    clock = [100.0]
    monkeypatch.setattr(
        runs, "time", SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0])
    )
    writer = runs.Scalars(str(tmp_path), {"seed": 1})
    writer.add(1, [("losses/td_loss", 0.5)])
    writer.add_episodes(2, [10.0, 12.0])
    assert "losses/td_loss" not in events(tmp_path).Tags()["scalars"]  # not flushed yet
    clock[0] += 1.5
    writer.add(3, [("losses/td_loss", 0.25)])
    assert scalars(events(tmp_path), "losses/td_loss") == [(1, 0.5), (3, 0.25)]
    writer.add(4, [("losses/td_loss", 0.125)])
    writer.close()
    accumulator = events(tmp_path)
    assert scalars(accumulator, "losses/td_loss") == [(1, 0.5), (3, 0.25), (4, 0.125)]
    assert scalars(accumulator, "charts/episodic_return") == [(2, 10.0), (2, 12.0)]
    times = [event.wall_time for event in accumulator.Scalars("losses/td_loss")]
    assert times == [100.0, 101.5, 101.5]
