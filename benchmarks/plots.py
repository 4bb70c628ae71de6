"""PNG plots of a benchmark, next to its JSON and markdown: sps per variant per algorithm (min-max
spread, env-only limit dashed), and each run's return against seconds and against env steps.

    python -m benchmarks.plots runs/<run_name>/summary.json --out curve.png --baseline 1.2

Matplotlib's Agg canvas draws the figures directly: no pyplot, no window, no global state.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from benchmarks.registry import VARIANTS

COLORS = {variant.name: f"C{index}" for index, variant in enumerate(VARIANTS)}
SMOOTHING = 10  # episodes in the trailing mean of a return curve


def sps_bars(table):
    """Per algorithm, in table order: its variants, their median sps, the distances down to the min
    and up to the max (matplotlib's asymmetric error bars), and the algorithm's env-only sps
    (None where unmeasured)."""
    bars = {}
    for r in table:
        algo = bars.setdefault(
            r["algo"],
            {"variants": [], "median": [], "down": [], "up": [], "env_only": r["env_only_sps"]},
        )
        algo["variants"].append(r["variant"])
        algo["median"].append(r["sps_median"])
        algo["down"].append(r["sps_median"] - r["sps_min"])
        algo["up"].append(r["sps_max"] - r["sps_median"])
    return bars


def smooth(values, window=SMOOTHING):
    """The trailing mean of `values` over at most `window` entries, one per entry."""
    return [statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def return_curves(runs, algo, window=SMOOTHING):
    """Per variant of `algo`, in run order, one curve per run that finished an episode."""
    curves = {}
    for run in runs:
        points = run["summary"]["curve"]
        if run["algo"] != algo or not points:
            continue
        steps, seconds, returns = zip(*points)
        curves.setdefault(run["variant"], []).append(
            {
                "steps": list(steps),
                "seconds": list(seconds),
                "returns": smooth(list(returns), window),
            }
        )
    return curves


def draw_sps(ax, algo, bars):
    """One algorithm's labelled sps bars on a log axis (the env-only limit fits beside)."""
    colors = [COLORS.get(variant, "gray") for variant in bars["variants"]]
    drawn = ax.bar(
        bars["variants"], bars["median"], yerr=[bars["down"], bars["up"]], color=colors, capsize=3
    )
    ax.bar_label(drawn, fmt="%.0f", fontsize=7, label_type="center")
    ax.set_yscale("log")
    ax.set_title(algo, fontsize=9)
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    if bars["env_only"] is not None:
        ax.axhline(bars["env_only"], color="black", linestyle="--", linewidth=1)
        ax.annotate(
            f"env only {bars['env_only']:.0f}",
            (0.02, bars["env_only"]),
            xycoords=("axes fraction", "data"),
            fontsize=7,
            va="bottom",
        )
        ax.set_ylim(top=bars["env_only"] * 3)


def sps_figure(table):
    """Sps per variant (median, min-max), a panel per algorithm, env-only limit dashed."""
    all_bars = sps_bars(table)
    figure, axes = panels(len(all_bars), 3.2, 3.6)
    for ax, (algo, bars) in zip(axes, all_bars.items()):
        draw_sps(ax, algo, bars)
    axes[0].set_ylabel("env steps per second (log)")
    return figure


def curves_figure(algo, curves, window=SMOOTHING, baseline=None):
    """`algo`'s return curves (from `return_curves`) against wall-clock seconds and against steps,
    one line per run, one color per variant; `baseline`, if given, a dashed line (e.g. a random
    policy's return)."""
    figure, (by_time, by_steps) = panels(2, 5, sharey=True)
    for variant, runs in curves.items():
        for index, curve in enumerate(runs):
            label = variant if index == 0 else None
            color = COLORS.get(variant, "gray")
            by_time.plot(curve["seconds"], curve["returns"], color=color, label=label, linewidth=1)
            by_steps.plot(curve["steps"], curve["returns"], color=color, label=label, linewidth=1)
    if baseline is not None:
        for ax in (by_time, by_steps):
            ax.axhline(
                baseline,
                color="black",
                linestyle="--",
                linewidth=1,
                label="random policy" if ax is by_steps else None,
            )
    by_time.set(xlabel="wall-clock seconds", ylabel=f"episodic return (mean of last {window})")
    by_steps.set(xlabel="environment steps")
    by_steps.legend(fontsize=8)
    figure.suptitle(f"{algo}: one line per run")
    return figure


def panels(count, width, height=3.8, **kwargs):
    """A figure of `count` panels side by side, `width` by `height` inches each (constrained
    layout, Agg: no pyplot); the figure and its axes."""
    figure = Figure(figsize=(width * count, height), layout="constrained")
    return figure, figure.subplots(1, count, squeeze=False, **kwargs)[0]


def save(figure, path):
    """Render `figure` with the Agg canvas into the PNG file `path`; returns the path."""
    FigureCanvasAgg(figure).print_png(path)
    return path


def write(out_dir, stamp, table, runs):
    """Write `<stamp>-sps.png` and each algorithm's `<stamp>-<algo>-returns.png`; the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [save(sps_figure(table), out_dir / f"{stamp}-sps.png")]
    for algo in dict.fromkeys(r["algo"] for r in table):
        curves = return_curves(runs, algo)
        if curves:
            paths.append(save(curves_figure(algo, curves), out_dir / f"{stamp}-{algo}-returns.png"))
    return paths


def read_summary(path):
    """The summary object in the run's `summary.json` at `path`."""
    summary = json.loads(Path(path).read_text())
    if not isinstance(summary, dict) or not isinstance(summary.get("curve"), list):
        raise ValueError(f"{path} is not a run's summary.json (no curve)")
    return summary


def main(argv=None):
    """Draw the learning curve of one run's summary.json; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.plots", description="the learning curve of one run"
    )
    add = parser.add_argument
    add("summary", type=Path, help="the run's runs/<run_name>/summary.json")
    add("--out", type=Path, required=True, help="the PNG to write")
    add("--baseline", type=float, help="a random policy's return, drawn dashed")
    args = parser.parse_args(argv)
    try:
        summary = read_summary(args.summary)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    run = {"algo": summary["env_id"], "variant": summary["script"], "summary": summary}
    save(
        curves_figure(
            f"{summary['script']} on {summary['env_id']}",
            return_curves([run], summary["env_id"]),
            baseline=args.baseline,
        ),
        args.out,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
