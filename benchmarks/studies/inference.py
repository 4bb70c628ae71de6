"""How much torch.compile and CUDA graphs speed up acting: each optimized twin's acting policy,
eager against compiled, per batch size.

    python -m benchmarks.studies.inference  # every policy, batch 1 8 64 256 1024, three modes
    python -m benchmarks.studies.inference --quick  # a smoke run

Variants: eager; `torch.compile` in each `--modes` mode; on a CPU the CPU script's numpy policy; on
CUDA `CudaGraphModule`, plain and around `torch.compile`. Warm-up (compile, capture) is timed apart
as `setup_s`; then `--rounds` rounds each time one block of calls per variant, the order rotated,
every call timed alone (CUDA events and a sync on a GPU). One static graph per batch size: a
recompile while timing is an error. Checks: every variant's deterministic outputs equal eager's
within |a - b| <= atol + rtol |b| (integer actions: at most 1% may differ), also after the weights
change in place halfway (a policy acting on stale weights fails); a failed check exits 1 after the
results are written to benchmarks/results/inference-<time>.{json,md,png} (or to `--out`).
"""

import math
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

import torch
from tensordict.nn import CudaGraphModule

from benchmarks import cli
from benchmarks.cli import conclude, pick_device, positive_float, positive_int
from benchmarks.machine import machine_info
from benchmarks.policies import SPECS
from benchmarks.processes import note
from benchmarks.report import machine_line, table, write_result
from benchmarks.scripts import load_script

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
CUDA_VARIANTS = ("cudagraphs", "compile+cudagraphs")
FULL = {"batch_sizes": [1, 8, 64, 256, 1024], "modes": list(MODES), "rounds": 10, "block_ms": 40.0}
QUICK = {"batch_sizes": [1, 8], "modes": ["default"], "rounds": 4, "block_ms": 10.0}
INT_MISMATCH = 0.01
COMPILE_WARMUP, GRAPH_WARMUP = 3, 2


@dataclass
class Variant:
    """One way to run a policy, called as the script calls it; `warmup` calls untimed."""

    name: str
    fn: Callable
    warmup: int


def compiled(act, mode, backend, cuda):
    """`torch.compile(act)` in `mode`; under reduce-overhead on CUDA each call starts a new
    CUDA-graph step, so that holding an earlier call's outputs is allowed."""
    fn = torch.compile(act, mode=mode, backend=backend)
    if not (cuda and mode == "reduce-overhead"):
        return fn

    def step(obs):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(obs)

    return step


def numpy_policy(host):
    """The script's numpy policy called as the torch ones are."""

    def act(obs):
        out = host(obs.numpy())
        return (
            tuple(map(torch.from_numpy, out)) if isinstance(out, tuple) else torch.from_numpy(out)
        )

    return act


def make_variants(act, modes, backend, cuda, host=None):
    """Eager, one compiled variant per mode, the script's numpy `host` policy if it has one (on a
    CPU) and, with `cuda`, the two CudaGraphModule variants (tensordict's documented usage:
    `warmup` calls on a side stream, then the capture, then replays into which each call's input
    is copied)."""
    variants = [Variant("eager", act, 1)]
    variants += [
        Variant(f"compile:{mode}", compiled(act, mode, backend, cuda), COMPILE_WARMUP)
        for mode in modes
    ]
    if host is not None:
        variants.append(Variant("numpy", numpy_policy(host), 1))
    if cuda:
        variants.append(
            Variant("cudagraphs", CudaGraphModule(act, warmup=GRAPH_WARMUP), GRAPH_WARMUP + 2)
        )
        graphed = CudaGraphModule(torch.compile(act, backend=backend), warmup=COMPILE_WARMUP)
        variants.append(Variant("compile+cudagraphs", graphed, COMPILE_WARMUP + 2))
    return variants


def sync(cuda):
    """Wait for the GPU (nothing to wait for on a CPU)."""
    if cuda:
        torch.cuda.synchronize()


def warm_up(variant, obs, cuda):
    """Run `variant`'s warm-up calls; their wall time in seconds (compile, capture)."""
    start = time.perf_counter()
    for _ in range(variant.warmup):
        variant.fn(obs)
    sync(cuda)
    return time.perf_counter() - start


def time_block(fn, obs, calls, cuda):
    """Latencies in seconds of `calls` calls of `fn(obs)`, each timed alone."""
    if cuda:
        return cuda_block(fn, obs, calls)
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(obs)
        latencies.append(time.perf_counter() - start)
    return latencies


