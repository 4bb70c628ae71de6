"""`python -m benchmarks.studies.memory` (when a scan beats a loop) on a tiny budget: it checks
every minGRU variant against the loop before timing it, reports every variant and scan candidate,
and stops on a twin whose scan differs from the loop. Its `--tasks` mode is test_popgym.py's (it
needs POPGym)."""

import json
import shutil

import pytest
from conftest import ROOT

from benchmarks.studies import memory

TWIN = "ppo_mingru_torchcompile"


def test_memory_benchmark_checks_and_reports_every_variant(tmp_path):
    """`benchmarks.studies.memory --quick` (compiled with aot_eager: no inductor build here) times
    every variant and candidate in every cell, each checked against the loop first, and writes the
    json, markdown and png."""
    argv = [*"--quick --candidates --backend aot_eager --device cpu --out".split(), str(tmp_path)]
    assert memory.main(argv) == 0
    result = json.loads(next(tmp_path.glob("memory-*.json")).read_text())
    cells = {(2, 8), (2, 16)}
    models = {"lstm-loop", "mingru-loop", "mingru-scan", "mingru-scan-compiled"}
    assert {(r["batch"], r["steps"], r["variant"]) for r in result["models"]} == {
        (*c, v) for c in cells for v in models
    }
    assert all(
        r["check"]["ok"] and r["check"]["diff"] < 1e-5
        for r in result["models"]
        if r["variant"] != "lstm-loop"
    )
    # another model
    assert all(r["check"] is None for r in result["models"] if r["variant"] == "lstm-loop")
    assert {r["variant"] for r in result["candidates"]} >= {
        "loop",
        "hillis-steele",
        "prototype-associative-scan",
        "chunked",
        "chunked-compiled",
        "log-space",
    }
    assert all(r["check"]["ok"] for r in result["candidates"])
    assert all(
        0 < r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
        for r in result["models"] + result["candidates"]
    )
    assert "| 16 | 2 |" in next(tmp_path.glob("memory-*.md")).read_text()
    assert next(tmp_path.glob("memory-*.png")).stat().st_size > 0


def test_memory_benchmark_stops_on_a_scan_that_differs_from_the_loop(tmp_path, capsys):
    """A twin whose scan forgets h0 (a plausible bug: the first chunk's entering state left at zero)
    fails the check before any timing: exit status 1 and a line naming the variant."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("ppo_lstm", "ppo_mingru"):
        shutil.copy(ROOT / "leanrl" / f"{name}.py", scripts)
    source = (ROOT / "leanrl" / f"{TWIN}.py").read_text()
    assert source.count("entering, entering_states = h0, []") == 1
    (scripts / f"{TWIN}.py").write_text(
        source.replace(
            "entering, entering_states = h0, []",
            "entering, entering_states = torch.zeros_like(h0), []",
        )
    )
    with pytest.raises(SystemExit) as stopped:
        memory.main(
            [
                *"--quick --backend aot_eager --device cpu --scripts-dir".split(),
                str(scripts),
                "--out",
                str(tmp_path),
            ]
        )
    assert stopped.value.code == 1
    assert "check failed: T 8 batch 2 mingru-scan:" in capsys.readouterr().err
    assert not list(tmp_path.glob("memory-*.json"))
