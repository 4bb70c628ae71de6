"""Helpers shared by every test module: run a script as a user would, read its SUMMARY line, import it."""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.scripts import SCRIPTS, load_script  # noqa: F401 (test modules import it from here)

ROOT = Path(__file__).resolve().parents[1]
# where script runs make their runs/ folders: one temporary folder per test session, not the repository
RUNS_CWD = tempfile.mkdtemp(prefix="leanrl-tests-")

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
    CompletedProcess. It runs in `cwd`, by default a temporary folder of the test session, where it makes its
    `runs/<run_name>/` folder."""
    cmd = [sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, flags)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=script_env() | (env or {}), cwd=cwd or RUNS_CWD
    )


def summary(proc, returncode=0):
    """The whole summary of a finished run: its one SUMMARY line, which names the run's summary.json, checked against
    that file (the same keys and values, plus the learning curve), which it returns with `summary_file`; fails the
    test with the run's stderr otherwise. `returncode`: the exit status expected (130 after a Ctrl-C)."""
    assert proc.returncode == returncode, f"exit status {proc.returncode}\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert len(lines) == 1, f"expected one SUMMARY line, got {len(lines)}\n{proc.stdout[-2000:]}"
    line = json.loads(lines[0][len("SUMMARY ") :])
    assert "curve" not in line, "the printed SUMMARY keeps the curve out (it is in summary.json)"
    path = Path(line.pop("summary_file"))
    assert path.name == "summary.json" and path.parent.parent.name == "runs"
    result = json.loads(path.read_text())
    assert {key: value for key, value in result.items() if key != "curve"} == line
    assert_curve(result)
    return result | {"summary_file": str(path)}


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


class HostSync(AssertionError):
    """A function meant for a CUDA graph waited for the device: inside a capture that is an error."""


# Python-level reads of a tensor's value or memory by the host; on a CPU `.cpu()` and `.numpy()` sync nothing, but
# on CUDA they wait for the device, so they are refused here too
SYNC_METHODS = ("__bool__", "__int__", "__float__", "__index__", "__array__", "item", "tolist", "cpu", "numpy")
# ops whose output (a Python scalar, or a shape) depends on the data: the host must wait for the device
SYNC_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.repeat_interleave.Tensor,
}


class RefuseSyncOps(TorchDispatchMode):
    """Raises HostSync on any op whose result the host must wait for, also those called from C++ (boolean-mask
    indexing, `torch.distributions`' argument checks). Eager code only: dynamo does not compile under a dispatch
    mode."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNC_OPS:
            raise HostSync(f"host sync: {func}")
        if func is torch.ops.aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
            raise HostSync("host sync: indexing with a boolean mask")
        return func(*args, **(kwargs or {}))


def _refuse(name):
    @torch.compiler.disable  # dynamo must not trace into it: a compiled graph breaks here and the call raises
    def method(self, *args, **kwargs):
        raise HostSync(f"host sync: Tensor.{name}")

    return method


@contextlib.contextmanager
def no_host_sync(compiled=False):
    """Any host-device synchronization inside raises HostSync. Compiled code can only sync where its graph breaks,
    and the code run there reads the tensor from Python (`bool(t)`, `t.item()`), which the patched methods refuse;
    eager code is also run under RefuseSyncOps, with torch.distributions' argument checks on as in a fresh process
    (the first `torch.compile` turns them off for the whole process)."""
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}
    validate = torch.distributions.Distribution._validate_args
    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, _refuse(name))
        if compiled:
            yield
        else:
            torch.distributions.Distribution.set_default_validate_args(True)
            with RefuseSyncOps():
                yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        torch.distributions.Distribution.set_default_validate_args(validate)


def assert_no_host_sync(fn, inputs, compiled, calls=3):
    """`fn(*inputs())` runs `calls` times without a host sync; returns the last output. A compiled `fn` first runs
    `calls` unguarded warm-up calls (compiling, also for the optimizers' created state), then the guarded ones
    with recompilation refused."""
    with contextlib.ExitStack() as stack:
        if compiled:
            for _ in range(calls):
                fn(*inputs())
            stack.enter_context(torch.compiler.set_stance("fail_on_recompile"))
        stack.enter_context(no_host_sync(compiled))
        for _ in range(calls):
            out = fn(*inputs())
    return out
