"""The benchmark harness, driven by tiny fake scripts in tmp_path: no real training, a few seconds
in all; the env-only limit also on each real script's env, for a fraction of a second."""

import json
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import tyro
from conftest import ROOT, SCRIPTS, load_script, script_env
from gymnasium.spaces import Discrete

from benchmarks import env_limit, machine, plots, report, run, step_time, update_limit
from benchmarks.registry import ALGOS, VARIANTS, Algo
from benchmarks.studies import scaling, seeds, sweeps

SAC = next(algo for algo in ALGOS if algo.name == "sac")
FAKE = Algo("fake", "fake", quick=("--budget", "quick"), full=("--budget", "full"))

# A fake training script, importable like a real one (Args, make_envs, main under a guard). Run, it
# logs its call to calls.txt beside it, then prints a SUMMARY with the (sps, return_mean) that
# SCHEDULE lists for its variant flags, taking the next entry each time that script runs with those
# flags, and a curve of 3 episodes averaging return_mean.
FAKE_SCRIPT = """
import dataclasses, json, sys
from pathlib import Path

import numpy as np

SCHEDULE = {schedule!r}


@dataclasses.dataclass
class Args:  # FAKE's budget flag and SAC's quick budget flags
    budget: str = "full"
    seed: int = 1
    env_id: str = "Fake-v0"
    num_envs: int = 2
    total_timesteps: int = 300
    learning_starts: int = 0
    measure_burnin: int = 0


class Space:
    def seed(self, seed):
        self.rng = np.random.default_rng(seed)

    def sample(self):
        return self.rng.uniform(-1.0, 1.0, (1,))


class Envs:
    def __init__(self, env_id, num_envs):
        self.env_id, self.num_envs = env_id, num_envs
        self.single_action_space, self.actions = Space(), []

    def reset(self):
        return np.zeros((self.num_envs, 1)), dict()

    def step(self, actions):
        self.actions.append(actions)

    def close(self):
        self.closed = True


def make_envs(env_id, num_envs):
    return Envs(env_id, num_envs)


def variant(words):
    return " ".join(word for word in words if word in ("--compile", "--cudagraphs"))


def main():
    stem, argv = Path(__file__).stem, sys.argv[1:]
    log = Path(__file__).with_name("calls.txt")
    calls = log.read_text().splitlines() if log.exists() else []
    log.write_text("".join(line + "\\n" for line in [*calls, " ".join([stem, *argv])]))
    earlier = [c for c in calls if c.split()[0] == stem and variant(c.split()) == variant(argv)]
    sps, return_mean = SCHEDULE[variant(argv)][len(earlier)]
    curve = [[100 * k, k / 10, (return_mean or 0) + k - 2] for k in (1, 2, 3)]
    curve = curve if return_mean is not None else []
    print("step 1 of 1")
    seed = int(argv[argv.index("--seed") + 1])
    summary = dict(script=stem, env_id="Fake-v0", seed=seed, device="cpu",
                   compile="--compile" in argv, cudagraphs="--cudagraphs" in argv, num_envs=2,
                   total_timesteps=300, sps=sps, sps_wall=sps / 2, episodes=len(curve),
                   return_mean=return_mean, wall_s=0.4, torch_version="fake", curve=curve,
                   threads=1)
    # a real script's is runs/<run_name>/summary.json
    path = Path(__file__).with_name("summary-%d.json" % len(calls))
    path.write_text(json.dumps(summary))
    line = dict((key, value) for key, value in summary.items() if key != "curve")
    print("SUMMARY " + json.dumps(dict(line, summary_file=str(path))))


if __name__ == "__main__":
    main()
"""
FAILING_SCRIPT = "import sys\nprint('boom: bad flag', file=sys.stderr)\nsys.exit(1)\n"
SILENT_SCRIPT = "print('trained, but forgot the summary')\n"
NO_CURVE_SCRIPT = """import json, pathlib
path = pathlib.Path(__file__).with_name("no-curve-summary.json")
path.write_text(json.dumps(dict(sps=1.0, episodes=0)))
print("SUMMARY " + json.dumps(dict(sps=1.0, episodes=0, summary_file=str(path))))
"""

EAGER = {"": [(100, -10.0), (120, -20.0), (90, None)]}
TWIN = {
    "": [(150, 1.0), (200, 2.0), (250, 3.0)],
    "--compile": [(300, None), (500, None), (400, None)],
}
CPU = {"": [(800, 5.0), (700, 6.0), (600, 7.0)]}
ENV_SECONDS = "0.05"


def write_scripts(directory, algo, eager_source, twin_source):
    """Write `algo`'s scripts into `directory` (its CPU script, where it has one, on the CPU
    schedule); returns the directory."""
    (directory / f"{algo.eager}.py").write_text(eager_source)
    (directory / f"{algo.twin}.py").write_text(twin_source)
    if algo.cpu:
        (directory / f"{algo.eager}_cpu.py").write_text(FAKE_SCRIPT.format(schedule=CPU))
    return directory


FAKE_TWIN = FAKE_SCRIPT.format(schedule=TWIN)


def fake_scripts(directory, algo=FAKE, twin_source=FAKE_TWIN):
    """`algo`'s scripts in `directory`: the fake eager script on the EAGER schedule and
    `twin_source`."""
    return write_scripts(directory, algo, FAKE_SCRIPT.format(schedule=EAGER), twin_source)


def calls(directory):
    """The calls (script stem and flags) that the fake scripts in `directory` logged, in order."""
    return (directory / "calls.txt").read_text().splitlines()


