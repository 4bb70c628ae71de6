"""The CUDA path, dry-run on a fake GPU: every script that records functions with `--cudagraphs` is
built by its `make_learner` for a "cuda" device under torch's `FakeTensorMode` (shapes, dtypes and
devices, no data), and each function `main` hands to `CudaGraphModule` runs a few calls under
`OnlyOnTheDevice`, which fails on a CPU tensor read or made inside (0-d included), a copy to the
host, an op the host must wait for (`.item()`, `torch.equal`, `nonzero`, boolean masks) and a device
mismatch. It cannot show values, speed, or what only a capture checks; `torch.compile` is not run
(tests/test_cuda_path.py compiles on the CPU). A 2-line C++ CUDA guard lets a CPU-only torch make
fake CUDA tensors; `BuildOnFakeCuda` and `fake_backward` say what else is patched."""

import contextlib
import ctypes
import functools
import shutil
import subprocess
import unittest.mock
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MASKABLE_OPS, SYNC_OPS, HostSync, load_script
from tensordict import TensorDict
from torch._functorch import eager_transforms
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten
CUDA = torch.device("cuda", 0)
# meta tensors hold no data and run no kernel (the vmapped Q ensembles' shells are on "meta")
ON_DEVICE = ("cuda", "meta")
FLAG_SETS = {
    "none": {},
    "compile": {"compile": True},
    "cudagraphs": {"cudagraphs": True},
    "compile-cudagraphs": {"compile": True, "cudagraphs": True},
}
# in-place random initialisation: skipped while building (the values of a fake tensor do not exist)
RANDOM_INIT = {aten.uniform_.default, aten.normal_.default}
RANDOM_INIT |= {aten.bernoulli_.float, aten.exponential_.default}
# ops whose result the host must wait for (most of which FakeTensorMode would refuse on its own,
# less clearly)
WAITING_OPS = {*SYNC_OPS, aten.item.default}

# fused Adam with a tensor learning rate has no fake kernel; its float overload, which does the same
# writes, has one
TENSOR_LR = {
    aten._fused_adam_.tensor_lr: aten._fused_adam_.default,
    aten._fused_adamw_.tensor_lr: aten._fused_adamw_.default,
}


class OffTheDevice(AssertionError):
    """A function meant for a CUDA graph read, made or copied a tensor off the CUDA device."""


class BuildOnFakeCuda(TorchDispatchMode):
    """While `make_learner` builds: random initialisation does nothing, and a number copied to the
    device (`torch.tensor(lr, device=device)`) keeps a real copy on the host, carried through the
    ops that read only such tensors, so that a constructor can check its value (Adam's `0 <= lr`).
    The fake tensors themselves stay as FakeTensorMode makes them."""

    def __init__(self):
        super().__init__()
        self.values = WeakIdKeyDictionary()  # fake tensor -> its real value, on the host

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in RANDOM_INIT:
            return args[0]
        if kwargs.get("device") == torch.device("meta"):
            # a real meta tensor: a Parameter made of a FakeTensor cannot be swapped
            with unset_fake_temporarily():
                # back into a module inside vmap (tensordict's to_module does it)
                return func(*args, **kwargs)
        if func is aten._local_scalar_dense.default and args[0] in self.values:
            return self.values[args[0]].item()
        out = func(*args, **kwargs)
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func is aten._to_copy.default and getattr(args[0], "constant", None) is not None:
            self.values[out] = args[0].constant.to(kwargs.get("dtype") or args[0].dtype)
        elif tensors and all(t in self.values for t in tensors) and isinstance(out, torch.Tensor):
            real = tree_map(
                lambda t: self.values[t] if isinstance(t, torch.Tensor) else t, (args, kwargs)
            )
            with unset_fake_temporarily():
                self.values[out] = func(*real[0], **real[1])
        elif func._schema.is_mutable and args and args[0] in self.values:
            del self.values[args[0]]  # written with a value the host does not know
        return out


def check_on_device(func, verb, tensors):
    off = [t for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)]
    off = [t for t in off if t.device.type not in ON_DEVICE]
    if off:
        raise OffTheDevice(
            f"{func} {verb} a tensor on {off[0].device} (shape {tuple(off[0].shape)})"
        )


