"""The benchmark harness, driven by tiny fake scripts in tmp_path: no real training, a few seconds in all."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, script_env

from benchmarks import report, run
from benchmarks.registry import ALGOS, VARIANTS, Algo

SAC = next(algo for algo in ALGOS if algo.name == "sac")
FAKE = Algo("fake", "fake", quick=("--budget", "quick"), full=("--budget", "full"))

# A fake training script: logs its call to calls.txt beside it, then prints a SUMMARY with the (sps, return_mean)
# that SCHEDULE lists for its variant flags, taking the next entry each time it is called with the same flags.
FAKE_SCRIPT = """
import json, sys
from pathlib import Path

SCHEDULE = {schedule!r}
flags = " ".join(a for a in sys.argv[1:] if a in ("--compile", "--cudagraphs"))
call = " ".join([Path(__file__).stem, *sys.argv[1:]])
log = Path(__file__).with_name("calls.txt")
calls = log.read_text().splitlines() if log.exists() else []
log.write_text("".join(line + "\\n" for line in [*calls, call]))
sps, return_mean = SCHEDULE[flags][calls.count(call)]
print("step 1 of 1")
summary = dict(script=Path(__file__).stem, env_id="Fake-v0", seed=1, device="cpu", compile="--compile" in sys.argv,
               cudagraphs="--cudagraphs" in sys.argv, num_envs=1, total_timesteps=100, sps=sps, sps_wall=sps / 2,
               episodes=3, return_mean=return_mean, wall_s=0.1, torch_version="fake")
print("SUMMARY " + json.dumps(summary))
"""
FAILING_SCRIPT = "import sys\nprint('boom: bad flag', file=sys.stderr)\nsys.exit(1)\n"
SILENT_SCRIPT = "print('trained, but forgot the summary')\n"

EAGER = {"": [(100, -10.0), (120, -20.0), (90, None)]}
TWIN = {"": [(150, 1.0), (200, 2.0), (250, 3.0)], "--compile": [(300, None), (500, None), (400, None)]}


def write_scripts(directory, algo, eager_source, twin_source):
    """Write `algo`'s two scripts into `directory`; returns the directory."""
    (directory / f"{algo.eager}.py").write_text(eager_source)
    (directory / f"{algo.twin}.py").write_text(twin_source)
    return directory


def calls(directory):
    """The calls (script stem and flags) that the fake scripts in `directory` logged, in order."""
    return (directory / "calls.txt").read_text().splitlines()


@pytest.mark.parametrize("cuda", [False, True])
def test_plan_alternates_variants_and_runs_cuda_variants_only_with_cuda(cuda):
    other = Algo("other", "other", quick=(), full=())
    order = [(algo.name, variant.name, repeat) for algo, variant, repeat in run.plan([FAKE, other], 2, cuda)]
    variants = [v.name for v in VARIANTS if cuda or not v.needs_cuda]
    expected = [(name, v, r) for name in ("fake", "other") for r in range(2) for v in variants]
    assert order == expected
    assert ("cudagraphs" in variants) == cuda and ("compile+cudagraphs" in variants) == cuda


def test_command_adds_budget_then_variant_flags(tmp_path):
    algo = Algo("fake", "fake", quick=("--q",), full=("--f",), variant_flags={"compile": ("--threads", "1")})
    compile_variant = next(v for v in VARIANTS if v.name == "compile")
    cmd = run.command(algo, compile_variant, tmp_path, quick=True)
    assert cmd == [sys.executable, str(tmp_path / "fake_torchcompile.py"), "--q", "--compile", "--threads", "1"]
    eager_variant = next(v for v in VARIANTS if v.name == "eager")
    assert run.command(algo, eager_variant, tmp_path, quick=False)[1:] == [str(tmp_path / "fake.py"), "--f"]


def test_rows_medians_spread_ratios_and_returns():
    def record(variant, sps, return_mean):
        return {"algo": "fake", "variant": variant, "summary": {"sps": sps, "return_mean": return_mean}}

    runs = [record("eager", 100, 1.0), record("compile", 300, None), record("eager", 200, 3.0),
            record("compile", 600, None)]
    assert report.rows(runs) == [
        {"algo": "fake", "variant": "eager", "runs": 2, "sps_median": 150, "sps_min": 100, "sps_max": 200,
         "return_mean": 2.0, "vs_eager": 1.0},
        {"algo": "fake", "variant": "compile", "runs": 2, "sps_median": 450, "sps_min": 300, "sps_max": 600,
         "return_mean": None, "vs_eager": 3.0},
    ]


