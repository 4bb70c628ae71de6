"""Turn the runs' SUMMARY objects into a table (median sps, spread, ratio to eager, the env-only
limit), compare returns (Mann-Whitney) and write the results."""

import json
import statistics

from scipy import stats


def rows(runs, env_limits, update_limits=None):
    """One row per (algorithm, variant), in the order the runs came, with sps statistics, the ratio
    of each variant's median sps to the median of its algorithm's eager variant, the algorithm's
    env-only sps (from `env_limits`, by algorithm; None where it has none) and, for a `_cpu`
    script, its update limit (from `update_limits`, by algorithm) at the threads its runs ended on,
    and the median of its runs' sps over that limit."""
    groups = {}
    for run in runs:
        groups.setdefault((run["algo"], run["variant"]), []).append(run)
    table = [row(algo, variant, group) for (algo, variant), group in groups.items()]
    eager = {r["algo"]: r["sps_median"] for r in table if r["variant"] == "eager"}
    for r, group in zip(table, groups.values()):
        r["vs_eager"] = r["sps_median"] / eager[r["algo"]] if r["algo"] in eager else None
        r["env_only_sps"] = env_limits[r["algo"]]["sps"] if r["algo"] in env_limits else None
        limits = [update_limit(run, (update_limits or {}).get(r["algo"])) for run in group]
        known = None not in limits
        r["update_limit_sps"] = statistics.median(limits) if known else None
        r["of_update_limit"] = (
            statistics.median(run["summary"]["sps"] / limit for run, limit in zip(group, limits))
            if known
            else None
        )
    return table


def update_limit(run, limits):
    """The update limit (sps) of a `_cpu` script's `run` at the threads it ended on, in its
    dtype, from its algorithm's `limits` (benchmarks.update_limit's); None for another script."""
    if limits is None or run["summary"].get("script") != limits["script"]:
        return None
    dtype = "bfloat16" if "--bf16" in run["flags"] else "float32"
    by_threads = limits["limits"].get(dtype, {})
    return by_threads.get(str(run["summary"].get("threads")), {}).get("sps")


def row(algo, variant, runs):
    """The statistics of one variant's `runs`: sps median, min and max, mean return (None if no run
    had one)."""
    summaries = [run["summary"] for run in runs]
    sps = [s["sps"] for s in summaries]
    returns = [s["return_mean"] for s in summaries if s["return_mean"] is not None]
    return {
        "algo": algo,
        "variant": variant,
        "runs": len(summaries),
        "sps_median": statistics.median(sps),
        "sps_min": min(sps),
        "sps_max": max(sps),
        "return_mean": statistics.fmean(returns) if returns else None,
    }


def machine_line(machine):
    """The machine in one line, to sit above the figures it produced."""
    versions = ", ".join(
        f"{name} {version}" for name, version in machine["versions"].items() if version
    )
    gpu = machine["gpu"] or "none"
    return f"Machine: {machine['cpu']}, {machine['cores']} cores, GPU: {gpu}; {versions}"


def table(header, rows, align):
    """A markdown table's lines: `header`, then `rows`, each a list of cells or a string of cells
    joined by " | "; `align` has an l (left) or r (right) per column."""
    rule = "|" + "".join("---:|" if side == "r" else "---|" for side in align)
    return [
        rule if r is rule else f"| {r if isinstance(r, str) else ' | '.join(r)} |"
        for r in [header, rule, *rows]
    ]


def optional(value, spec, suffix=""):
    """`value` formatted with `spec` and `suffix`, or "n/a" for None."""
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def markdown(table_rows, machine, settings):
    """The table in markdown, headed by the machine and the settings (budget, repeats, seeds, time)
    of the benchmark."""
    seeds = " ".join(map(str, settings["seeds"]))
    lines = [
        machine_line(machine),
        f"Budget: {settings['budget']}, {settings['repeats']} repeats per variant (seeds {seeds}), "
        f"started {settings['started']}",
        "",
    ]
    # the update limit's columns only where the run measured it (a --quick run on a CPU)
    limits = any(r.get("update_limit_sps") is not None for r in table_rows)
    names = ["algo", "variant", "sps median", "sps min-max", "vs eager", "env-only sps"]
    names += ["update limit sps", "of limit"] * limits + ["return mean", "runs"]
    rows = []
    for r in table_rows:
        cells = [r["algo"], r["variant"], f"{r['sps_median']:.0f}"]
        cells += [f"{r['sps_min']:.0f}-{r['sps_max']:.0f}", optional(r["vs_eager"], ".2f", "x")]
        cells += [optional(r["env_only_sps"], ".0f")]
        if limits:
            cells += [optional(r["update_limit_sps"], ".0f"), optional(r["of_update_limit"], ".0%")]
        rows.append(" | ".join([*cells, optional(r["return_mean"], ".1f"), str(r["runs"])]))
    lines += table(" | ".join(names), rows, "ll" + "r" * (len(names) - 2))
    return "\n".join(lines) + "\n"


def write(out_dir, stamp, document, table_md):
    """Write `<stamp>.json` (the whole `document`) and `<stamp>.md` (the table) into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stamp}.json", out_dir / f"{stamp}.md"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    md_path.write_text(table_md)
    return json_path, md_path


def write_result(result, out_dir, stem, markdown, plot=None):
    """Write a benchmark's `result` as `<stem>.json`, its `markdown(result)` as `<stem>.md` and,
    with `plot`, its figure `plot(result, path)` as `<stem>.png` into `out_dir`; returns the
    paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(markdown(result))
    if plot is not None:
        paths.append(out_dir / f"{stem}.png")
        plot(result, paths[2])
    return paths


def mann_whitney(a, b):
    """Mann-Whitney's U of `a` against `b` and its two-sided p-value (scipy's: exact for small
    samples without ties, else from the normal approximation)."""
    test = stats.mannwhitneyu(a, b, alternative="two-sided")
    return float(test.statistic), float(test.pvalue)