class OnlyOnTheDevice(TorchDispatchMode):
    """While a function runs in the dry run: every tensor an op reads or makes is on the CUDA
    device, and no op makes the host wait for the device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in WAITING_OPS:
            raise HostSync(f"host sync: {func}")
        if func in MASKABLE_OPS and any(i is not None and i.dtype == torch.bool for i in args[1]):
            raise HostSync(f"host sync: {func} with a boolean mask")
        check_on_device(func, "reads", (args, kwargs))
        # no fake kernel: the float overload's, once the tensor lr is known on the device
        if func in TENSOR_LR:
            func, kwargs = TENSOR_LR[func], kwargs | {"lr": 1e-3}
        out = func(*args, **kwargs)
        check_on_device(func, "makes", out)
        return out


GUARD = """#include <c10/core/impl/DeviceGuardImplInterface.h>
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::CUDA>);
"""


@pytest.fixture(scope="module")
def cuda_guard(tmp_path_factory):
    """On a CPU-only torch, a do-nothing CUDA device guard (torch's bindings and autograd abort
    without one on any CUDA tensor, fake or not); `torch.cuda.is_available()` stays False."""
    if torch.version.cuda is not None:
        return
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("needs a C++ compiler to build a CUDA device guard for the CPU-only torch")
    folder = tmp_path_factory.mktemp("fake_cuda_guard")
    (folder / "guard.cpp").write_text(GUARD)
    torch_dir = Path(torch.__file__).parent
    lib = torch_dir / "lib"
    cmd = f"{compiler} -std=c++17 -shared -fPIC -I{torch_dir / 'include'} {folder / 'guard.cpp'}"
    cmd = cmd.split() + ["-o", str(folder / "guard.so"), f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        pytest.skip(
            "could not build the CUDA device guard: "
            f"{(built.stderr.strip().splitlines() or ['?'])[-1]}"
        )
    ctypes.CDLL(str(folder / "guard.so"))  # registers on load, for the rest of this process


def fake_backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """`loss.backward()` in the dry run: each leaf the loss depends on gets a gradient of its shape
    and device, without autograd's engine (which asks a CPU-only build for a CUDA stream)."""
    nodes, seen = [self.grad_fn], set()
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # an AccumulateGrad: a leaf
            leaf = node.variable
            leaf.grad = torch.zeros_like(leaf) if leaf.grad is None else leaf.grad + 0
        nodes.extend(next_node for next_node, _ in node.next_functions)


@contextlib.contextmanager
def fake_cuda(monkeypatch):
    """Tensors made inside can live on a fake CUDA device."""
    monkeypatch.setattr(torch.Tensor, "backward", fake_backward)
    monkeypatch.setattr(
        torch, "compile", lambda fn=None, **kwargs: fn if fn is not None else (lambda f: f)
    )
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield


def zeros(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype, device=CUDA)


def batch(size, **columns):
    """`size` rows on the fake device; a column is a shape (float32) or a (shape, dtype) pair."""
    columns = {
        key: column if column and isinstance(column[-1], torch.dtype) else (column, torch.float32)
        for key, column in columns.items()
    }
    size = list(size) if isinstance(size, tuple) else [size]
    return TensorDict(
        {key: zeros(*size, *shape, dtype=dtype) for key, (shape, dtype) in columns.items()},
        batch_size=size,
        device=CUDA,
    )


BOUNDS = (-2 * np.ones(1), 2 * np.ones(1))
OFF_POLICY = dict(obs=(3,), next_obs=(3,), actions=(1,), rewards=(), terminations=())
# with the obs and actions of each twin
PPO = dict(logprobs=(), values=(), advantages=(), returns=())
DISCRETE = ((), torch.long)


def make_sac_or_td3(module, args):  # the same fields in both
    learner = module.make_learner(args, 3, 1, *BOUNDS, CUDA)
    data = batch(64, **OFF_POLICY)
    return {
        "policy": (learner.policy, (zeros(1, 3),)),
        "update_critic": (learner.update_critic, (data,)),
        "update_actor": (learner.update_actor, (data,)),
    }


def make_dqn(module, args):
    learner = module.make_learner(args, 4, 2, CUDA)
    data = batch(64, **OFF_POLICY | dict(obs=(4,), next_obs=(4,), actions=DISCRETE))
    return {"policy": (learner.policy, (zeros(1, 4),)), "update": (learner.update, (data,))}


def make_ppo(module, args):
    learner = module.make_learner(args, 3, 2, CUDA)
    return {
        "policy": (learner.policy, (zeros(1, 3),)),
        "update": (learner.update, (batch(64, obs=(3,), actions=(2,), **PPO),)),
    }


def make_ppo_ray(module, args):
    # the learner's update is the one function the Ray script records; its actors act on the CPU, in
    # their processes
    update = module.make_learner(args, 3, 2, CUDA).update
    # behaviour_weights: importance weights for the policy that sampled (the actors' lag)
    return {"update": (update, (batch(64, obs=(3,), actions=(2,), behaviour_weights=(), **PPO),))}