def test_main_runs_alternately_prints_the_table_and_writes_the_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    scripts = write_scripts(tmp_path, SAC, FAKE_SCRIPT.format(schedule=EAGER), FAKE_SCRIPT.format(schedule=TWIN))
    out = tmp_path / "results"
    status = run.main(["--algos", "sac", "--repeats", "3", "--quick", "--scripts-dir", str(scripts),
                       "--out-dir", str(out)])
    assert status == 0

    budget = " ".join(SAC.quick)
    one_round = [f"{SAC.eager} {budget}", f"{SAC.twin} {budget}", f"{SAC.twin} {budget} --compile"]
    assert calls(scripts) == one_round * 3

    table = capsys.readouterr().out
    assert "| sac | eager | 100 | 90-120 | 1.00x | -15.0 | 3 |" in table
    assert "| sac | torchcompile | 200 | 150-250 | 2.00x | 2.0 | 3 |" in table
    assert "| sac | compile | 400 | 300-500 | 4.00x | n/a | 3 |" in table
    assert "cudagraphs" not in table.split("| algo |")[1]

    (json_path,) = out.glob("*.json")
    assert json_path.with_suffix(".md").read_text() == table
    document = json.loads(json_path.read_text())
    assert [r["variant"] for r in document["runs"]] == ["eager", "torchcompile", "compile"] * 3
    assert [r["summary"]["sps"] for r in document["runs"]] == [100, 150, 300, 120, 200, 500, 90, 250, 400]
    assert document["runs"][2]["flags"] == [*SAC.quick, "--compile"]
    assert document["runs"][0]["summary"]["script"] == SAC.eager
    assert document["settings"]["budget"] == "quick" and document["settings"]["repeats"] == 3
    machine = document["machine"]
    assert machine["cores"] >= 1 and machine["gpu"] is None
    assert machine["versions"]["torch"] and machine["versions"]["gymnasium"] and machine["versions"]["tensordict"]
    assert [(r["variant"], r["sps_median"], r["vs_eager"]) for r in document["table"]] == [
        ("eager", 100, 1.0), ("torchcompile", 200, 2.0), ("compile", 400, 4.0)
    ]


@pytest.mark.parametrize(
    ("twin_source", "reason", "stderr_tail"),
    [
        (FAILING_SCRIPT, "exited with status 1", "boom: bad flag"),
        (SILENT_SCRIPT, "exited with status 0 but printed 0 SUMMARY lines, expected 1", None),
    ],
)
def test_a_failed_run_stops_with_one_line_naming_script_flags_and_status(tmp_path, twin_source, reason, stderr_tail):
    scripts = write_scripts(tmp_path, FAKE, FAKE_SCRIPT.format(schedule=EAGER), twin_source)
    with pytest.raises(run.BenchmarkError) as error:
        run.benchmark([FAKE], scripts, repeats=2, quick=True, cuda=False)
    lines = str(error.value).splitlines()
    assert lines[0] == f"fake_torchcompile.py --budget quick {reason}"
    assert lines[1:] == ([stderr_tail] if stderr_tail else [])
    assert calls(scripts) == ["fake --budget quick"]


def test_command_line_failure_exits_1_and_writes_nothing(tmp_path):
    scripts = write_scripts(tmp_path, SAC, FAKE_SCRIPT.format(schedule=EAGER), FAILING_SCRIPT)
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "benchmarks.run", "--algos", "sac", "--repeats", "1", "--quick",
           "--scripts-dir", str(scripts), "--out-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=script_env(), timeout=120)
    assert proc.returncode == 1
    stopped = [line for line in proc.stderr.splitlines() if line.startswith("benchmark stopped: ")]
    assert stopped == [f"benchmark stopped: {SAC.twin}.py {' '.join(SAC.quick)} exited with status 1"]
    assert "boom: bad flag" in proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_algorithms_with_missing_scripts_are_skipped_with_a_note(tmp_path, capsys):
    (tmp_path / f"{SAC.eager}.py").write_text(FAKE_SCRIPT.format(schedule=EAGER))
    assert run.main(["--algos", "sac", "--quick", "--scripts-dir", str(tmp_path), "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"skipping sac: missing {tmp_path / SAC.twin}.py" in err
    assert "no algorithm has both scripts on disk" in err
    assert not (tmp_path / "calls.txt").exists()