def cuda_block(fn, obs, calls):
    """Latencies of `calls` calls timed with CUDA events, synchronizing after each."""
    latencies = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(obs)
        end.record()
        end.synchronize()
        latencies.append(start.elapsed_time(end) / 1e3)
    return latencies


def calls_per_block(latency, block_s, min_calls=2, max_calls=5000):
    """How many calls of `latency` s fill `block_s` s, within [min_calls, max_calls]."""
    return max(min_calls, min(max_calls, math.ceil(block_s / max(latency, 1e-9))))


def timed_rounds(variants, obs, rounds, calls, cuda, offset=0):
    """Latencies by variant name over `rounds` rounds of one block per variant."""
    latencies = {v.name: [] for v in variants}
    for r in range(offset, offset + rounds):
        k = r % len(variants)
        for variant in variants[k:] + variants[:k]:
            latencies[variant.name] += time_block(variant.fn, obs, calls, cuda)
    return latencies


def detached(outputs):
    """The outputs cloned to the CPU (a CUDA graph overwrites its outputs at each replay)."""
    return {name: tensor.detach().clone().cpu() for name, tensor in outputs.items()}


def difference(candidate, reference, rtol, atol):
    """How far `candidate` is from `reference` (dicts of tensors by name)."""
    worst, ok = 0.0, True
    for name, ref in reference.items():
        got = candidate[name]
        if ref.is_floating_point():
            err = (got - ref).abs()
            ok &= bool((err <= atol + rtol * ref.abs()).all())
            worst = max(worst, float(err.max()))
        else:
            mismatched = float((got != ref).double().mean())
            ok &= mismatched <= INT_MISMATCH
            worst = max(worst, mismatched)
    return ok, worst


def outputs(spec, fn, obs):
    """`spec`'s deterministic outputs of one call `fn(obs)`."""
    return detached(spec.deterministic(fn(obs)))


def check_equal(spec, variants, obs, rtol, atol):
    """Each variant's outputs against eager's on the current weights."""
    reference = outputs(spec, variants[0].fn, obs)
    checks = {}
    for variant in variants:
        got = outputs(spec, variant.fn, obs)
        ok, diff = difference(got, reference, rtol, atol)
        checks[variant.name] = {"outputs": got, "ok": ok, "diff": diff}
    return checks


def check_after_update(spec, source, variants, obs, before, rtol, atol):
    """Change `source`'s weights in place, then require each variant to match eager on the new
    weights and to differ from its output `before` the change. Returns {name: {"ok", "diff",
    "changed"}}."""
    spec.perturb(source)
    after = check_equal(spec, variants, obs, rtol, atol)
    checks = {}
    for name, check in after.items():
        changed = not difference(check["outputs"], before[name]["outputs"], rtol, atol)[0]
        checks[name] = {"ok": check["ok"] and changed, "diff": check["diff"], "changed": changed}
    return checks


def latency_stats(latencies, batch):
    """Median, p10 and p90 latency in µs, calls/s and samples/s."""
    deciles = statistics.quantiles(latencies, n=10, method="inclusive")
    calls_s = len(latencies) / sum(latencies)
    stats = dict(calls=len(latencies), median_us=statistics.median(latencies) * 1e6)
    stats |= dict(p10_us=deciles[0] * 1e6, p90_us=deciles[-1] * 1e6)
    return stats | dict(calls_per_s=calls_s, samples_per_s=calls_s * batch)


def speedup_pct(eager_median, median):
    """The speed-up of a variant over eager in %, from median latencies."""
    return 100.0 * (eager_median / median - 1.0)


def bench_unit(spec, script, batch, args, device):
    """Benchmark every variant of `spec`'s policy at one batch size; returns one row per variant."""
    # static graphs: each batch size compiles afresh, as a script with fixed num_envs does
    torch._dynamo.reset()
    torch.manual_seed(args.seed)
    cuda = device.type == "cuda"
    built = spec.build(script, device, cpu_script(spec, args.scripts_dir, device))
    obs = spec.observe(batch, device, torch.Generator().manual_seed(args.seed))
    variants = make_variants(built.act, args.modes, args.backend, cuda, built.host)
    with torch.no_grad():
        setup = {v.name: warm_up(v, obs, cuda) for v in variants}
        before = check_equal(spec, variants, obs, args.rtol, args.atol)
        once = statistics.median(time_block(built.act, obs, 5, cuda))
        calls, half = calls_per_block(once, args.block_ms / 1e3), args.rounds // 2
        tolerance = (args.rtol, args.atol)
        with torch.compiler.set_stance("fail_on_recompile"):
            latencies = timed_rounds(variants, obs, half, calls, cuda)
            after = check_after_update(spec, built.source, variants, obs, before, *tolerance)
            rest = timed_rounds(variants, obs, args.rounds - half, calls, cuda, offset=half)
    rows = []
    for v in variants:
        rows.append(
            dict(policy=spec.name, batch=batch, variant=v.name, threads=torch.get_num_threads())
        )
        rows[-1] |= latency_stats(latencies[v.name] + rest[v.name], batch)
        equal = {k: before[v.name][k] for k in ("ok", "diff")}
        rows[-1] |= dict(setup_s=setup[v.name], check_equal=equal, check_after_update=after[v.name])
    for row in rows:
        row["speedup_pct"] = speedup_pct(rows[0]["median_us"], row["median_us"])
    return rows


