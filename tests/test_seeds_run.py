"""The run plumbing of the four seeds scripts (the same in each: tests/test_plumbing.py). A bad env
is refused before a run folder exists; member k is seeded `seed + k * num_envs`; a member whose loss
or weights turn non-finite is recorded once, with one line on stderr, and left out of the results
while the others go on; a run exits 3 only when every member diverged; the summary is written before
evaluation, which a signal does not skip (`Run.finish`'s rule). `Run` is driven by hand in the
test's process, without training, except in one short dqn_seeds run in which every member diverges.
About 15 s."""

import dataclasses
import functools
import json
import signal
import sys
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
    """Member k is the single-seed script with `--seed seed + k * num_envs`: no env seed is another
    member's."""
    assert make_run(script, seed=5, num_seeds=3, num_envs=2).seeds == [5, 7, 9]
    assert make_run(script, seed=5, num_seeds=3).seeds == [5, 6, 7]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_diverged_member_is_recorded_once_and_left_out(script, make_run, capsys):
    """Member 1's loss turns nan, member 2's weights end nan (a nan explained variance is no loss):
    one stderr line each naming member, seed, step, loss and rate flags; the summary (strict JSON,
    on disk before evaluating) lists both, leaves them out of the results, exit 0."""
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
        written = strict_json((Path(run.folder.dir) / "summary.json").read_text())
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
    assert sorted(path.name for path in Path(run.folder.dir).glob("*.pt")) == [files[0], files[3]]


def never_evaluate(member, episodes, videos):
    pytest.fail(f"member {member} was evaluated")


def test_a_run_whose_every_member_diverged_exits_3_without_files_or_evaluation(make_run, capsys):
    run = make_run("dqn_seeds", num_seeds=2, save_model=True, eval_episodes=1)
    run.log_progress(100, dict(td_loss=torch.tensor([NAN, 1.0]), q_values=torch.zeros(2)))
    run.log_progress(200, dict(td_loss=torch.tensor([NAN, -INF]), q_values=torch.zeros(2)))
    assert all(log.diverged for log in run.logs) and run.stopped  # the loops stop on it
    with pytest.raises(SystemExit) as stop:
        run.finish(CPU, [{"w": torch.ones(1)}] * 2, never_evaluate)
    out, err = capsys.readouterr()
    assert stop.value.code == 3 and len(err.strip().splitlines()) == 2
    s = summary_line(out)
    assert [d["step"] for d in s["diverged"]] == [100, 200] and s["diverged"][1]["value"] == "-inf"
    assert s["return_means"] == [None, None] and s["return_mean"] is None
    assert s["model_files"] == [None, None] and s["model_file"] is None
    assert s["eval_returns"] == [None, None] and s["eval_return_mean"] is None
    assert not list(Path(run.folder.dir).glob("*.pt"))


def test_after_a_signal_the_summary_is_written_then_each_member_evaluated(make_run, capsys):
    """A first SIGTERM (Slurm's, 30 s before its SIGKILL): as a single run, the models are saved,
    the summary written (kept should the job be killed while it evaluates), each member evaluated,
    and the run exits 143."""
    run = make_run("dqn_seeds", num_seeds=2, save_model=True, eval_episodes=5)
    run.log_episodes(10, [[1.0], [2.0]])
    run.signals.received = signal.SIGTERM
    written = []

    def evaluate(member, episodes, videos):
        written.append(strict_json((Path(run.folder.dir) / "summary.json").read_text()))
        return [float(member)] * episodes

    with pytest.raises(SystemExit) as stop:
        run.finish(CPU, [{"w": torch.ones(1)}] * 2, evaluate)
    s = summary_line(capsys.readouterr().out)
    assert stop.value.code == 143 and s["interrupted"] and s["diverged"] == []
    assert written[0]["interrupted"] and written[0]["eval_returns"] == []
    assert s["eval_returns"] == [[0.0] * 5, [1.0] * 5] and s["eval_return_mean"] == 0.5
    assert s["return_mean"] == 1.5 and all(Path(path).exists() for path in s["model_files"])


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


