"""Adam's step alone, compiled as the `_cpu` scripts compile their updates (`fullgraph=True`, the
C++ wrapper), on one thread: optimizers.py's Adam (written out, its bias corrections from running
products) against torch's functional Adam (`torch.optim.adam.adam`, its bias corrections from
step-count tensors) in the forms that compile, over two 17-256-256-1 networks (SAC's Q-networks'
size). Blocks of calls alternate between the forms; each form's minimum and median per step.

    python -m benchmarks.studies.adam_forms               # 15 blocks of 500 calls
    python -m benchmarks.studies.adam_forms --blocks 3 --calls 50  # quick
"""

import argparse
import statistics
import time

import torch
from torch.optim.adam import adam

from benchmarks.machine import machine_info
from benchmarks.scripts import load_script

SHAPES = [(256, 17), (256,), (256, 256), (256,), (1, 256), (1,)] * 2


class FunctionalAdam:
    """torch's functional Adam on a dict of tensors, its step counts tensors: nothing recompiles."""

    def __init__(self, params, lr, foreach=False, capturable=False):
        self.params, self.lr, self.foreach, self.capturable = params, lr, foreach, capturable
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
        self.steps = {name: torch.zeros(()) for name in params}

    def step(self, grads):
        names = list(self.params)
        adam(
            [self.params[name] for name in names],
            [grads[name] for name in names],
            [self.exp_avg[name] for name in names],
            [self.exp_avg_sq[name] for name in names],
            [],
            [self.steps[name] for name in names],
            foreach=self.foreach,
            # torch refuses `capturable` on a CPU eagerly, not while compiling
            capturable=self.capturable and torch.compiler.is_compiling(),
            amsgrad=False,
            beta1=0.9,
            beta2=0.999,
            lr=self.lr,
            weight_decay=0.0,
            eps=1e-8,
            maximize=False,
        )


def params(seed):
    g = torch.Generator().manual_seed(seed)
    return {f"p{i}": torch.randn(shape, generator=g) for i, shape in enumerate(SHAPES)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15, help="alternating blocks per form")
    parser.add_argument("--calls", type=int, default=500, help="steps per block")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    optimizers = load_script("optimizers")
    forms = {
        "optimizers.py (written out)": optimizers.Adam(params(0), 1e-3),
        "torch.optim.adam.adam": FunctionalAdam(params(0), 1e-3),
        "torch.optim.adam.adam, capturable": FunctionalAdam(params(0), 1e-3, capturable=True),
        "torch.optim.adam.adam, foreach, capturable": FunctionalAdam(
            params(0), 1e-3, foreach=True, capturable=True
        ),
    }
    grads = [params(seed) for seed in range(1, 5)]
    options = {"cpp_wrapper": True}
    steps = {k: torch.compile(f.step, fullgraph=True, options=options) for k, f in forms.items()}
    for step in steps.values():  # compile and warm up
        for g in grads:
            step(g)
    times = {name: [] for name in steps}
    for _ in range(args.blocks):
        for name, step in steps.items():
            start = time.perf_counter()
            for i in range(args.calls):
                step(grads[i % len(grads)])
            times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    print(f"torch {torch.__version__}, {machine_info()['cpu']}, 1 thread")
    print(f"{args.blocks} alternating blocks of {args.calls} steps; us a step")
    print("| form | min | median |\n|---|---:|---:|")
    for name, values in times.items():
        print(f"| {name} | {min(values):.0f} | {statistics.median(values):.0f} |")


if __name__ == "__main__":
    main()
