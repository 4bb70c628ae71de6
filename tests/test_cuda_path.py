"""The CUDA path, checked on a CPU: every function an optimized twin (and the torchrun and Ray
scripts) hands to `CudaGraphModule` runs without a host sync, eagerly and compiled, and every
optimizer stepped inside one is capturable under `--cudagraphs` (a capture refuses both). Each
script is built by its `make_learner` with `--cudagraphs` on, on the CPU (placement is
test_fake_cuda.py's). The guard's own tests show each sync it catches; the last two show that
scripts a test launches see no GPU unless it is a CUDA test."""

import os
import subprocess
import sys

import numpy as np
import pytest
import test_td3_continuous_action as td3
import torch
from conftest import assert_no_host_sync, load_script, requires_cuda, script_env
from test_dqn import make_batch as dqn_batch
from test_ppo_atari_envpool import make_minibatch as atari_minibatch
from test_ppo_continuous_action import make_minibatch as ppo_minibatch
from test_ppo_lstm import make_minibatch as lstm_minibatch
from test_ppo_mingru import STATE_SIZE as MINGRU_STATE_SIZE
from test_ppo_mingru import make_minibatch as mingru_minibatch
from test_sac_continuous_action import make_batch as sac_batch

CPU = torch.device("cpu")
BOUNDS = (-2 * np.ones(1), 2 * np.ones(1))


def build_sac(module, args):
    learner = module.make_learner(args, 3, 1, *BOUNDS, CPU)
    obs = lambda: (torch.randn(1, 3),)  # noqa: E731
    batch = lambda: (sac_batch(0),)  # noqa: E731
    optimizers = (learner.q_optimizer, learner.actor_optimizer, learner.alpha_optimizer)
    return optimizers, {
        "policy": (learner.policy, obs),
        "update_critic": (learner.update_critic, batch),
        "update_actor": (learner.update_actor, batch),
    }


def build_td3(module, args):
    learner = module.make_learner(args, td3.N_OBS, td3.N_ACT, td3.LOW, td3.HIGH, CPU)
    obs = lambda: (torch.randn(1, td3.N_OBS),)  # noqa: E731
    batch = lambda: (td3.make_batch(0),)  # noqa: E731
    return [learner.q_optimizer, learner.actor_optimizer], {
        "policy": (learner.policy, obs),
        "update_critic": (learner.update_critic, batch),
        "update_actor": (learner.update_actor, batch),
    }


def build_dqn(module, args):
    learner = module.make_learner(args, 4, 2, CPU)
    return [learner.optimizer], {
        "policy": (learner.policy, lambda: (torch.randn(1, 4),)),
        "update": (learner.update, lambda: (dqn_batch(),)),
    }


def build_ppo(module, args):
    learner = module.make_learner(args, 3, 2, CPU)
    # the update compiles its loss itself under --compile (the Adam step stays eager), so `main`
    # compiles only acting
    return [learner.optimizer], {
        "policy": (learner.policy, lambda: (torch.randn(1, 3),)),
        "update": (learner.update, lambda: (ppo_minibatch(0),)),
    }


def build_ppo_ray(module, args):
    # the learner's update is what the Ray script records; its actors act on the CPU in their own
    # processes
    learner = module.make_learner(args, 3, 2, CPU)

    def minibatch():
        mb = ppo_minibatch(0)
        # importance weights for the policy that sampled
        mb["behaviour_weights"] = torch.rand(mb.batch_size)
        return (mb,)

    return [learner.optimizer], {"update": (learner.update, minibatch)}


def build_ppo_lstm(module, args):
    learner = module.make_learner(args, 2, 2, CPU)
    optimizer, policy, update = learner.optimizer, learner.policy, learner.update
    state = lambda: (torch.randn(4, 128), torch.randn(4, 128))  # noqa: E731
    obs = lambda: (torch.randn(1, 4, 2), state(), torch.ones(1, 4))  # noqa: E731
    return [optimizer], {"policy": (policy, obs), "update": (update, lambda: lstm_minibatch(0))}


def build_ppo_mingru(module, args):
    learner = module.make_learner(args, 2, 2, CPU)
    optimizer, policy, update = learner.optimizer, learner.policy, learner.update

    def obs():
        return torch.randn(1, 4, 2), torch.randn(2, 4, MINGRU_STATE_SIZE), torch.ones(1, 4)

    return [optimizer], {"policy": (policy, obs), "update": (update, lambda: mingru_minibatch(0))}


def build_ppo_atari(module, args):
    learner = module.make_learner(args, 4, CPU)
    optimizer, policy, update = learner.optimizer, learner.policy, learner.update
    obs = lambda: (torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8),)  # noqa: E731
    return [optimizer], {
        "policy": (policy, obs),
        "update": (update, lambda: (atari_minibatch(0, size=8),)),
    }


# twin -> (builder, the functions `main` wraps in torch.compile under --compile)
TWINS = {
    "sac_continuous_action_torchcompile": (build_sac, ("policy", "update_critic", "update_actor")),
    "td3_continuous_action_torchcompile": (build_td3, ("policy", "update_critic", "update_actor")),
    "dqn_torchcompile": (build_dqn, ("policy", "update")),
    "ppo_continuous_action_torchcompile": (build_ppo, ("policy",)),
    # one process: --cudagraphs as in its twin
    "ppo_continuous_action_distributed": (build_ppo, ("policy",)),
    # main compiles GAE only; `make_learner` compiles the loss
    "ppo_continuous_action_ray": (build_ppo_ray, ()),
    "ppo_atari_envpool_torchcompile": (build_ppo_atari, ("policy",)),
    "ppo_lstm_torchcompile": (build_ppo_lstm, ("policy",)),
    "ppo_mingru_torchcompile": (build_ppo_mingru, ("policy",)),
}