def main_args(scripts, out, *extra):
    """`benchmarks.run` arguments for SAC's quick budget with the scripts in `scripts`, results into
    `out`."""
    flags = ["--env-seconds", ENV_SECONDS, "--scripts-dir", str(scripts), "--out-dir", str(out)]
    return ["--algos", "sac", "--quick", *flags, *extra]


def table_row(algo, variant, sps_median, sps_min, sps_max, return_mean, env_only_sps, vs_eager):
    """A row of `report.rows`, from its values (no update limit: not a `_cpu` script's)."""
    row = dict(algo=algo, variant=variant, runs=2, sps_median=sps_median, sps_min=sps_min)
    row |= dict(sps_max=sps_max, return_mean=return_mean, vs_eager=vs_eager)
    return row | dict(env_only_sps=env_only_sps, update_limit_sps=None, of_update_limit=None)


def test_the_update_limit_columns_appear_only_where_a_run_measured_them():
    eager = table_row("sac", "eager", 100, 90, 110, -273.2, 18000, 1.0)
    cpu = table_row("sac", "cpu", 160, 150, 170, -273.2, 18000, 1.6)
    settings = dict(budget="quick", repeats=2, seeds=[1, 2], started="2026-11-29T10:05")
    without = report.markdown([eager, cpu], machine.machine_info(), settings).splitlines()
    assert without[3:] == [
        "| algo | variant | sps median | sps min-max | vs eager | env-only sps | return mean"
        " | runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        "| sac | eager | 100 | 90-110 | 1.00x | 18000 | -273.2 | 2 |",
        "| sac | cpu | 160 | 150-170 | 1.60x | 18000 | -273.2 | 2 |",
    ]
    cpu |= dict(update_limit_sps=271.0, of_update_limit=160 / 271)
    limited = report.markdown([eager, cpu], machine.machine_info(), settings).splitlines()
    assert limited[3].endswith(
        "| env-only sps | update limit sps | of limit | return mean | runs |"
    )
    assert limited[4] == "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    assert limited[5:] == [
        "| sac | eager | 100 | 90-110 | 1.00x | 18000 | n/a | n/a | -273.2 | 2 |",
        "| sac | cpu | 160 | 150-170 | 1.60x | 18000 | 271 | 59% | -273.2 | 2 |",
    ]


def curve_run(algo, variant, curve):
    """A run record whose SUMMARY holds `curve`."""
    return {"algo": algo, "variant": variant, "summary": {"curve": curve}}


@pytest.mark.parametrize("cuda", [False, True])
def test_plan_alternates_variants_with_one_seed_per_round_and_cuda_variants_only_with_cuda(cuda):
    other = Algo("other", "other", quick=(), full=())
    order = [
        (algo.name, variant.name, repeat, seed)
        for algo, variant, repeat, seed in run.plan([FAKE, other], [7, 8], cuda)
    ]
    variants = [v.name for v in VARIANTS if (cuda or not v.needs_cuda) and v.name != "cpu"]
    rounds = [(0, 7), (1, 8)]
    expected = [(name, v, *r) for name in ("fake", "other") for r in rounds for v in variants]
    assert order == expected
    assert ("cudagraphs" in variants) == cuda and ("compile+cudagraphs" in variants) == cuda
    with_cpu = Algo("with_cpu", "with_cpu", quick=(), full=(), cpu=True)
    planned = [variant.name for _, variant, _, _ in run.plan([with_cpu], [7], cuda)]
    assert planned == [*variants, "cpu"]


def test_round_seeds_cycle_through_the_seeds():
    assert run.round_seeds(2, [1, 2, 3]) == [1, 2]
    assert run.round_seeds(5, [7, 8]) == [7, 8, 7, 8, 7]


def test_command_adds_budget_seed_then_variant_flags(tmp_path):
    flags = {"compile": ("--threads", "1")}
    algo = Algo("fake", "fake", quick=("--q",), full=("--f",), variant_flags=flags)
    compile_variant = next(v for v in VARIANTS if v.name == "compile")
    cmd = run.command(algo, compile_variant, tmp_path, quick=True, seed=5)
    twin = str(tmp_path / "fake_torchcompile.py")
    assert cmd == [sys.executable, twin, *"--q --seed 5 --compile --threads 1".split()]
    eager_variant = next(v for v in VARIANTS if v.name == "eager")
    eager = str(tmp_path / "fake.py")
    assert run.command(algo, eager_variant, tmp_path, quick=False, seed=1)[1:] == [
        eager,
        "--f",
        "--seed",
        "1",
    ]
    limit = run.env_limit_command(algo, tmp_path, quick=True, seed=5, seconds=2.0)[1:]
    assert limit == ["-m", "benchmarks.env_limit", "--seconds", "2.0", eager, "--q", "--seed", "5"]


def test_rows_medians_spread_ratios_returns_and_env_limits():
    runs = [
        ("eager", 100, 1.0),
        ("compile", 300, None),
        ("eager", 200, 3.0),
        ("compile", 600, None),
    ]
    runs = [
        dict(algo="fake", variant=variant, flags=["fake.py"])
        | dict(summary=dict(sps=sps, return_mean=return_mean))
        for variant, sps, return_mean in runs
    ]
    assert report.rows(runs, {"fake": {"sps": 900.0}}) == [
        table_row("fake", "eager", 150, 100, 200, 2.0, 900.0, 1.0),
        table_row("fake", "compile", 450, 300, 600, None, 900.0, 3.0),
    ]
    assert [r["env_only_sps"] for r in report.rows(runs, {})] == [None, None]


