"""Helpers shared by every test module: run a script as a user would, read its SUMMARY line, import
it."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.scripts import ALL_SCRIPTS, SCRIPTS, export_scripts, load_script  # noqa: F401 (test modules import them from here)

ROOT = Path(__file__).resolve().parents[1]
# where script runs make their runs/ folders: one temporary folder per test session (per worker),
# not the repository
RUNS_CWD = tempfile.mkdtemp(prefix="leanrl-tests-")
# one of pytest-xdist's workers (pyproject.toml), beside another: one thread each, in this process
# and in the scripts it launches, or two thread pools on two cores wait on each other at every op
XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
if XDIST_WORKER:
    torch.set_num_threads(1)

_skip_without_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (CUDA graph capture); none on this machine",
)
# whether the running test may show a GPU to the scripts it launches (set per test by
# `_scripts_see_gpus`); off by default, also in a second import of this module (`tests.conftest`)
_GPUS_SHOWN = {"now": False}


def requires_cuda(test):
    """Marks a CUDA test: skipped without CUDA (the reason printed), marked `cuda` (`-m cuda`
    selects them), and the scripts it launches see the machine's GPUs."""
    return pytest.mark.cuda(_skip_without_cuda(test))


def long_learning(test):
    """Marks a learning check of a minute or more that the suite leaves out (the suite stays under
    its time; each family keeps a shorter one): `LEANRL_LONG_TESTS=1 python -m pytest -m learning
    tests` runs them all."""
    skip = pytest.mark.skipif(
        not os.environ.get("LEANRL_LONG_TESTS"),
        reason="a long learning check: LEANRL_LONG_TESTS=1 runs it",
    )
    return pytest.mark.learning(skip(test))


def slow_unless(quick, values, ids=None):
    """`values` as parametrize's, each marked `slow` unless `quick(value)`: the quick tier keeps
    those, the full suite runs all."""
    ids = ids or [None] * len(values)
    return [
        pytest.param(
            *(v if isinstance(v, tuple) else (v,)), marks=() if quick(v) else pytest.mark.slow, id=i
        )
        for v, i in zip(values, ids)
    ]


def compiles_a_whole_run(item):
    """Whether `item` is a smoke run that compiles (20-77 s here, most of it compiling): a twin
    with `--compile`, or a `_cpu` script, which compiles unless told `--no-compile`. The
    equivalence and no-recompile tests check the same compiled functions."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    flags, script = params.get("flags", ()), str(params.get("script", ""))
    return item.name.startswith("test_smoke") and (
        "compile" in item.originalname
        or "--compile" in flags
        or (script.endswith("_cpu") and "--no-compile" not in flags)
    )


def pytest_collection_modifyitems(items):
    """`slow` (pyproject.toml), which the quick tier `python -m pytest tests -m "not slow"` leaves
    out, also marks every learning check, every smoke run with `--compile` and every test that
    starts torchrun or uses the test Ray cluster (the `launches` and `ray_head` fixtures: 6-37 s a
    test here). The full suite runs everything."""
    for item in items:
        if (
            item.get_closest_marker("learning") is not None
            or compiles_a_whole_run(item)
            or {"launches", "ray_head"} & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _scripts_see_gpus(request):
    """A launched script sees the GPUs only in a test marked `cuda`: every other test checks CPU
    behaviour, and on a GPU machine gets it, as here."""
    _GPUS_SHOWN["now"] = request.node.get_closest_marker("cuda") is not None
    yield
    _GPUS_SHOWN["now"] = False


def script_env():
    """The environment a script runs in under test: no network, no window, no wandb account, and no
    GPU unless the test is a CUDA test (`requires_cuda` or the `cuda` marker):
    `CUDA_VISIBLE_DEVICES=""` hides them, so that `--cuda` (on by default) gives the CPU on a
    GPU machine too, and torchrun's ranks all take the CPU and gloo."""
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", MUJOCO_GL="egl", PYTHONUNBUFFERED="1")
    if XDIST_WORKER:  # a test that needs more threads gives its own OMP_NUM_THREADS
        env.setdefault("OMP_NUM_THREADS", "1")
    if not _GPUS_SHOWN["now"]:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_script(name, *flags, timeout=900, cwd=None, env=None):
    """Run `leanrl/<name>.py` with `flags` in a fresh interpreter, `env` added to its environment;
    returns the CompletedProcess. It runs in `cwd`, by default a temporary folder of the test
    session, where it makes its `runs/<run_name>/` folder."""
    cmd = [sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, flags)]
    env = script_env() | (env or {})
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd or RUNS_CWD
    )


