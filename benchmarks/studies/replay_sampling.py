"""How the seeds scripts should sample their members' replay buffers: the script's own
`ReplayBuffer.sample` (each member's buffer laid end to end, one `index_select` per column) against
the same storage as one TensorDict of batch size [num_seeds, buffer_size], sampled with a member
index beside the transition index, `storage[members, idx]`.

    python -m benchmarks.studies.replay_sampling          # SAC's columns, N=8, 200k transitions
    python -m benchmarks.studies.replay_sampling --quick  # a small buffer, a few samples

Both ways draw the same indices from the same generator state, so their batches must be equal
(`same_batches`). One intra-op thread, the ways alternated for `rounds` rounds; µs per sample.
Writes benchmarks/results/replay-sampling-<time>.json and .md (or to --out-dir), prints the table.
"""

import argparse
import statistics
import time
from datetime import datetime
from pathlib import Path

import torch
from tensordict import TensorDict

from benchmarks.machine import machine_info
from benchmarks.report import write_result
from benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "sac_continuous_action_seeds"
N_OBS, N_ACT = 17, 6  # HalfCheetah's


def filled_buffer(num_seeds, buffer_size):
    """The script's buffer, full of random transitions, and the same storage as a TensorDict."""
    module = load_script(SCRIPT)
    rb = module.ReplayBuffer(num_seeds, buffer_size, N_OBS, N_ACT, torch.device("cpu"))
    for column in rb.flat.values():
        column.copy_(torch.randn(column.shape))
    rb.size = buffer_size
    storage = {key: column.unflatten(0, (num_seeds, -1)) for key, column in rb.flat.items()}
    return rb, TensorDict(storage, batch_size=[num_seeds, buffer_size])


def per_sample_us(sample, samples):
    for _ in range(max(1, samples // 40)):  # warm-up
        sample()
    start = time.perf_counter()
    for _ in range(samples):
        sample()
    return (time.perf_counter() - start) / samples * 1e6


def measure(num_seeds, buffer_size, batch_size, samples, rounds):
    torch.set_num_threads(1)
    rb, storage = filled_buffer(num_seeds, buffer_size)
    members = torch.arange(num_seeds).unsqueeze(1)

    def tensordict_sample():
        idx = torch.randint(0, storage.shape[1], (num_seeds, batch_size))
        return storage[members, idx]

    torch.manual_seed(0)
    flat = rb.sample(batch_size)
    torch.manual_seed(0)
    indexed = tensordict_sample()
    same = all(torch.equal(flat[key], indexed[key]) for key in flat)
    times = dict(index_select=[], tensordict=[])
    for _ in range(rounds):
        times["index_select"].append(per_sample_us(lambda: rb.sample(batch_size), samples))
        times["tensordict"].append(per_sample_us(tensordict_sample, samples))
    return dict(
        script=SCRIPT,
        num_seeds=num_seeds,
        buffer_size=buffer_size,
        batch_size=batch_size,
        samples=samples,
        same_batches=same,
        us_per_sample=times,
    )


def markdown(result):
    """A row per way: its µs per sample in each round, and its ratio to index_select's median."""
    times = result["us_per_sample"]
    base = statistics.median(times["index_select"])
    lines = ["| way | µs per sample, each round | ratio |", "| --- | --- | --- |"]
    for way, values in times.items():
        rounds = ", ".join(f"{value:.0f}" for value in values)
        lines.append(f"| {way} | {rounds} | {statistics.median(values) / base:.2f}x |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small buffer, a few samples")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        result = measure(num_seeds=2, buffer_size=1000, batch_size=32, samples=50, rounds=1)
    else:
        result = measure(num_seeds=8, buffer_size=200_000, batch_size=256, samples=2000, rounds=2)
    result = dict(machine=machine_info(), **result)
    stem = f"replay-sampling-{datetime.now():%Y%m%d-%H%M%S}"
    paths = write_result(result, args.out_dir, stem, markdown)
    print(markdown(result))
    print(*paths, sep="\n")
    return result


if __name__ == "__main__":
    main()