def test_rows_give_a_cpu_scripts_update_limit_at_its_runs_threads_and_dtype():
    limits = dict(script="fake_cpu", threads=[1, 2])
    limits["limits"] = dict(
        float32={"1": dict(sps=100.0), "2": dict(sps=200.0)},
        bfloat16={"1": dict(sps=300.0), "2": dict(sps=400.0)},
    )
    runs = [  # (variant, script, flags, sps, the threads it ended on)
        ("eager", "fake", [], 50, None),
        ("cpu", "fake_cpu", [], 80, 1),
        ("cpu", "fake_cpu", [], 150, 2),
        ("cpu --bf16", "fake_cpu", ["--bf16"], 240, 1),
        ("cpu --bf16", "fake_cpu", ["--bf16"], 200, 2),
    ]
    runs = [
        dict(algo="fake", variant=variant, flags=flags)
        | dict(summary=dict(script=script, sps=sps, threads=threads, return_mean=None))
        for variant, script, flags, sps, threads in runs
    ]
    table = report.rows(runs, {}, {"fake": limits})
    limit = [(r["variant"], r["update_limit_sps"], r["of_update_limit"]) for r in table]
    # each run over its own limit: (0.8, 0.75) and (0.8, 0.5), medians of the two
    assert limit == [("eager", None, None), ("cpu", 150.0, 0.775), ("cpu --bf16", 350.0, 0.65)]


def test_main_runs_alternately_with_seeds_prints_the_table_and_writes_results_and_plots(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    measured = []  # the update limit is measured by its own module, tested below

    def update_limits(algos, scripts_dir, quick, seed, timeout):
        measured.append(([algo.name for algo in algos], scripts_dir, quick, seed))
        limits = {"float32": {"1": dict(sps=1400.0)}}
        return {"sac": dict(script=f"{SAC.eager}_cpu", threads=[1], limits=limits)}

    monkeypatch.setattr(run, "update_limits", update_limits)
    scripts = fake_scripts(tmp_path, SAC)
    out = tmp_path / "results"
    assert run.main(main_args(scripts, out, "--repeats", "3", "--seeds", "7", "8")) == 0
    assert measured == [(["sac"], scripts, True, 7)]

    budget = " ".join(SAC.quick)
    assert calls(scripts) == [
        call
        for seed in (7, 8, 7)
        for call in (
            f"{SAC.eager} {budget} --seed {seed}",
            f"{SAC.twin} {budget} --seed {seed}",
            f"{SAC.twin} {budget} --seed {seed} --compile",
            f"{SAC.eager}_cpu {budget} --seed {seed}",
        )
    ]

    (json_path,) = out.glob("*.json")
    document = json.loads(json_path.read_text())
    limit = document["env_limits"]["sac"]
    assert (limit["env_id"], limit["num_envs"]) == ("HalfCheetah-v4", 2)
    assert limit["env_steps"] % 2 == 0
    assert limit["sps"] == pytest.approx(limit["env_steps"] / limit["seconds"])

    table = capsys.readouterr().out
    assert "Budget: quick, 3 repeats per variant (seeds 7 8 7)" in table
    env = f"{limit['sps']:.0f}"
    assert f"| sac | eager | 100 | 90-120 | 1.00x | {env} | n/a | n/a | -15.0 | 3 |" in table
    assert f"| sac | torchcompile | 200 | 150-250 | 2.00x | {env} | n/a | n/a | 2.0 | 3 |" in table
    assert f"| sac | compile | 400 | 300-500 | 4.00x | {env} | n/a | n/a | n/a | 3 |" in table
    # the cpu runs' sps over the update limit, 800, 700 and 600 over 1400: median 50%
    assert f"| sac | cpu | 700 | 600-800 | 7.00x | {env} | 1400 | 50% | 6.0 | 3 |" in table
    assert "cudagraphs" not in table.split("| algo |")[1]

    stamp = json_path.stem
    written = [f"{stamp}.json", f"{stamp}.md", f"{stamp}-sps.png", f"{stamp}-sac-returns.png"]
    assert sorted(path.name for path in out.iterdir()) == sorted(written)
    assert json_path.with_suffix(".md").read_text() == table
    variants = ["eager", "torchcompile", "compile", "cpu"]
    assert [r["variant"] for r in document["runs"]] == variants * 3
    assert [r["seed"] for r in document["runs"]] == [7] * 4 + [8] * 4 + [7] * 4
    assert [r["summary"]["seed"] for r in document["runs"]] == [7] * 4 + [8] * 4 + [7] * 4
    sps = [100, 150, 300, 800, 120, 200, 500, 700, 90, 250, 400, 600]
    assert [r["summary"]["sps"] for r in document["runs"]] == sps
    curve = [[100, 0.1, -11.0], [200, 0.2, -10.0], [300, 0.3, -9.0]]
    assert document["runs"][0]["summary"]["curve"] == curve
    assert document["runs"][2]["flags"] == [*SAC.quick, "--seed", "7", "--compile"]
    assert document["runs"][0]["summary"]["script"] == SAC.eager
    settings = {"budget": "quick", "repeats": 3, "seeds": [7, 8, 7], "started": None}
    assert document["settings"] | {"started": None} == settings
    machine = document["machine"]
    assert machine["cores"] >= 1 and machine["gpu"] is None
    assert all(machine["versions"][name] for name in ("torch", "gymnasium", "tensordict"))
    rows = [(r["variant"], r["sps_median"], r["vs_eager"]) for r in document["table"]]
    assert {r["env_only_sps"] for r in document["table"]} == {limit["sps"]}
    medians = zip(variants, (100, 200, 400, 700), (1.0, 2.0, 4.0, 7.0))
    assert rows == list(medians)


@pytest.mark.parametrize(
    ("twin_source", "reason", "stderr_tail"),
    [
        (FAILING_SCRIPT, "exited with status 1", "boom: bad flag"),
        (SILENT_SCRIPT, "exited with status 0 but printed 0 SUMMARY lines, expected 1", None),
        (
            NO_CURVE_SCRIPT,
            "wrote a summary.json without a curve list (CONTRIBUTING.md: What a run prints)",
            None,
        ),
    ],
    ids=["exit-1", "no-summary", "no-curve"],
)
def test_a_failed_run_stops_with_one_line_naming_script_flags_and_status(
    tmp_path, twin_source, reason, stderr_tail
):
    scripts = fake_scripts(tmp_path, twin_source=twin_source)
    with pytest.raises(run.BenchmarkError) as error:
        run.benchmark([FAKE], scripts, seeds=[1, 2], quick=True, cuda=False)
    lines = str(error.value).splitlines()
    assert lines[0] == f"fake_torchcompile.py --budget quick --seed 1 {reason}"
    assert lines[1:] == ([stderr_tail] if stderr_tail else [])
    assert calls(scripts) == ["fake --budget quick --seed 1"]


def test_an_env_that_cannot_be_built_stops_with_the_env_limit_command_and_its_error(tmp_path):
    scripts = write_scripts(tmp_path, FAKE, SILENT_SCRIPT, SILENT_SCRIPT)
    with pytest.raises(run.BenchmarkError) as error:
        run.env_limits([FAKE], scripts, quick=True, seed=3, seconds=0.01)
    lines = str(error.value).splitlines()
    command = "-m benchmarks.env_limit --seconds 0.01 fake.py --budget quick --seed 3"
    assert lines[0] == command + " exited with status 1"
    # a script outside leanrl/ loads under a name with its folder's
    module = f"leanrl_{tmp_path.name}_fake"
    assert lines[-1] == f"AttributeError: module '{module}' has no attribute 'Args'"


def test_command_line_failure_exits_1_and_writes_nothing(tmp_path):
    scripts = fake_scripts(tmp_path, SAC, twin_source=FAILING_SCRIPT)
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "benchmarks.run", *main_args(scripts, out, "--repeats", "1")]
    kwargs = dict(capture_output=True, text=True, cwd=ROOT, env=script_env(), timeout=120)
    proc = subprocess.run(cmd, **kwargs)
    assert proc.returncode == 1
    stopped = [line for line in proc.stderr.splitlines() if line.startswith("benchmark stopped: ")]
    assert stopped == [
        f"benchmark stopped: {SAC.twin}.py {' '.join(SAC.quick)} --seed 1 exited with status 1"
    ]
    assert "boom: bad flag" in proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_algorithms_with_missing_scripts_are_skipped_with_a_note(tmp_path, capsys):
    (tmp_path / f"{SAC.eager}.py").write_text(FAKE_SCRIPT.format(schedule=EAGER))
    assert run.main(main_args(tmp_path, tmp_path)) == 1
    err = capsys.readouterr().err
    assert f"skipping sac: missing {tmp_path / SAC.eager}_cpu.py, {tmp_path / SAC.twin}.py" in err
    assert "no algorithm has all its scripts on disk" in err
    assert not (tmp_path / "calls.txt").exists()