def summary(proc, returncode=0):
    """The whole summary of a finished run: its one SUMMARY line, which names the run's
    summary.json, checked against that file (the same keys and values, plus the learning curve),
    which it returns with `summary_file`; fails the test with the run's stderr otherwise.
    `returncode`: the exit status expected (130 after a Ctrl-C)."""
    assert proc.returncode == returncode, f"exit status {proc.returncode}\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert len(lines) == 1, f"expected one SUMMARY line, got {len(lines)}\n{proc.stdout[-2000:]}"
    line = json.loads(lines[0][len("SUMMARY ") :])
    assert not {"curve", "curves"} & set(line), "the printed SUMMARY keeps the curves out"
    path = Path(line.pop("summary_file"))
    assert path.name == "summary.json" and path.parent.parent.name == "runs"
    result = json.loads(path.read_text())
    assert {key: value for key, value in result.items() if key not in ("curve", "curves")} == line
    assert_curve(result)
    return result | {"summary_file": str(path)}


def assert_curve(result):
    """The SUMMARY's `curve` has one [global_step, seconds, return] per counted episode, in the
    order of both steps and seconds, within the run's steps and wall time. A seeds script's
    `curves` hold one such curve per member (its `seeds`: `num_seeds` of each setting of a sweep),
    together one point per counted episode."""
    curves = result["curves"] if "num_seeds" in result else [result["curve"]]
    assert len(curves) == len(result.get("seeds", [result["seed"]]))
    points = sum(map(len, curves))
    assert points == result["episodes"], f"{points} curve points for {result['episodes']} episodes"
    for curve in curves:
        assert all(len(point) == 3 for point in curve)
        steps, seconds = [point[0] for point in curve], [point[1] for point in curve]
        assert steps == sorted(steps) and seconds == sorted(seconds), "the curve goes backwards"
        assert all(0 <= step <= result["total_timesteps"] for step in steps)
        assert all(0 <= second <= result["wall_s"] for second in seconds)


def actor_critic_seeds_smoke_run(script, cwd):
    """Two members of SAC's or TD3's seeds script on Pendulum, eagerly, 20 iterations past the
    random phase (2 episodes each), saving their models and evaluating each for one episode."""
    flags = ("--env-id", "Pendulum-v1", "--total-timesteps", 420, "--learning-starts", 400)
    flags += ("--batch-size", 32, "--num-seeds", 2, "--no-compile", "--save-model")
    flags += ("--eval-episodes", 1)
    return summary(run_script(script, *flags, cwd=cwd))


def assert_seeds_smoke_summary(s, script, actor):
    """The summary of `actor_critic_seeds_smoke_run` reports each member (seeds, last-20 means and
    their mean, a curve each, aggregate sps, evaluation returns) and a model file per member, in the
    single-seed format with the member's seed: the state dict of `actor` (Pendulum's)."""
    assert (s["script"], s["num_seeds"], s["seeds"], s["total_timesteps"]) == (
        script,
        2,
        [1, 2],
        420,
    )
    assert (s["compile"], s["cudagraphs"], s["device"]) == (False, False, "cpu")
    assert_measured_threads(s)
    assert s["sps_wall"] == pytest.approx(2 * 420 / s["wall_s"], rel=0.01) and s["sps"] > 0
    assert s["episodes"] == 4 and [len(curve) for curve in s["curves"]] == [2, 2]
    assert all(-2000 < mean < 0 for mean in s["return_means"])
    assert s["return_mean"] == pytest.approx(np.mean(s["return_means"]))
    assert [len(returns) for returns in s["eval_returns"]] == [1, 1]
    assert s["eval_return_mean"] == pytest.approx(np.mean(s["eval_return_means"]))
    files = [path.rsplit("/", 1)[1] for path in s["model_files"]]
    assert files == [f"{script}_seed{k}.pt" for k in (1, 2)]
    saved = torch.load(s["model_files"][1], weights_only=True)
    assert (saved["script"], saved["args"]["seed"], saved["args"]["num_seeds"]) == (script, 2, 2)
    expected = {name: value.shape for name, value in actor.state_dict().items()}
    assert {name: value.shape for name, value in saved["model"].items()} == expected