def cudagraph_args(module, compile):
    return module.Args(cudagraphs=True, compile=compile)


FLAG_SETS = {"none": {}, "cudagraphs": {"cudagraphs": True}}
FLAG_SETS["compile-cudagraphs"] = {"compile": True, "cudagraphs": True}


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("flags", FLAG_SETS)
def test_optimizers_are_fused_and_capturable_exactly_under_cudagraphs(twin, flags):
    module = load_script(twin)
    optimizers, _ = TWINS[twin][0](module, module.Args(**FLAG_SETS[flags]))
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            assert group["fused"] and group["capturable"] is (flags != "none"), optimizer


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize(
    "compile",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # compiled: up to 33 s a twin here
    ids=["eager", "compiled"],
)
def test_graphed_functions_never_sync_with_the_host(twin, compile):
    module = load_script(twin)
    build, compiled_by_main = TWINS[twin]
    torch.manual_seed(0)
    _, functions = build(module, cudagraph_args(module, compile))
    for name, (fn, inputs) in functions.items():
        compiled = compile and name in compiled_by_main
        fn = torch.compile(fn) if compiled else fn
        with torch.no_grad() if name == "policy" else torch.enable_grad():
            out = assert_no_host_sync(fn, inputs, compiled=compile)
        leaves = [x for x in torch.utils._pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]
        assert leaves and all(torch.isfinite(x).all() for x in leaves), f"{twin}.{name}: {out}"


def masked_write(x):
    y = x * 2
    y[y > 0] = 0.0
    return y


# what a capture refuses -> whether the guard also sees it in compiled code (where it runs at a
# graph break); a copy to the host traced into a graph is not seen there (see `no_host_sync`),
# test_fake_cuda.py catches it
SYNCS = {
    "a Python branch on a tensor": (lambda x: x * 2 if x.sum() > 0 else x, True),
    ".item()": (lambda x: x * x.sum().item(), True),
    "boolean-mask indexing": (lambda x: x[x > 0].sum() * 2, True),
    # compiled: a torch.where, no sync at all
    "a write through a boolean mask": (masked_write, False),
    "torch.equal": (lambda x: x * 2 if torch.equal(x, x) else x, True),
    "nonzero": (lambda x: x.nonzero().sum() * 2, True),
    ".to('cpu')": (lambda x: (x * 2).to("cpu"), False),
    "torch.as_tensor(t, device='cpu')": (lambda x: torch.as_tensor(x * 2, device="cpu"), False),
    ".cpu()": (lambda x: (x * 2).cpu(), False),
    "torch.distributions' argument checks": (
        lambda x: torch.distributions.Normal(x, 1.0).loc,
        False,
    ),
}


@pytest.mark.parametrize("sync", SYNCS)
def test_the_guard_catches_what_a_capture_refuses(sync):
    """The guard is not vacuous: it refuses each of these in eager code, and in compiled code where
    it syncs there."""
    from conftest import HostSync

    fn, compiled_too = SYNCS[sync]
    x = torch.randn(8)
    with pytest.raises(HostSync):
        assert_no_host_sync(fn, lambda: (x,), compiled=False)
    if compiled_too:
        with pytest.raises(HostSync):
            assert_no_host_sync(torch.compile(fn, backend="eager"), lambda: (x,), compiled=True)


def test_the_guard_catches_a_distribution_that_validates_its_arguments():
    """A `Normal` that validates its arguments (torch's default) reads them on the host: a sync per
    call. The eager SAC twin builds its `Normal` unchecked (a nan mean must reach the divergence
    check, not raise), so its actor passes the guard."""
    from conftest import HostSync

    actor = load_script("sac_continuous_action").Actor(3, 1, *BOUNDS)

    def validated(obs):
        mean, log_std = actor(obs)
        return torch.distributions.Normal(mean, log_std.exp()).rsample()

    with torch.no_grad():
        with pytest.raises(HostSync):
            assert_no_host_sync(validated, lambda: (torch.randn(1, 3),), compiled=False)
        assert_no_host_sync(actor.get_action, lambda: (torch.randn(1, 3),), compiled=False)


SHOW_GPUS = (
    "import os, torch; "
    "print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')), torch.cuda.is_available())"
)


def test_a_launched_script_sees_no_gpu_outside_a_cuda_test():
    """A script a CPU test launches (conftest's `script_env`) sees no CUDA device, also on a GPU
    machine: `--cuda` gives the CPU, torchrun's ranks take the CPU and gloo."""
    proc = subprocess.run(
        [sys.executable, "-c", SHOW_GPUS], env=script_env(), capture_output=True, text=True
    )
    assert proc.stdout.split() == ["''", "False"], proc.stdout + proc.stderr


@pytest.mark.cuda  # no GPU needed: it reads the environment a CUDA test would give its scripts
def test_a_cuda_test_shows_its_scripts_the_gpus():
    assert script_env().get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")

    def a_test():
        pass

    marks = {mark.name for mark in requires_cuda(a_test).pytestmark}
    assert marks == {"cuda", "skipif"}, "requires_cuda marks a CUDA test and skips it without CUDA"