def test_env_limit_builds_the_env_from_the_scripts_own_args_and_steps_it_with_pre_drawn_actions(
    tmp_path,
):
    module = load_script(FAKE.eager, fake_scripts(tmp_path))
    args, envs = env_limit.script_envs(module, ["--num-envs", "3", "--seed", "4"])
    assert (args.num_envs, args.seed, envs.env_id, envs.num_envs) == (3, 4, "Fake-v0", 3)
    actions = env_limit.random_actions(envs.single_action_space, 3, seed=4, batches=3)
    assert [batch.shape for batch in actions] == [(3, 1)] * 3

    def clock():
        """A clock on which each env step takes a millisecond."""
        return 0.001 * len(envs.actions)

    steps, seconds = env_limit.step_for(envs, actions, seconds=0.1, clock=clock)
    assert steps == 100 and seconds == pytest.approx(0.1)
    timed = envs.actions[env_limit.WARMUP_STEPS :]
    assert len(timed) == 100 and all(batch is actions[i % 3] for i, batch in enumerate(timed))


def test_random_actions_are_reproducible_batches_of_the_single_env_space():
    first, again = (env_limit.random_actions(Discrete(4), 5, seed=0, batches=4) for _ in range(2))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert all(batch.shape == (5,) and set(batch.tolist()) <= {0, 1, 2, 3} for batch in first)
    assert len({tuple(batch.tolist()) for batch in first}) > 1


@pytest.mark.parametrize("algo", ALGOS, ids=[algo.name for algo in ALGOS])
def test_env_limit_measures_every_registered_scripts_own_env(algo):
    script = SCRIPTS / f"{algo.eager}.py"
    if not script.exists():
        pytest.skip(f"{script.name} is not on disk")
    flags = [*algo.quick, "--seed", "1"]
    result = env_limit.measure(script, flags, seconds=0.05)
    defaults = load_script(algo.eager).Args()
    env_id = dict(zip(flags[::2], flags[1::2])).get("--env-id", defaults.env_id)
    assert (result["env_id"], result["num_envs"]) == (env_id, defaults.num_envs)
    assert result["env_steps"] > 0 and result["env_steps"] % result["num_envs"] == 0
    assert result["sps"] == pytest.approx(result["env_steps"] / result["seconds"])


def matmul_flops(name, layouts):
    """A recorded matmul's FLOPs: 2 m k n per product of its batch."""
    first, second = [shape for shape, *_ in layouts[-2:]]
    return 2 * np.prod(first) * second[-1]