def assert_every_member_replays(script, smoke_run, *flags):
    """`--eval-model` of the smoke run's member 2's file, with `flags`, plays the saved model as
    each of three members, each on an env seeded with the member's seed: nothing trains, and
    member 2 of the new run replays the saved member 2's evaluation."""
    flags += ("--num-seeds", 3, "--eval-model", smoke_run["model_files"][1])
    s = summary(run_script(script, *flags))
    assert s["episodes"] == 0 and len(s["eval_returns"]) == 3
    assert s["eval_returns"][1] == smoke_run["eval_returns"][1]


def assert_measured_threads(s):
    """The SUMMARY of a run that left its threads to measurement (no `--threads`): it ended on one
    thread or on every core it may use (a trial's turn, or a trial's choice), and each trial chose
    one of the two from the times it measured."""
    counts = {1, len(os.sched_getaffinity(0))}
    assert s["threads"] in counts, s["threads"]
    for trial in s["thread_trials"]:
        assert {int(n) for n in trial["ms"]} == counts
        assert trial["threads"] == int(min(trial["ms"], key=trial["ms"].get))


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
    """Each test compiles from a clean dynamo state, so recompilation checks see only their own
    functions."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class HostSync(AssertionError):
    """A function meant for a CUDA graph waited for the device: inside a capture that is an
    error."""


# Python-level reads of a tensor's value or memory by the host; on a CPU `.cpu()` and `.numpy()`
# sync nothing, but on CUDA they wait for the device, so they are refused here too
SYNC_METHODS = ("__bool__", "__int__", "__float__", "__index__", "__array__", "item", "tolist")
SYNC_METHODS += ("cpu", "numpy")
# ops whose output (a Python scalar, or a shape) depends on the data: the host must wait for the
# device
SYNC_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.repeat_interleave.Tensor,
}
# indexing ops that, given a boolean mask, first find its true elements (a nonzero inside the
# kernel)
MASKABLE_OPS = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put.default,
    torch.ops.aten.index_put_.default,
    torch.ops.aten._index_put_impl_.default,
}
# why dynamo breaks a graph at an op whose result the host must wait for (the first line of its
# graph-break record, with torch's defaults `capture_scalar_outputs=False` and
# `capture_dynamic_output_shape_ops=False`)
SYNC_GRAPH_BREAKS = ("Data dependent operator", "Dynamic shape operator")
SYNC_GRAPH_BREAKS += ("Tensor.item()", "Tensor.tolist()")


def _is_mask(index):
    return isinstance(index, torch.Tensor) and index.dtype == torch.bool


class RefuseSyncOps(TorchDispatchMode):
    """Raises HostSync on any op whose result the host must wait for, also those called from C++
    (boolean-mask indexing and writes, `torch.equal`, `torch.distributions`' argument checks). Eager
    code only: dynamo runs its compiled code eagerly under a dispatch mode."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNC_OPS:
            raise HostSync(f"host sync: {func}")
        if func in MASKABLE_OPS and any(_is_mask(index) for index in args[1]):
            raise HostSync(f"host sync: {func} with a boolean mask")
        return func(*args, **(kwargs or {}))


def _refuse(name):
    # dynamo must not trace into it: a compiled graph breaks here and the call raises
    @torch.compiler.disable
    def method(self, *args, **kwargs):
        raise HostSync(f"host sync: Tensor.{name}")

    return method


def _to_the_host(device):
    """`device` names the CPU as a string (`"cpu"`): a torch.device is let through, since on this
    machine the CPU is also the device, which `.to(device)` names (torch's own `clip_grad_norm_`
    does `norm.to(grads[0].device)`)."""
    return isinstance(device, str) and torch.device(device).type == "cpu"


def _refuse_host_copies(to, getitem, setitem, as_tensor):
    """`Tensor.to`, indexing and `torch.as_tensor` that raise on a copy to the host or a boolean
    mask: on a CPU a copy to the CPU is no op at all (nothing reaches the dispatch mode), and
    compiled code runs an indexing that breaks its graph as Python, outside any dispatch mode."""

    @torch.compiler.disable
    def checked_to(self, *args, **kwargs):
        if any(_to_the_host(arg) for arg in (*args, kwargs.get("device"))):
            raise HostSync("host sync: Tensor.to the CPU")
        return to(self, *args, **kwargs)

    @torch.compiler.disable
    def checked_getitem(self, index):
        if any(_is_mask(i) for i in (index if isinstance(index, tuple) else (index,))):
            raise HostSync("host sync: indexing with a boolean mask")
        return getitem(self, index)

    @torch.compiler.disable
    def checked_setitem(self, index, value):
        if any(_is_mask(i) for i in (index if isinstance(index, tuple) else (index,))):
            raise HostSync("host sync: a write through a boolean mask")
        return setitem(self, index, value)

    def checked_as_tensor(data, dtype=None, device=None):
        if isinstance(data, torch.Tensor) and _to_the_host(device):
            raise HostSync("host sync: torch.as_tensor(tensor, device='cpu')")
        return as_tensor(data, dtype=dtype, device=device)

    return checked_to, checked_getitem, checked_setitem, checked_as_tensor


@contextlib.contextmanager
def no_host_sync(compiled=False):
    """Any host-device synchronization inside raises HostSync: in eager code (`compiled=False`)
    every syncing op RefuseSyncOps sees (also from C++, `torch.distributions`' argument checks on),
    and in both the SYNC_METHODS, boolean-mask indexing and writes, and `Tensor.to` or
    `torch.as_tensor` to the CPU named as a string (a `torch.device("cpu")` passes: here the device
    IS the CPU, and torch's `clip_grad_norm_` does `.to(device)`). Compiled code syncs only where
    its graph breaks, which runs as Python; `assert_no_host_sync` also refuses a graph break made
    for a syncing op (SYNC_GRAPH_BREAKS). Unseen here, and failing on test_fake_cuda.py's fake CUDA
    device: a copy to the host traced into a graph, or to a `torch.device("cpu")` in a variable."""
    names = (*SYNC_METHODS, "to", "__getitem__", "__setitem__")
    saved = {name: getattr(torch.Tensor, name) for name in names}
    as_tensor = torch.as_tensor
    validate = torch.distributions.Distribution._validate_args
    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, _refuse(name))
        to, getitem, setitem, checked_as_tensor = _refuse_host_copies(
            saved["to"], saved["__getitem__"], saved["__setitem__"], as_tensor
        )
        torch.Tensor.to, torch.Tensor.__getitem__, torch.Tensor.__setitem__ = to, getitem, setitem
        if compiled:
            yield
        else:
            # not in compiled code: dynamo would recompile for a new global
            torch.as_tensor = checked_as_tensor
            torch.distributions.Distribution.set_default_validate_args(True)
            with RefuseSyncOps():
                yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        torch.as_tensor = as_tensor
        torch.distributions.Distribution.set_default_validate_args(validate)


