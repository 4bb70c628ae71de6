"""Helpers shared by every test module: run a script as a user would, read its SUMMARY line, import it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.scripts import SCRIPTS, load_script  # noqa: F401 (test modules import it from here)

ROOT = Path(__file__).resolve().parents[1]

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graph capture); none on this machine"
)


def script_env():
    """The environment a script runs in under test: no network, no window, no wandb account."""
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", MUJOCO_GL="egl", PYTHONUNBUFFERED="1")
    return env


def run_script(name, *flags, timeout=900, cwd=None, env=None):
    """Run `leanrl/<name>.py` with `flags` in a fresh interpreter, `env` added to its environment; returns the
    CompletedProcess."""
    cmd = [sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, flags)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=script_env() | (env or {}), cwd=cwd or ROOT
    )


def summary(proc):
    """The parsed SUMMARY line of a finished run; fails the test with the run's stderr if there is not exactly one."""
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert len(lines) == 1, f"expected one SUMMARY line, got {len(lines)}\n{proc.stdout[-2000:]}"
    result = json.loads(lines[0][len("SUMMARY ") :])
    assert_curve(result)
    return result


def assert_curve(result):
    """The SUMMARY's `curve` has one [global_step, seconds, return] per counted episode, in the order of both
    steps and seconds, within the run's steps and wall time."""
    curve = result["curve"]
    assert len(curve) == result["episodes"], f"{len(curve)} curve points for {result['episodes']} episodes"
    assert all(len(point) == 3 for point in curve)
    steps, seconds = [point[0] for point in curve], [point[1] for point in curve]
    assert steps == sorted(steps) and seconds == sorted(seconds), "curve steps or seconds go backwards"
    assert all(0 <= step <= result["total_timesteps"] for step in steps)
    assert all(0 <= second <= result["wall_s"] for second in seconds)


def assert_user_error(proc, *words):
    """A user error: exit status 2, one line on stderr naming `words`, no traceback, no SUMMARY."""
    assert proc.returncode == 2, f"exit status {proc.returncode}\n{proc.stderr[-2000:]}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert "SUMMARY" not in proc.stdout
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from a clean dynamo state, so recompilation checks see only their own functions."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