@pytest.mark.parametrize(
    "name, total",
    [("sac_continuous_action_cpu", 1500), ("dqn_cpu", 1500), ("ppo_continuous_action_cpu", 20480)],
)
def test_update_limit_runs_a_short_budget_unless_the_flags_give_one(name, total):
    module = load_script(name)
    args = tyro.cli(module.Args, args=[*update_limit.budget(module)])
    assert args.total_timesteps == total < module.Args().total_timesteps
    given = tyro.cli(module.Args, args=[*update_limit.budget(module), "--total-timesteps", "3000"])
    assert given.total_timesteps == 3000


def test_update_limit_counts_the_learning_phase_of_a_cpu_scripts_own_main(monkeypatch):
    # TD3 on Pendulum: 300 random steps, 10 burn-in updates, then 20 counted steps
    flags = "--env-id Pendulum-v1 --total-timesteps 330 --learning-starts 300 --measure-burnin 10"
    script = SCRIPTS / "td3_continuous_action_cpu.py"
    flops, matmuls = update_limit.record(script, [*flags.split(), "--batch-size", "32"])
    # FlopCounterMode and the recorder saw the same updates: the recorded matmuls' FLOPs
    assert flops == pytest.approx(sum(matmul_flops(*k) * n for k, n in matmuls.items()))
    # per env step, the critic's 14 matmuls (the target actor's and the two target Q-networks'
    # 3 layers, the Q-networks' 3 and their backward's 5) and half the actor's 14
    calls = sum(matmuls.values())
    assert calls == 14 + 14 / 2
    assert all(dtype == "float32" for _, layouts in matmuls for *_, dtype in layouts[-2:])
    # one env step's matmuls at a stub millisecond a call: the limit is 1 / their time
    monkeypatch.setattr(update_limit, "seconds_per_call", lambda op, operands: 1e-3)
    assert update_limit.matmul_seconds(matmuls, threads=1) == pytest.approx(calls * 1e-3)


def test_update_limit_times_each_matmul_on_operands_of_its_own_layout():
    expanded = update_limit.operand((2, 3, 4), (0, 4, 1), "bfloat16")  # a broadcast operand
    assert (expanded.shape, expanded.stride(), expanded.dtype) == (
        (2, 3, 4),
        (0, 4, 1),
        torch.bfloat16,
    )
    assert torch.equal(expanded[0], expanded[1])
    transposed = update_limit.operand((3, 5), (1, 3), "float32")
    assert transposed.stride() == (1, 3) and torch.isfinite(transposed).all()
    now = [0.0]  # a clock that only the op moves: 10 ms a call

    def op():
        now[0] += 0.01

    assert update_limit.seconds_per_call(op, (), clock=lambda: now[0]) == pytest.approx(0.01)


def test_sps_bars_give_medians_asymmetric_spread_and_env_limit_per_algorithm():
    table = [
        table_row("a", "eager", 100, 90, 130, None, 1000.0, 1.0),
        table_row("b", "eager", 5, 5, 5, None, None, 1.0),
        table_row("a", "compile", 200, 150, 210, None, 1000.0, 2.0),
    ]
    a = dict(variants=["eager", "compile"], median=[100, 200], down=[10, 50], up=[30, 10])
    b = {"variants": ["eager"], "median": [5], "down": [0], "up": [0], "env_only": None}
    assert plots.sps_bars(table) == {"a": a | {"env_only": 1000.0}, "b": b}