def sync_graph_breaks():
    """The graph breaks dynamo has recorded since the last `counters.clear()` for an op the host
    must wait for."""
    from torch._dynamo.utils import counters

    return [reason for reason in counters["graph_break"] if reason.startswith(SYNC_GRAPH_BREAKS)]


def assert_no_host_sync(fn, inputs, compiled, calls=3):
    """`fn(*inputs())` runs `calls` times without a host sync; returns the last output. A compiled
    `fn` first runs `calls` unguarded warm-up calls (compiling, also for the optimizers' created
    state), with no graph break for a syncing op, then the guarded ones with recompilation
    refused."""
    from torch._dynamo.utils import counters

    with contextlib.ExitStack() as stack:
        if compiled:
            counters["graph_break"].clear()
            for _ in range(calls):
                fn(*inputs())
            breaks = sync_graph_breaks()
            if breaks:
                why = breaks[0].splitlines()[0]
                raise HostSync(f"host sync: compiled code breaks its graph for {why!r}")
            stack.enter_context(torch.compiler.set_stance("fail_on_recompile"))
        stack.enter_context(no_host_sync(compiled))
        for _ in range(calls):
            out = fn(*inputs())
    return out


def run_class(module):
    """The class of the run module that a script's runs are (`Run`, or its family's)."""
    runs = sys.modules["runs"]
    classes = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, runs.Run)]
    return max(classes, key=lambda cls: len(cls.__mro__))