def test_a_sweep_trains_each_setting_with_the_same_seeds(make_run):
    """Two learning rates x two discounts, 2 seeds of 2 envs each: 8 members, setting by setting,
    the last flag fastest; each setting's members have the seeds of a run without a sweep, and
    their envs its env seeds. Each member's flags are a single run's (one value each)."""
    run = make_run("dqn_seeds", seed=5, num_seeds=2, num_envs=2, learning_rate=(1e-3, 3e-4))
    assert run.seeds == [5, 7, 5, 7] and run.env_seeds == [5, 6, 7, 8] * 2
    run = make_run("dqn_seeds", num_seeds=2, learning_rate=(1e-3, 3e-4), gamma=(0.9, 0.99))
    assert run.seeds == [1, 2] * 4
    flags = [(s.learning_rate, s.gamma, s.tau) for s in run.member_settings]
    assert flags == [(lr, g, 1.0) for lr in (1e-3, 3e-4) for g in (0.9, 0.9, 0.99, 0.99)]
    assert run.labels[:3] == ["setting0_seed1", "setting0_seed2", "setting1_seed1"]
    values = load("dqn_seeds").member_values(run.args, 8, CPU)
    assert values["gamma"].tolist() == pytest.approx([0.9, 0.9, 0.99, 0.99] * 2)
    assert values["tau"].tolist() == [1.0] * 8


def sweep_run(make_run, capsys):
    """A finished sweep of SAC (autotune on and off x two q learning rates, 2 seeds) driven by hand:
    member 5 diverges, members 6 and 7 (a whole setting) too; its summary (strict JSON) and the
    table it printed."""
    flags = dict(num_seeds=2, q_lr=(1e-3, 1e-2), autotune=(True, False), save_model=True)
    run = make_run("sac_continuous_action_seeds", **flags)
    run.log_episodes(10, [[float(k)] for k in range(8)])
    run.log_progress(100, dict(qf_loss=torch.tensor([0.0] * 5 + [NAN] * 3)))
    run.finish(CPU, [{"w": torch.ones(1)}] * 8, never_evaluate)
    out, err = capsys.readouterr()
    return (
        run,
        strict_json(Path(summary_line(out.splitlines()[-1])["summary_file"]).read_text()),
        out,
        err,
    )


def test_a_sweep_reports_each_members_flags_and_a_table_of_the_settings(make_run, capsys):
    """Each member's flags beside its return; per setting (grid order) its flags, members and
    statistics without the diverged; the table (printed, sweep.md) ranks settings best first,
    sweep.png plots them; a diverged member's line names its own rates; model files per setting."""
    run, s, out, err = sweep_run(make_run, capsys)
    assert s["hyperparameters"][5] == dict(
        gamma=0.99, tau=0.005, policy_lr=3e-4, q_lr=1e-2, alpha=0.2, autotune=True
    )
    assert s["return_means"] == [0.0, 1.0, 2.0, 3.0, 4.0, None, None, None]
    rows = s["settings"]
    got = [(r["q_lr"], r["autotune"], r["members"]) for r in rows]
    assert got == [
        (1e-3, True, [0, 1]),
        (1e-3, False, [2, 3]),
        (1e-2, True, [4, 5]),
        (1e-2, False, [6, 7]),
    ]
    assert (rows[1]["return_mean"], rows[1]["return_std"]) == (2.5, 0.5)
    assert (rows[2]["return_mean"], rows[2]["return_min"], rows[2]["return_max"]) == (4.0, 4, 4)
    assert rows[3]["return_mean"] is None and rows[3]["return_means"] == [None, None]
    table = (Path(run.folder.dir) / "sweep.md").read_text()
    assert table in out and "4 settings x 2 seeds" in table
    lines = [line for line in table.splitlines() if line.startswith("| 0.")]
    assert lines == [
        "| 0.01 | True | 4.0 | 0.0 | 4.0 | 4.0 | 1/2 |",
        "| 0.001 | False | 2.5 | 0.5 | 2.0 | 3.0 | 2/2 |",
        "| 0.001 | True | 0.5 | 0.5 | 0.0 | 1.0 | 2/2 |",
        "| 0.01 | False | - | - | - | - | 0/2 |",
    ]
    assert (Path(run.folder.dir) / "sweep.png").stat().st_size > 1000
    assert (
        "member 5 (seed 2) diverged at step 100" in err and "--policy-lr 0.0003 --q-lr 0.01" in err
    )
    assert Path(s["model_files"][2]).name == "sac_continuous_action_seeds_setting1_seed1.pt"
    saved = torch.load(s["model_files"][2], weights_only=True)["args"]
    assert (saved["q_lr"], saved["autotune"], saved["seed"]) == (1e-3, False, 1)