def make_ppo_atari(module, args):
    learner = module.make_learner(args, 4, CUDA)
    policy, update = learner.policy, learner.update
    frames = ((4, 84, 84), torch.uint8)
    mb = batch(8, obs=frames, actions=DISCRETE, **PPO)
    return {
        "policy": (policy, (zeros(2, 4, 84, 84, dtype=torch.uint8),)),
        "update": (update, (mb,)),
    }


def make_ppo_lstm(module, args):
    learner = module.make_learner(args, 2, 2, CUDA)
    policy, update = learner.policy, learner.update
    mb = batch((8, 2), obs=(2,), actions=DISCRETE, dones=(), **PPO)
    return {
        "policy": (policy, (zeros(1, 4, 2), (zeros(4, 128), zeros(4, 128)), zeros(1, 4))),
        "update": (update, (mb, (zeros(2, 128), zeros(2, 128)))),
    }


def make_ppo_mingru(module, args):
    learner = module.make_learner(args, 2, 2, CUDA)
    agent, policy, update = learner.agent, learner.policy, learner.update
    mb = batch((8, 2), obs=(2,), actions=DISCRETE, dones=(), **PPO)
    layers, size = agent.num_layers, agent.state_size
    return {
        "policy": (policy, (zeros(1, 4, 2), zeros(layers, 4, size), zeros(1, 4))),
        "update": (update, (mb, zeros(layers, 2, size))),
    }


def skip_unless_graphed(args):
    """RAdam (PQN's) keeps its step count on the host unless capturable: no sync, never graphed."""
    if not args.cudagraphs:
        pytest.skip("RAdam's step count lives on the host without --cudagraphs")


def make_pqn(module, args):
    skip_unless_graphed(args)
    learner = module.make_learner(args, 4, 2, CUDA)
    mb = batch(64, obs=(4,), actions=DISCRETE, returns=())
    rollout = [zeros(16, 4) for _ in range(2)] + [zeros(4)] + [zeros(16, 4) for _ in range(3)]
    return {
        "policy": (learner.policy, (zeros(4, 4),)),
        "returns": (module.q_lambda_returns, (*rollout, 0.99, 0.65)),
        "update": (learner.update, (mb,)),
    }


def make_pqn_atari(module, args):
    skip_unless_graphed(args)
    learner = module.make_learner(args, 4, CUDA)
    mb = batch(8, obs=((4, 84, 84), torch.uint8), actions=DISCRETE, returns=())
    frames = zeros(2, 4, 84, 84, dtype=torch.uint8)
    rollout = [zeros(16, 8) for _ in range(2)] + [zeros(8)] + [zeros(16, 8) for _ in range(2)]
    return {
        "policy": (learner.policy, (frames,)),
        "returns": (module.q_lambda_returns, (*rollout, 0.99, 0.65)),
        "update": (learner.update, (mb,)),
    }


load = functools.cache(load_script)  # one import per script for its four flag sets

SCRIPTS = {
    "sac_continuous_action_torchcompile": make_sac_or_td3,
    "td3_continuous_action_torchcompile": make_sac_or_td3,
    "dqn_torchcompile": make_dqn,
    "ppo_continuous_action_torchcompile": make_ppo,
    # one process (the only case --cudagraphs accepts), no collective
    "ppo_continuous_action_distributed": make_ppo,
    "ppo_continuous_action_ray": make_ppo_ray,
    "ppo_atari_envpool_torchcompile": make_ppo_atari,
    "ppo_atari_envpool_async": make_ppo_atari,
    "ppo_lstm_torchcompile": make_ppo_lstm,
    "ppo_mingru_torchcompile": make_ppo_mingru,
    "pqn_torchcompile": make_pqn,
    "pqn_atari_envpool_torchcompile": make_pqn_atari,
}


# the seeds scripts: the members' functions, vmapped over a leading seeds axis
SEEDS = [1, 2, 3]


def fake_autograd_grad(outputs, inputs, *args, **kwargs):
    """`torch.func`'s gradients in the dry run, as `fake_backward` for `.backward()`."""
    return tuple(torch.zeros_like(x) for x in inputs)


def with_fake_func_grads(fn):
    """`fn`, whose `torch.func` gradients (a functional update's) are `fake_autograd_grad`'s."""

    def call(*args):
        with unittest.mock.patch.object(eager_transforms, "_autograd_grad", fake_autograd_grad):
            return fn(*args)

    return call


