"""What CleanRL's TensorBoard scalars cost the `_cpu` scripts: each at its quick budget times
`--scale` with and without `--no-tensorboard`, in turn, `--rounds` times; the median sps of each,
and the mean of the rounds' paired ratios with its 95% interval. Then one more run with TensorBoard
on and its writer's calls timed (benchmarks.studies.writer_timed): the writer's share of the timed
loop, its seconds a step times sps, which two runs' sps (5% apart run to run here) cannot resolve.

    python -m benchmarks.studies.tensorboard_cost --rounds 12 --scale 4 --out FOLDER

Results: benchmarks/results/tensorboard/cost_cpu.json; docs/performance.md, "TensorBoard's cost".
"""

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.machine import machine_info
from benchmarks.registry import ALGOS, VARIANTS
from benchmarks.run import command, execute, parse_summary, result_line, run_one

CPU = next(variant for variant in VARIANTS if variant.name == "cpu")


def writer_share(cmd):
    """`cmd` run once under writer_timed: its writer's seconds and calls, and their share of the
    timed loop."""
    timed = [cmd[0], "-m", "benchmarks.studies.writer_timed", *cmd[1:]]
    proc = execute(timed, None)
    run, writer = parse_summary(timed, proc), result_line(timed, proc, "WRITER")
    return writer | dict(share=writer["seconds"] / run["total_timesteps"] * run["sps"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algos", nargs="+", default=[a.name for a in ALGOS if a.cpu])
    parser.add_argument("--scale", type=int, default=1, help="times the quick budget's steps")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for algo in (a for a in ALGOS if a.name in args.algos):
        base = [*command(algo, CPU, Path("leanrl").resolve(), True, 1), "--threads", "1"]
        steps = base.index("--total-timesteps") + 1
        base[steps] = str(int(base[steps]) * args.scale)
        sps = {"tensorboard": [], "none": []}
        for _ in range(args.rounds):
            sps["tensorboard"].append(run_one(base, None)["sps"])
            sps["none"].append(run_one([*base, "--no-tensorboard"], None)["sps"])
        medians = {kind: statistics.median(values) for kind, values in sps.items()}
        paired = [on / off for on, off in zip(sps["tensorboard"], sps["none"])]
        mean, half = statistics.mean(paired), 0.0
        if len(paired) > 1:  # a normal interval: the rounds' ratios spread about 5% here
            half = 1.96 * statistics.stdev(paired) / len(paired) ** 0.5
        writer = writer_share(base)
        rows.append(dict(script=algo.script(CPU), sps=sps, median=medians, writer=writer))
        rows[-1] |= dict(paired_ratio_mean=mean, paired_ratio_95=[mean - half, mean + half])
        print(
            f"{algo.script(CPU):28} {medians['tensorboard']:10,.0f} {medians['none']:10,.0f}"
            f" {mean:6.3f} ({mean - half:.3f}-{mean + half:.3f}) writer {writer['share']:.2%}",
            flush=True,
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = dict(machine=machine_info(), rounds=args.rounds, scale=args.scale, rows=rows)
        (args.out / "cost_cpu.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