def available(names, scripts_dir):
    """The specs among `names` whose script exists, and a skip note for each one missing."""
    ready, skipped = [], []
    for name in names:
        spec = SPECS[name]
        path = Path(scripts_dir) / f"{spec.script}.py"
        if path.exists():
            ready.append(spec)
        else:
            skipped.append({"policy": name, "reason": f"{path} does not exist"})
    return ready, skipped


def cpu_script(spec, scripts_dir, device):
    """The module of `spec`'s CPU script, whose numpy policy is timed beside the twin's on a CPU."""
    found = spec.cpu_script and (Path(scripts_dir) / f"{spec.cpu_script}.py").exists()
    return load_script(spec.cpu_script, scripts_dir) if device.type == "cpu" and found else None


def run_policy(spec, args, device):
    """Every batch size of one policy, with the script's intra-op thread count on a CPU."""
    script = load_script(spec.script, args.scripts_dir)
    threads = torch.get_num_threads()
    if device.type == "cpu" and spec.threads:
        torch.set_num_threads(spec.threads)
    try:
        rows = []
        for batch in args.batch_sizes:
            note(f"{spec.name} batch {batch}")
            rows += bench_unit(spec, script, batch, args, device)
        return rows
    finally:
        torch.set_num_threads(threads)


def failed_checks(rows):
    """One line per variant whose outputs differed from eager's or that kept its stale weights."""
    lines = []
    for row in rows:
        where = f"{row['policy']} batch {row['batch']} {row['variant']}"
        if not row["check_equal"]["ok"]:
            lines.append(f"{where}: outputs differ from eager by {row['check_equal']['diff']:.3g}")
        if not row["check_after_update"]["ok"]:
            why = stale_reason(row["check_after_update"])
            lines.append(f"{where}: after an in-place weight update, {why}")
    return lines


def stale_reason(check):
    """Why a check after a weight update failed."""
    if not check["changed"]:
        return "the output did not change (stale weights)"
    return f"the output differs from eager on the new weights by {check['diff']:.3g}"


def check_mark(row):
    """A short mark for the table: ok, or what failed."""
    if not row["check_equal"]["ok"]:
        return "DIFFERS"
    return "ok" if row["check_after_update"]["ok"] else "STALE"


def summary_table(rows):
    """Per policy and batch size: eager's median latency, each variant's speed-up."""
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != "eager"]
    units = {}
    for r in rows:
        units.setdefault((r["policy"], r["batch"]), {})[r["variant"]] = r
    lines = []
    for (policy, batch), unit in units.items():
        eager = unit["eager"]
        lines.append([policy, str(batch), f"{eager['median_us']:.0f} ({eager['p10_us']:.0f}-"])
        lines[-1][-1] += f"{eager['p90_us']:.0f})"
        lines[-1] += [f"{unit[v]['speedup_pct']:+.0f}%" if v in unit else "-" for v in variants]
    header = ["policy", "batch", "eager median µs (p10-p90)", *variants]
    return table(header, lines, "l" + "r" * (len(header) - 1))


def full_table(rows):
    """Per policy, batch size and variant: latency, throughput, speed-up, setup, checks."""
    lines = [
        f"{r['policy']} | {r['batch']} | {r['variant']} | {r['median_us']:.0f} | {r['p10_us']:.0f}"
        f"-{r['p90_us']:.0f} | {r['calls_per_s']:.0f} | {r['samples_per_s']:.0f} | "
        + ("-" if r["variant"] == "eager" else f"{r['speedup_pct']:+.0f}%")
        + f" | {r['setup_s']:.1f} | {check_mark(r)}"
        for r in rows
    ]
    header = "policy | batch | variant | median µs | p10-p90 µs | calls/s | samples/s | vs eager"
    return table(f"{header} | setup s | check", lines, "lrlrrrrrrl")


