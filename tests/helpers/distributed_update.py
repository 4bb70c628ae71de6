"""Data-parallel runs made deterministic, run by torchrun (or plainly, as one process) for
test_ppo_continuous_action_distributed.py:

    torchrun --standalone --nproc_per_node 2 tests/helpers/distributed_update.py update OUT_DIR
    # or python ... main
    torchrun --standalone --nproc_per_node 2 tests/helpers/distributed_update.py main \\
        --num-envs 1 ...

`update`: each rank builds the learner of ppo_continuous_action_distributed as `main` builds it
(`make_learner` with the world size, which broadcasts rank 0's weights), runs one epoch of minibatch
updates on its share of a fixed batch, and saves its parameters and last gradients to
OUT_DIR/rank<RANK>.pt. The test runs the same epoch in one process on the whole minibatches and
compares. The batch and the arrangement of the minibatches are defined here.

`main`: the script's own `main` with its randomness taken out: actions are the Gaussian's mean and
each epoch's minibatches are the rollout in order (`torch.randn_like` and `torch.randperm`
replaced), and every env's observation is acted on alone, so that 2 ranks with E envs and one
process with 2E envs see the same data in the same minibatches.
"""

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import tyro
from tensordict import TensorDict

# the repository root: run as a file by torchrun
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.scripts import load_script  # noqa: E402

SCRIPT = "ppo_continuous_action_distributed"
N_OBS, N_ACT, BATCH, NUM_MINIBATCHES = 3, 2, 512, 4


def update_args(module):
    """The learner's flags in the test: no advantage normalization (each rank would normalize its
    share of a minibatch with that share's statistics) and no gradient clipping (a gradient
    summed over the ranks instead of averaged would be clipped to the same norm, and Adam's step
    hardly depends on the gradient's scale), so the parameters and the gradients compared are
    those of the averaged gradient."""
    return module.Args(norm_adv=False, max_grad_norm=1e6, ent_coef=0.01)


def fixed_batch(seed=0):
    """A rollout batch of BATCH samples, the same in every process."""
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.randn(BATCH, N_OBS, generator=g),
        "actions": torch.randn(BATCH, N_ACT, generator=g),
        "logprobs": torch.randn(BATCH, generator=g) * 0.1 - 2.0,
        "values": torch.randn(BATCH, generator=g),
        "advantages": torch.randn(BATCH, generator=g),
        "returns": torch.randn(BATCH, generator=g),
    }
    return TensorDict(data, batch_size=[BATCH])


def minibatches(batch, rank, world_size):
    """What rank `rank` of `world_size` updates on: the k-th of NUM_MINIBATCHES slices of `batch`,
    cut into `world_size` equal shares, gives each rank its k-th minibatch. One process (rank 0
    of 1) takes whole slices: the union of the ranks' k-th minibatches."""
    slices = batch.split(len(batch) // NUM_MINIBATCHES)
    return [mb.split(len(mb) // world_size)[rank] for mb in slices]


def train(module, rank, world_size):
    """The learner (seeded by rank, so that only the broadcast makes the ranks' initial weights
    equal) after one epoch on its minibatches: {"parameters", "grads"} by name."""
    torch.manual_seed(100 + rank)
    learner = module.make_learner(
        update_args(module), N_OBS, N_ACT, torch.device("cpu"), world_size
    )
    agent = learner.agent
    for mb in minibatches(fixed_batch(), rank, world_size):
        learner.update(mb)
    return {
        "parameters": {name: p.detach().clone() for name, p in agent.named_parameters()},
        "grads": {name: p.grad.clone() for name, p in agent.named_parameters()},
    }


def update_main(out_dir):
    torch.set_num_threads(1)
    module = load_script(SCRIPT)
    rank, _, world_size = module.process_layout(os.environ)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    result = train(module, rank, world_size)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def one_row_at_a_time(fn):
    """`fn` called on each row of its input alone, its outputs concatenated: a rank with one env
    acts on batches of one row, and BLAS rounds a batch of two rows differently from two batches
    of one (other kernels), which 64 env steps would amplify into the weights."""

    def rows(x):
        outputs = [fn(row) for row in x.split(1)]
        if isinstance(outputs[0], tuple):
            return tuple(torch.cat(parts) for parts in zip(*outputs))
        return torch.cat(outputs)

    return rows


def deterministic_main(flags):
    # as torchrun gives each rank (OMP_NUM_THREADS=1): more threads sum in another order
    torch.set_num_threads(1)
    torch.randn_like = torch.zeros_like
    torch.randperm = lambda n, device=None: torch.arange(n, device=device)
    module = load_script(SCRIPT)
    make_learner = module.make_learner

    def make_learner_acting_by_rows(*args, **kwargs):
        learner = make_learner(*args, **kwargs)
        learner.policy = one_row_at_a_time(learner.policy)
        learner.get_value = one_row_at_a_time(learner.get_value)
        return learner

    module.make_learner = make_learner_acting_by_rows
    module.main(tyro.cli(module.Args, args=flags))


if __name__ == "__main__":
    if sys.argv[1] == "update":
        update_main(sys.argv[2])
    else:
        deterministic_main(sys.argv[2:])
