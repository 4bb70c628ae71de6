"""`python -m benchmarks.gpu_check` on a CPU: what it plans, the report it writes from synthetic
results, its deadline, and its refusal without a CUDA device. Its GPU parts run on a GPU only; the
noise statistics it relies on are tested on compiled CPU functions in test_fresh_noise.py."""

import json
import subprocess
import sys
import time

from conftest import ROOT, assert_user_error, script_env
from test_fresh_noise import SAMPLING

from benchmarks import gpu_check, registry
from benchmarks.studies import seeds


def test_without_cuda_it_exits_2_in_one_line():
    cmd = [sys.executable, "-m", "benchmarks.gpu_check"]
    options = dict(capture_output=True, text=True, cwd=ROOT, env=script_env(), timeout=120)
    proc = subprocess.run(cmd, **options)
    assert "CUDA" in assert_user_error(proc)


def test_the_plan_covers_every_graphed_script_and_every_part():
    """Every script whose sampling functions test_fresh_noise.py checks has a fresh-noise test run
    and a smoke run; every algorithm three timed runs, every seeds script three; one learning run
    each. The timed seeds runs are the smoke runs' commands, so they find their kernels compiled."""
    checks = gpu_check.plan(gpu_check.PARTS)
    names = {part: [c.name for c in checks if c.part == part] for part in gpu_check.PARTS}
    assert set(gpu_check.graphed_runs()) == set(SAMPLING)
    assert {f"fresh noise: {stem}" for stem in SAMPLING} <= set(names["tests"])
    smoked = {name.split(" N=")[0] for name in names["smoke"]}
    assert smoked == set(SAMPLING)
    assert len(names["sps"]) == 3 * len(registry.ALGOS)
    assert len(names["seeds"]) == len(gpu_check.SEEDS_MEMBERS) * len(seeds.ALGOS)
    assert len(names["learning"]) == len(gpu_check.LEARNING)
    for check in checks:
        if check.part in ("smoke", "learning", "seeds"):
            assert "--cudagraphs" in check.cmd and "--compile" in check.cmd, check.cmd
    timed = [c.cmd for c in checks if c.part == "seeds"]
    assert timed == [c.cmd for c in checks if c.part == "smoke" and " N=" in c.name]


def synthetic_checks():
    """A passed, a failed and a not-run check of each kind, with the values a GPU would fill in."""
    checks = {(c.part, c.name): c for c in gpu_check.plan(gpu_check.PARTS)}
    values = {
        ("sps", "sac eager"): 1000.0,
        ("sps", "sac compile"): 2000.0,
        ("sps", "sac compile+cudagraphs"): 5000.0,
        ("seeds", "dqn N=1"): 300.0,
        ("seeds", "dqn N=64"): 9000.0,
        ("learning", "sac > -400"): -150.0,
    }
    for key, value in values.items():
        checks[key].status, checks[key].value, checks[key].seconds = "passed", value, 12.3
    failed = checks[("tests", "fresh noise: sac_continuous_action_torchcompile")]
    failed.status, failed.detail = "failed", "1 failed | 3 passed"
    return list(checks.values())


def test_the_report_from_synthetic_results(tmp_path):
    checks = synthetic_checks()
    machine = {"cpu": "a CPU", "cores": 16, "gpu": "NVIDIA H100", "versions": {"torch": "2.13.0"}}
    result = gpu_check.report(checks, machine, "2026-01-01T00:00:00", 123.0)
    folder = gpu_check.write(result, tmp_path / "gpu_check-x")
    document = json.loads((folder / "gpu_check.json").read_text())
    assert document["passed"] == 6 and len(document["checks"]) == len(checks)
    (sac,) = document["speed"]
    assert (sac["compile_vs_eager"], sac["graphs_vs_eager"], sac["leanrl_h100"]) == (2.0, 5.0, 5.7)
    assert document["seeds"] == [{"algo": "dqn", "sps": {"1": 300.0, "64": 9000.0}}]
    md = (folder / "gpu_check.md").read_text()
    assert "GPU: NVIDIA H100" in md and "6 of" in md
    assert "| sac | 1000 | 2000 | 5000 | 2.00x | 5.00x | 5.7x |" in md
    assert "| dqn | 300 | n/a | 9000 |" in md
    failed = "| tests | fresh noise: sac_continuous_action_torchcompile | failed | 0 | 1 failed / 3"
    assert failed in md
    assert "| learning | td3 > -700 | not run |" in md
    assert all(len(line) <= 200 for line in md.splitlines())


def test_a_check_past_the_deadline_is_not_run_and_a_finished_one_is_judged(tmp_path):
    late = gpu_check.Check("sps", "sac eager", [sys.executable, "-c", "pass"], 60)
    assert gpu_check.execute(late, time.monotonic(), tmp_path).status == "not run"
    failing = gpu_check.Check("tests", "x", [sys.executable, "-c", "raise SystemExit(1)"], 60)
    assert gpu_check.execute(failing, time.monotonic() + 60, tmp_path).status == "failed"