def test_a_sweep_without_matplotlib_writes_its_table_and_skips_the_plot(
    make_run, capsys, monkeypatch
):
    for module in ("matplotlib", "matplotlib.figure"):  # importing them raises ImportError
        monkeypatch.setitem(sys.modules, module, None)
    run, s, out, err = sweep_run(make_run, capsys)
    assert (Path(run.folder.dir) / "sweep.md").exists() and not (
        Path(run.folder.dir) / "sweep.png"
    ).exists()
    assert "sweep.png skipped: matplotlib is not installed" in err


def test_a_flag_of_every_member_given_several_values_exits_2_with_the_reason(capsys):
    """On the command line, before tyro: a flag that sizes tensors or times steps, given several
    values, exits 2 in one line saying why and which flags sweep; a swept flag, a flag with one
    value and negative numbers pass."""
    sweep_argv = load("td3_continuous_action_seeds").sweep_argv
    Args = load("td3_continuous_action_seeds").Args
    argv = ["--learning-rate", "1e-3", "3e-4", "--seed", "-1", "--no-compile", "--noise-clip", "1"]
    assert sweep_argv(Args, argv) == argv
    with pytest.raises(SystemExit) as stop:
        sweep_argv(Args, ["--gamma", "0.9", "--buffer-size", "1000", "-2000", "--compile"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and line.startswith("error: --buffer-size takes one value, got 2")
    assert "shape" in line and "--learning-rate --gamma --tau --policy-noise" in line


SIBLINGS = [
    (script, script.removesuffix("_seeds") + variant)
    for script in SCRIPTS
    for variant in ("", "_torchcompile", "_cpu")
]


@pytest.mark.parametrize("script, sibling", SIBLINGS, ids=[f"{s}-{b}" for s, b in SIBLINGS])
def test_a_seeds_script_takes_its_siblings_spelling_of_every_boolean_flag(script, sibling):
    """Each boolean flag the seeds script shares with a single-seed one, as `--flag` and `--no-flag`
    anywhere on the line, parses (`sweep_argv`, then tyro) to the sibling's value."""
    import tyro

    seeds, single = load(script), load(sibling)
    shared = {f.name for f in dataclasses.fields(seeds.Args)}
    booleans = [f.name for f in dataclasses.fields(single.Args) if f.type is bool]
    booleans = [name for name in booleans if name in shared]
    assert booleans
    if script == "sac_continuous_action_seeds":
        assert "autotune" in booleans
    for name in booleans:
        for spelling in (f"--{name}", f"--no-{name}"):
            spelling = spelling.replace("_", "-")
            for argv in ([spelling], [spelling, "--seed", "3"], ["--seed", "3", spelling]):
                expected = getattr(tyro.cli(single.Args, args=argv), name)
                got = getattr(tyro.cli(seeds.Args, args=seeds.sweep_argv(seeds.Args, argv)), name)
                assert got in (expected, (expected,)), (argv, got, expected)


def test_a_sweeps_boolean_flag_still_takes_several_values():
    seeds = load("sac_continuous_action_seeds")
    argv = ["--autotune", "True", "False", "--no-compile"]
    assert seeds.sweep_argv(seeds.Args, argv) == argv
    argv = seeds.sweep_argv(seeds.Args, ["--autotune", "--no-compile"])
    assert argv == ["--autotune", "True", "--no-compile"]