def make_dqn_seeds(module, args):
    learner = module.make_learner(args, 4, 2, SEEDS, CUDA)
    policy, update = learner.policy, learner.update
    data = batch((len(SEEDS), 64), **OFF_POLICY | dict(obs=(4,), next_obs=(4,), actions=DISCRETE))
    update = with_fake_func_grads(update)
    return {
        "policy": (policy, (zeros(len(SEEDS), 1, 4),)),
        "update": (update, (dict(data.items()),)),
    }


def make_sac_or_td3_seeds(module, args):
    learner = module.make_learner(args, 3, 1, *BOUNDS, SEEDS, CUDA)
    data = dict(batch((len(SEEDS), 64), **OFF_POLICY).items())
    return {
        "policy": (learner.policy, (zeros(len(SEEDS), 1, 3),)),
        "update_critic": (with_fake_func_grads(learner.update_critic), (data,)),
        "update_actor": (with_fake_func_grads(learner.update_actor), (data,)),
    }


def make_ppo_seeds(module, args):
    learner = module.make_learner(args, 3, 2, SEEDS, CUDA)
    policy, update = learner.policy, learner.update
    # valid: 0 for envpool's reset steps
    minibatch = batch((len(SEEDS), 64), obs=(3,), actions=(2,), valid=(), **PPO)
    update = with_fake_func_grads(update)
    return {"policy": (policy, (zeros(len(SEEDS), 3),)), "update": (update, (minibatch,))}


SCRIPTS |= {"dqn_seeds": make_dqn_seeds, "ppo_continuous_action_seeds": make_ppo_seeds}
SCRIPTS |= dict.fromkeys(
    ["sac_continuous_action_seeds", "td3_continuous_action_seeds"], make_sac_or_td3_seeds
)


@pytest.mark.parametrize("flags", FLAG_SETS)
@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_on_a_fake_gpu(script, flags, monkeypatch, cuda_guard):
    """Each function runs 3 calls, as CudaGraphModule's warm-up and recording would (the optimizers
    make their state in the first), with every tensor on the device and no host sync."""
    module = load(script)
    args = module.Args(**FLAG_SETS[flags])
    with fake_cuda(monkeypatch):
        with BuildOnFakeCuda():
            functions = SCRIPTS[script](module, args)
        for name, (fn, inputs) in functions.items():
            with torch.no_grad() if name == "policy" else contextlib.nullcontext():
                for _ in range(3):
                    with OnlyOnTheDevice():
                        out = fn(*inputs)
            leaves = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
            assert leaves and all(x.device == CUDA for x in leaves), f"{script}.{name}: {out}"


def test_the_dry_run_catches_what_a_gpu_would_refuse(monkeypatch, cuda_guard):
    """Not vacuous: each of these fails the dry run, as it would fail (or silently go stale in) a
    CUDA graph."""
    with fake_cuda(monkeypatch):
        with BuildOnFakeCuda():
            x = zeros(8)
            weight = torch.nn.Parameter(zeros(8))
            weight.grad = zeros(8)
            cpu_lr = torch.optim.Adam([weight], lr=torch.tensor(1e-3), fused=True, capturable=True)
            dqn = load("dqn_torchcompile")
            # its step on the CPU, its Q network on the device
            dqn_learner = dqn.make_learner(dqn.Args(), 4, 2, torch.device("cpu"))
            q_network = dqn.QNetwork(4, 2, device=CUDA)
            dqn_learner.q_network.load_state_dict(q_network.state_dict(), assign=True)
            cpu_schedule = dqn_learner.policy

        def masked_write(x):
            # a device value: a Python number would be a CPU tensor, refused before the write
            x[x > 0] = x[0]

        placement = {
            "a CPU 0-d tensor read": lambda x: x * torch.tensor(2.0),
            "a tensor made without device=": lambda x: x + torch.zeros(8),
            ".to('cpu')": lambda x: x.to("cpu"),
            ".cpu()": lambda x: x.cpu(),
            "torch.as_tensor(x, device='cpu')": lambda x: torch.as_tensor(x, device="cpu"),
            "a learning rate on the CPU": lambda x: cpu_lr.step(),
            "DQN's schedule on the CPU": lambda x: cpu_schedule(zeros(1, 4)),
        }
        syncs = {
            ".item()": lambda x: x.sum().item(),
            "a Python branch on a tensor": lambda x: x * 2 if x.sum() > 0 else x,
            "torch.equal": lambda x: torch.equal(x, x),
            "boolean-mask indexing": lambda x: x[x > 0],
            "a boolean-mask write": masked_write,
            "nonzero": lambda x: x.nonzero(),
        }
        for cases, error in ((placement, OffTheDevice), (syncs, HostSync)):
            for name, fn in cases.items():
                with pytest.raises(error), OnlyOnTheDevice():
                    fn(x)
                    pytest.fail(f"the dry run let {name} pass")