def test_smooth_is_a_trailing_mean():
    assert plots.smooth([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    assert plots.smooth([4.0, 2.0], window=10) == [4.0, 3.0]
    assert plots.smooth([]) == []


def test_return_curves_split_each_runs_curve_by_variant_and_skip_runs_without_episodes():
    runs = [
        curve_run("a", "eager", [[10, 0.5, 1.0], [20, 1.5, 3.0]]),
        curve_run("b", "eager", [[1, 0.1, 9.0]]),
        curve_run("a", "compile", []),
        curve_run("a", "eager", [[15, 0.2, 5.0]]),
    ]
    assert plots.return_curves(runs, "a", window=2) == {
        "eager": [
            {"steps": [10, 20], "seconds": [0.5, 1.5], "returns": [1.0, 2.0]},
            {"steps": [15], "seconds": [0.2], "returns": [5.0]},
        ]
    }
    assert plots.return_curves(runs, "c") == {}


def test_plots_write_the_sps_png_and_a_returns_png_per_algorithm_with_episodes(tmp_path):
    table = [
        table_row("a", "eager", 100, 90, 130, -1.0, 1000.0, 1.0),
        table_row("b", "eager", 5, 5, 5, None, None, 1.0),
    ]
    runs = [curve_run("a", "eager", [[10, 0.5, 1.0], [20, 1.5, 3.0]]), curve_run("b", "eager", [])]
    paths = plots.write(tmp_path / "out", "stamp", table, runs)
    assert [path.name for path in paths] == ["stamp-sps.png", "stamp-a-returns.png"]
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == sorted(
        p.name for p in paths
    )
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plots_command_draws_one_runs_curve_from_its_summary_file_and_rejects_other_files(
    tmp_path, capsys
):
    path = tmp_path / "summary.json"
    summary = dict(script="s", env_id="Fake-v0", curve=[[8, 0.5, 1.0], [16, 1.0, 4.0]])
    path.write_text(json.dumps(summary))
    assert plots.read_summary(path) == summary
    assert plots.main([str(path), "--out", str(tmp_path / "curve.png"), "--baseline", "1.2"]) == 0
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path.write_text(json.dumps(dict(script="s", env_id="Fake-v0")))
    with pytest.raises(SystemExit) as exit_info:
        plots.main([str(path), "--out", str(tmp_path / "none.png")])
    assert exit_info.value.code == 2 and not (tmp_path / "none.png").exists()
    assert "is not a run's summary.json (no curve)" in capsys.readouterr().err


def test_cpu_model_names_family_model_and_widest_vector_extension(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    core = "model name\t: AMD EPYC\ncpu family\t: {family}\nmodel\t\t: 1\n"
    core += "flags\t\t: fpu {flags} sse2\n\n"
    # one block per core: the first counts
    cpuinfo.write_text(core.format(family=25, flags="avx avx2") * 2)
    assert machine.cpu_model(cpuinfo) == "AMD EPYC (family 25 model 1, AVX2)"
    cpuinfo.write_text(core.format(family=6, flags="avx avx2 avx512f avx512bw"))
    assert machine.cpu_model(cpuinfo) == "AMD EPYC (family 6 model 1, AVX-512)"
    cpuinfo.write_text("processor\t: 0\n")
    assert machine.cpu_model(cpuinfo) is None
    assert machine.cpu_model(tmp_path / "missing") is None


def test_scaling_efficiency_is_sps_over_n_times_the_single_process_median():
    runs = [
        {"processes": n, "summary": {"sps": sps, "return_mean": -1.0}}
        for n, sps in [(1, 100.0), (2, 150.0), (1, 120.0), (2, 190.0), (1, 90.0), (2, 170.0)]
    ]
    limits = {1: {"sps": 1000.0}, 2: {"sps": 1900.0}}
    single, double = scaling.rows(runs, limits)
    assert (single["sps_median"], single["efficiency"], single["env_only_sps"]) == (100, 1, 1000)
    assert (double["sps_median"], double["sps_min"], double["sps_max"]) == (170.0, 150.0, 190.0)
    assert double["speedup"] == pytest.approx(1.7) and double["efficiency"] == pytest.approx(0.85)
    settings = dict(env_id="X", num_envs=1, iterations=5, burnin=2, repeats=3, seeds=[1, 2, 3])
    settings |= dict(script_flags=[], started="now")
    table = scaling.markdown([single, double], machine.machine_info(), settings)
    assert "| 2 | 170 | 150-190 | 1.70x | 85% | 1900 |" in table


def test_scaling_run_past_its_timeout_leaves_no_process_behind(tmp_path):
    """A launcher that starts a child in a session of its own (as torchrun starts its ranks) and
    both sleep: the timeout kills the child too."""
    pid_file = tmp_path / "child.pid"
    launcher = (
        "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import "
        f"time; time.sleep(600)'], start_new_session=True); open({str(pid_file)!r}, "
        "'w').write(str(child.pid)); time.sleep(600)"
    )
    with pytest.raises(run.BenchmarkError, match="timeout"):
        scaling.execute([sys.executable, "-c", launcher], timeout=5)
    child = Path(f"/proc/{pid_file.read_text()}/stat")
    for _ in range(50):  # killed: gone, or a zombie until its new parent reaps it
        if not child.exists() or child.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the launcher's child is still running: {child.read_text()}")


# --- benchmarks.studies.seeds: a seeds script against N single-seed processes, and the GPU proxy
# ---------------------------

# A fake seeds or single-seed script: run, it prints a SUMMARY whose sps is 1000 x N x threads for a
# seeds run (`--num-seeds N --threads T`) and 600 for a single-seed run; imported, its make_envs
# builds N x num_envs fake envs
FAKE_SEEDS_SCRIPT = """
import dataclasses, json, sys
from pathlib import Path

import numpy as np


@dataclasses.dataclass
class Args:
    seed: int = 1
    num_seeds: int = 1
    num_envs: int = 3
    env_id: str = "Fake-v0"
    total_timesteps: int = 300
    learning_starts: int = 0


class Space:
    def seed(self, seed):
        self.rng = np.random.default_rng(seed)

    def sample(self):
        return self.rng.integers(2)


class Envs:
    def __init__(self, num_envs):
        self.num_envs, self.single_action_space = num_envs, Space()

    def reset(self):
        return np.zeros((self.num_envs, 1)), {}

    def step(self, actions):
        assert len(actions) == self.num_envs

    def close(self):
        pass


def make_envs(env_id, num_envs, seed, num_seeds):
    return Envs(num_envs * num_seeds)


if __name__ == "__main__":
    argv = sys.argv[1:]
    members = int(argv[argv.index("--num-seeds") + 1]) if "--num-seeds" in argv else None
    threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv else 2
    summary = dict(sps=600.0 if members is None else 1000.0 * members * threads, return_mean=10.0)
    path = Path(__file__).with_name(f"summary-{Path(__file__).stem}-{members}-{argv[-1]}.json")
    path.write_text(json.dumps(summary))
    print("SUMMARY " + json.dumps(dict(summary_file=str(path))))
"""


def test_seeds_benchmark_runs_each_n_against_p_single_seed_processes_and_writes_its_results(
    tmp_path, capsys
):
    """With fake scripts, N = 1 2 (quick): the seeds script once per N and way (--threads 1 and 2),
    the single-seed script N times P at a time (P = 1, and 2 for N = 2), the env-only limit of N
    x 3 fake envs; the best of either compared; the table, its JSON and plot."""
    dqn = seeds.ALGOS[0]
    for name in (dqn.script, dqn.single):
        (tmp_path / f"{name}.py").write_text(FAKE_SEEDS_SCRIPT)
    out = tmp_path / "out"
    argv = [
        *"--quick --algos dqn --scripts-dir".split(),
        str(tmp_path),
        "--out-dir",
        str(out),
        "--env-seconds",
        "0.01",
    ]
    assert seeds.main(argv) == 0
    (json_path,) = out.glob("seeds-*.json")
    result = json.loads(json_path.read_text())
    table = {row["members"]: row for row in result["table"]}
    assert table[1]["seeds_variants"] == {"seeds --threads 1": 1000, "seeds --threads 2": 2000}
    assert table[1]["processes_sps"] == {"1 at once": 600}
    assert table[2]["seeds_sps"] == 4000 and table[2]["best_seeds"] == "seeds --threads 2"
    assert table[2]["processes_sps"] == {"1 at once": 600, "2 at once": 1200}
    assert table[2]["best"] == "2 at once" and table[2]["vs_best"] == pytest.approx(4000 / 1200)
    assert [result["env_limits"][f"dqn {n}"]["num_envs"] for n in (1, 2)] == [3, 6]
    assert [(r["members"], r["variant"], len(r["summaries"])) for r in result["runs"]] == [
        (1, "seeds --threads 1", 1),
        (1, "seeds --threads 2", 1),
        (1, "1 at once", 1),
        (2, "seeds --threads 1", 1),
        (2, "seeds --threads 2", 1),
        (2, "1 at once", 2),
        (2, "2 at once", 2),
    ]
    assert (
        "| dqn | 2 | 4000 (seeds --threads 2) | 2 at once | 1200 | 3.33x |"
        in capsys.readouterr().out
    )
    assert (out / json_path.name.replace(".json", ".png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_seeds_waves_add_the_sps_of_processes_that_run_together_on_their_share_of_the_cores():
    summaries = [{"sps": sps} for sps in (100.0, 120.0, 90.0, 110.0, 200.0)]
    assert seeds.waves_sps(summaries, 2) == pytest.approx((2 * 220 + 2 * 200 + 1 * 200) / 5)
    assert seeds.waves_sps(summaries, 5) == pytest.approx(620.0)
    assert seeds.processes_at_once(8, None, cores=2) == [1, 2, 8]
    assert seeds.processes_at_once(1, None, cores=2) == [1]
    assert seeds.processes_at_once(4, [3, 6], cores=2) == [3]
    # one process: every core
    assert [seeds.process_cores(i, 1, 4) for i in range(1)] == [[0, 1, 2, 3]]
    assert [seeds.process_cores(i, 2, 4) for i in range(2)] == [[0, 1], [2, 3]]
    # more processes than cores
    assert [seeds.process_cores(i, 3, 2) for i in range(3)] == [[0], [1], [0]]


def test_seeds_gpu_proxy_times_dqn_seeds_per_member_and_sizes_its_graphs():
    """The real dqn_seeds functions for N = 1 2, eagerly (no compile, so no fused-kernel count):
    per-call and per-member times, the graphs' ATen ops (the three Linear layers' matmuls in
    acting), the GPU expectation, and the FLOPs of a member: acting 2 x (4x120 + 120x84 + 84x2) per
    observation, the update (batch 128) the target's and the online network's forward and the
    backward's two products a layer, but for the input's gradient."""
    table = seeds.proxy(
        seeds.ALGOS[:1], SCRIPTS, [1, 2], compiled=False, seconds=0.01, us_per_kernel=3.0
    )
    assert [(r["function"], r["members"]) for r in table] == [
        ("acting", 1),
        ("update", 1),
        ("acting", 2),
        ("update", 2),
    ]
    for r in table:
        assert r["us_per_call"] > 0 and r["us_per_member"] == pytest.approx(
            r["us_per_call"] / r["members"]
        )
        assert r["fused_kernels"] is None and r["kernels"] == r["aten_ops"]
        assert r["gpu_us_per_member_unmeasured"] == pytest.approx(3.0 * r["kernels"] / r["members"])
    assert [r["matmuls"] for r in table if r["function"] == "acting"] == [3, 3]
    assert all(r["aten_ops"] > 3 * table[0]["aten_ops"] for r in table if r["function"] == "update")
    forward = 2 * (4 * 120 + 120 * 84 + 84 * 2)
    update = 128 * (4 * forward - 2 * 4 * 120)
    assert [r["mflop_per_member"] * 1e6 for r in table] == pytest.approx([forward, update] * 2)
    assert all(0 < r["matmul_bound_share"] and r["matmul_gflops"] > 0 for r in table)


@pytest.mark.parametrize(
    "name, actor_matmuls, update_more_than",
    [("sac", 4, 24), ("td3", 3, 18), ("ppo_continuous_action", 6, 12)],
)
def test_seeds_gpu_proxy_sizes_the_actor_critic_graphs_the_same_for_every_n(
    name, actor_matmuls, update_more_than
):
    """The real SAC, TD3 and PPO seeds functions for N = 1 2, eagerly: acting is the actor's Linear
    layers (SAC's two heads: 4; TD3's: 3; PPO's actor and critic: 6), and one update (SAC, TD3:
    critic then actor; PPO: one minibatch) has as many matmuls for 2 members as for 1: more than six
    times acting's for SAC and TD3 (two critics and the actor, forward and backward), more than
    twice for PPO (forward and backward of the same networks)."""
    algo = next(algo for algo in seeds.ALGOS if algo.name == name)
    table = seeds.proxy([algo], SCRIPTS, [1, 2], compiled=False, seconds=0.01, us_per_kernel=3.0)
    acting = [r["matmuls"] for r in table if r["function"] == "acting"]
    update = [r["matmuls"] for r in table if r["function"] == "update"]
    assert acting == [actor_matmuls] * 2
    assert update[0] == update[1] > update_more_than


# --- benchmarks.studies.sweeps: a sweep in one process against its settings' single runs
# ---------------------------

# A fake seeds or single-seed script: its final return is 1000 x the learning rate (+ the seed in a
# single run, which the ranking averages away), its sps 1000 a member
FAKE_SWEEP_SCRIPT = """
import itertools, json, sys
from pathlib import Path

argv = sys.argv[1:]
start = argv.index("--learning-rate") + 1 if "--learning-rate" in argv else len(argv)
rates = [float(v) for v in itertools.takewhile(lambda v: v[0] != "-", argv[start:])] or [2.5e-4]
seeds = int(argv[argv.index("--num-seeds") + 1]) if "--num-seeds" in argv else None
seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 1
name = argv[argv.index("--exp-name") + 1]
summary = dict(sps=1000.0 * (seeds or 1) * len(rates), return_mean=1000 * rates[0] + seed)
summary["settings"] = [dict(learning_rate=r, return_mean=1000 * r) for r in rates]
summary["curves" if seeds else "curve"] = [[1, 0.5, 9.0]]  # episodes, left out of the result
path = Path(__file__).with_name(f"summary-{Path(__file__).stem}-{name}-{seed}.json")
path.write_text(json.dumps(summary | dict(argv=argv)))
print("SUMMARY " + json.dumps(dict(summary_file=str(path))))
"""


def test_sweeps_study_compares_a_sweep_with_its_runs_and_writes_its_results(tmp_path, capsys):
    """With fake scripts: a sweep of 3 learning rates x 2 seeds in one process, a seeds run of its
    6 members unswept, and the 6 single runs 2 at a time, each under the quick budget with its
    own experiment name; the settings ranked alike (Spearman 1, the same best), the table, its
    JSON and plot."""
    dqn = seeds.ALGOS[0]
    for name in (dqn.script, dqn.single):
        (tmp_path / f"{name}.py").write_text(FAKE_SWEEP_SCRIPT)
    out = tmp_path / "out"
    argv = ["--quick", "--values", "3e-4", "1e-3", "1e-4", "--scripts-dir", str(tmp_path)]
    assert sweeps.main([*argv, "--out-dir", str(out), "--no-compile"]) == 0
    (json_path,) = out.glob("sweeps-*.json")
    table = json.loads(json_path.read_text())["table"]
    assert table["sweep_means"] == pytest.approx([0.3, 1.0, 0.1])
    assert table["run_means"] == pytest.approx([1.8, 2.5, 1.6])  # + seeds 1 and 2, averaged
    assert table["spearman"] == pytest.approx(1.0) and table["same_best"] is True
    assert table["sweep_vs_seeds"] == 1.0
    sweep, runs = table["summaries"]["sweep"], table["summaries"]["runs"]
    assert not {"curve", "curves"} & {key for s in (sweep, *runs) for key in s}
    budget = [*dqn.quick, "--no-compile"]
    rates = ["--learning-rate", "0.0003", "0.001", "0.0001"]
    assert sweep["argv"] == [*budget, "--exp-name", "sweep", "--num-seeds", "2", *rates]
    assert [run["argv"][len(budget) :] for run in runs[:2]] == [
        ["--seed", str(seed), "--learning-rate", "0.0003", "--exp-name", "0.0003"]
        for seed in (1, 2)
    ]
    assert len(runs) == 6 and "| 0.001 | 1.0 | 2.5 |" in capsys.readouterr().out
    assert (out / json_path.name.replace(".json", ".png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweeps_rank_correlation_is_spearmans():
    assert sweeps.ranks([3.0, 1.0, 2.0, 1.0]) == [4.0, 1.5, 3.0, 1.5]
    assert sweeps.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert sweeps.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert sweeps.spearman([1, 1, 1], [1, 2, 3]) is None


def profiler_event(key, total, self_time):
    """A key average of torch's profiler: its name, its total and its own µs."""
    return types.SimpleNamespace(key=key, cpu_time_total=total, self_cpu_time_total=self_time)


def test_a_step_breakdown_puts_each_profiler_event_in_its_part():
    events = [
        profiler_event("env step", 300.0, 300.0),
        profiler_event("update", 5000.0, 50.0),
        profiler_event("Torch-Compiled Region: 1/0", 4800.0, 20.0),
        profiler_event("TorchDynamo Cache Lookup", 150.0, 150.0),
        profiler_event("aten::addmm", 1000.0, 900.0),
        profiler_event("aoti_torch_cpu_bmm_out", 2000.0, 2000.0),
        profiler_event("cpp_fused_add_div_mul_sqrt_0", 400.0, 400.0),
        profiler_event("cpp_fused_relu_1", 100.0, 100.0),
        profiler_event("aten::empty", 10.0, 10.0),
    ]
    parts, graphs, leaves = step_time.breakdown(events, steps=2)
    assert parts == dict.fromkeys(step_time.PARTS, 0.0) | {"env step": 150.0, "update": 2500.0}
    assert graphs == {"Torch-Compiled Region: 1/0": 2400.0}
    assert leaves == {
        "dynamo's guards": 75.0,
        "matmuls": 1450.0,
        "optimizer kernels": 200.0,
        "other kernels": 50.0,
    }
    result = dict(
        step_us=2000.0, profiled_step_us=3000.0, parts=parts, graphs=graphs, leaves=leaves
    )
    result |= dict(machine=machine.machine_info(), started="2026-11-29T10:00:00", command="x.py")
    table = step_time.markdown(result)
    assert "2000 µs per env step unprofiled, 3000 profiled" in table
    assert "| update: matmuls | 1450 | 48% |" in table
