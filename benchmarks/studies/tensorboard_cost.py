"""What CleanRL's TensorBoard scalars cost the `_cpu` scripts: each at its quick budget times
`--scale` with and without `--no-tensorboard`, in turn, `--rounds` times; the median sps of each,
and the mean of the rounds' paired ratios with its 95% interval. Two runs' sps differ by 5-15%
here, more than the writer costs; so one more run turns the writer on and off in turns of 0.1 s of
its loop (benchmarks.studies.writer_timed): the writer's share of the turns it was on in, and the
mean of neighbouring turns' sps ratios (on / off) with its 95% interval.

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


def writer_share(cmd, turn=0.1):
    """`cmd` run once under writer_timed, its writer on and off in turns of `turn` seconds: the
    writer's share of the turns it was on in, and the mean of neighbouring turns' sps ratios (on /
    off) with its 95% interval."""
    timed = [cmd[0], "-m", "benchmarks.studies.writer_timed", "--turn", str(turn), *cmd[1:]]
    proc = execute(timed, None)
    parse_summary(timed, proc)  # the run finished as a run does
    writer = result_line(timed, proc, "WRITER")
    sps = {on: [s / t for kind, s, t in writer["turns"] if kind == on] for on in (True, False)}
    mean, half = paired_mean([on / off for on, off in zip(sps[True], sps[False])])
    share = writer["seconds"] / sum(t for on, _, t in writer["turns"] if on)
    ratios = dict(ratio_mean=mean, ratio_95=[mean - half, mean + half])
    return writer | dict(turns=len(sps[False]), share=share) | ratios


def paired_mean(ratios):
    """The mean of `ratios` and half its normal 95% interval."""
    mean, half = statistics.mean(ratios), 0.0
    if len(ratios) > 1:
        half = 1.96 * statistics.stdev(ratios) / len(ratios) ** 0.5
    return mean, half


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
        mean, half = paired_mean([on / off for on, off in zip(sps["tensorboard"], sps["none"])])
        writer = writer_share(base)
        low, high = writer["ratio_95"]
        rows.append(dict(script=algo.script(CPU), sps=sps, median=medians, writer=writer))
        rows[-1] |= dict(paired_ratio_mean=mean, paired_ratio_95=[mean - half, mean + half])
        print(
            f"{algo.script(CPU):28} {medians['tensorboard']:10,.0f} {medians['none']:10,.0f}"
            f" {mean:6.3f} ({mean - half:.3f}-{mean + half:.3f}) writer {writer['share']:.2%}"
            f" turns {writer['ratio_mean']:.3f} ({low:.3f}-{high:.3f})",
            flush=True,
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = dict(machine=machine_info(), rounds=args.rounds, scale=args.scale, rows=rows)
        (args.out / "cost_cpu.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