def markdown(result):
    """The machine, device and settings, the speed-up summary, then the full table."""
    settings = result["settings"]
    tolerance = f"|a - b| <= {settings['atol']:g} + {settings['rtol']:g} |b|"
    lines = [
        machine_line(result["machine"]),
        f"Device: {result['device']}; {settings['rounds']} alternating rounds; started "
        f"{result['started']}",
        "",
        "Speed-up of each variant over eager (median latency per call; + is faster):",
        "",
        *summary_table(result["rows"]),
        "",
        *full_table(result["rows"]),
        "",
        f"Checks: outputs equal eager's within {tolerance} and follow an in-place weight update "
        "(STALE: they did not; DIFFERS: they were not equal).",
    ]
    if result["skipped"]:
        lines.append(
            "Skipped: "
            + "; ".join(f"{s['policy']}: {s['reason']}" for s in result["skipped"])
            + "."
        )
    return "\n".join(lines) + "\n"


def plot(result, path):
    """Speed-up against batch size, one panel per policy, one line per compiled variant."""
    from benchmarks.plots import panels, save

    policies = list(dict.fromkeys(r["policy"] for r in result["rows"]))
    fig, axes = panels(max(1, len(policies)), 4.5, 3.5)
    for ax, policy in zip(axes, policies):
        rows = [r for r in result["rows"] if r["policy"] == policy and r["variant"] != "eager"]
        for variant in dict.fromkeys(r["variant"] for r in rows):
            points = [(r["batch"], r["speedup_pct"]) for r in rows if r["variant"] == variant]
            ax.plot(*zip(*points), marker="o", label=variant)
        ax.axhline(0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        batches = sorted({r["batch"] for r in rows})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set(title=policy, xlabel="batch size", ylabel="speed-up over eager (%)")
        ax.legend(fontsize=7)
    fig.suptitle(f"acting speed-up, {result['device']}, {result['machine']['cpu']}", fontsize=9)
    save(fig, path)


def parse_args(argv):
    """The command line; bad input exits with status 2 and a message naming the flag."""
    parser, add = cli.parser(
        "benchmarks.studies.inference", __doc__, "--backend --device --seed --out --scripts-dir"
    )
    add("--policies", nargs="+", choices=list(SPECS), default=list(SPECS))
    add("--batch-sizes", nargs="+", type=positive_int, help="default: 1 8 64 256 1024")
    add("--modes", nargs="*", choices=MODES, help="torch.compile modes (default: all three)")
    add("--rounds", type=positive_int, help="rounds, the weights change halfway (default: 10)")
    add("--block-ms", type=positive_float, help="one block's length (default: 40)")
    add("--rtol", type=positive_float, default=1e-3, help="relative tolerance of the checks")
    add("--atol", type=positive_float, default=1e-4, help="absolute tolerance of the checks")
    add("--quick", action="store_true", help=f"smoke-run defaults: {QUICK}")
    args = cli.parse(parser, argv, QUICK, FULL)
    if args.backend != "inductor" and set(args.modes) - {"default"}:
        parser.error(
            f"--modes {' '.join(args.modes)}: modes other than default need --backend inductor"
        )
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the weights change halfway)")
    return args


def main(argv=None):
    """Run the benchmark, print the table, write the results; exit status 1 if a check failed."""
    args = parse_args(argv)
    device = pick_device(args.device)
    specs, skipped = available(args.policies, args.scripts_dir)
    for skip in skipped:
        note(f"skipping {skip['policy']}: {skip['reason']}")
    if device.type != "cuda":
        skipped += [
            {"policy": "all", "reason": f"{name} needs a CUDA device"} for name in CUDA_VARIANTS
        ]
    started = datetime.now().isoformat(timespec="seconds")
    rows = [row for spec in specs for row in run_policy(spec, args, device)]
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "scripts_dir")}
    result = {
        "machine": machine_info(),
        "device": str(device),
        "started": started,
        "settings": settings,
        "rows": rows,
        "skipped": skipped,
        "notes": {s.name: s.note for s in specs},
    }
    return conclude(
        markdown(result),
        write_result(result, args.out, f"inference-{datetime.now():%Y%m%d-%H%M%S}", markdown, plot),
        failed_checks(rows),
    )


if __name__ == "__main__":
    sys.exit(main())