@pytest.fixture
def make_run(tmp_path, monkeypatch):
    """`make_run(script, **flags)`: the script's `Run` for its `Args` with `flags`, its run folder
    in a temporary working folder; the test process keeps its own Ctrl-C and SIGTERM handlers."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)

    def make(script, **flags):
        module = load_script(script)
        return run_class(module)(module.Args(**flags), script)

    return make


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """A folder of every script exported as one file (`python leanrl/export.py`)."""
    return export_scripts(ALL_SCRIPTS, tmp_path_factory.mktemp("exported"))


@pytest.fixture
def train(tmp_path, monkeypatch):
    """`train(script, *flags, stop_at=k, counted=(owner, name), directory=d)`: the exit status of
    the script's `main` (of `d/<script>.py`, by default leanrl/'s) run in this process in a
    temporary folder; with `stop_at`, a SIGTERM arrives during the k-th call of `owner.name`
    (`owner` a class or a name of the script's; by default the vector env's `step`)."""
    import tyro

    monkeypatch.chdir(tmp_path)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()  # a run sets its own (runs.Run); the next test gets these
    originals = {}  # the methods before this fixture counted their calls

    def run(script, *flags, stop_at=None, counted=None, directory=SCRIPTS):
        module = load_script(script, directory)
        vector_env = (
            getattr(module, "SyncVectorEnv", None) or load_script("vector_envs").SyncVectorEnv
        )
        owner, name = counted or (vector_env, "step")
        owner = getattr(module, owner) if isinstance(owner, str) else owner
        step = originals.setdefault((owner, name), getattr(owner, name))
        calls = [0]

        def counted_step(envs, *args, **kwargs):
            calls[0] += 1
            if calls[0] == stop_at:
                os.kill(os.getpid(), signal.SIGTERM)
            return step(envs, *args, **kwargs)

        monkeypatch.setattr(owner, name, counted_step)
        argv = list(map(str, flags))
        try:
            if hasattr(module, "sweep_argv"):  # a seeds script's entry checks a sweep's flags
                argv = module.sweep_argv(module.Args, argv)
            module.main(tyro.cli(module.Args, args=argv))
            return 0
        except SystemExit as e:
            return e.code
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            torch.set_num_threads(threads)

    return run


@pytest.fixture
def refused(train, capsys, monkeypatch):
    """`refused(script, flags, words)`: `flags` given to the script's `main` in this process, which
    sees no GPU (as a launched script), are refused before training: exit status 2 and one line on
    stderr holding each of `words`, which it returns. Training, were it to start, fails the test at
    once. (test_contract.py runs one refusal of every script as a whole process.)"""

    def trains(run, iterations):
        raise AssertionError("the flags were not refused: training started")

    monkeypatch.setattr(load_script("runs").Run, "progress", trains)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def check(script, flags, words=()):
        status = train(script, *flags)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert status == 2 and len(lines) == 1, f"{flags}: exit status {status}\n{err}"
        assert all(str(word) in lines[0] for word in words), (flags, lines[0])
        return lines[0]

    return check


def checkpoint(folder):
    """The checkpoint of a run folder, loaded on the CPU."""
    return torch.load(Path(folder) / "checkpoint.pt", map_location="cpu", weights_only=False)


def assert_same_state(a, b, where="state"):
    """Two checkpoints' training states are equal, bit for bit: every tensor, array and value."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), f"{where} differs"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
