"""Time to solve: the wall seconds from a script's launch until the mean return of its last 20
episodes first reaches the task's threshold, compile included; the env steps there, the fraction
of seeds that solved, medians over the seeds. The variants run in turn, seed by seed, one process
at a time.

    python -m benchmarks.time_to_solve --variants pqn_cpu "pqn_cpu --threads 1"
    python -m benchmarks.time_to_solve --variants pqn_cpu --cleanrl ~/cleanrl --seeds 10
    python -m benchmarks.time_to_solve --env-id Acrobot-v1 --variants pqn_cpu --cache cold warm
    python -m benchmarks.time_to_solve --device cuda --seeds 1 --variants \
        "dqn_seeds --tensor-envs --compile --cudagraphs --num-seeds 1024"

A variant is a script of leanrl/ and its flags, as one string; `--env-id`, `--seed` and
`--run-name` are the benchmark's. With `--cleanrl DIR` (a CleanRL checkout, fe8d8a0), CleanRL's
script of each variant's algorithm runs first in every round at its defaults, from the patched copy
of benchmarks/studies/cleanrl.py, and again with each string of `--cleanrl-flags` (ours are compared
with its defaults).

Seconds count from the launch, taken just before the process starts, so that the interpreter, the
imports and compilation count, to the wall-clock time at which the run logged the episode that
solved it. Our scripts log each episode with its time in their TensorBoard events
(`charts/episodic_return`, written once a second, each event stamped when it was logged); CleanRL's
print `global_step=..., episodic_return=...` per episode, stamped here as the line arrives
(unbuffered). A run is killed once it has solved (a `_seeds` script: once every member has);
what it would have done next is not measured. A run that ends or passes `--timeout` first is
unsolved: its seconds count as infinite in the median.

Inductor's cache: `warm` runs share one cache folder, filled by a first, uncounted run of each
variant (or `--warm-dir`, used as it is); `cold` gives each run an empty one
(TORCHINDUCTOR_CACHE_DIR). `--device cpu` hides the GPUs from every run. The runs inherit the
environment (OMP_NUM_THREADS included). Writes `time_to_solve-<time>.{json,md}` to `--out-dir`;
exit status 1 if a run failed, 2 for bad input.

`--merge A.json B.json ...` runs nothing: it joins earlier results of the same task, machine and
settings, other seeds each (`--first-seed`), into one result with its rows computed again. Their
timeouts may differ where no run took longer than the shortest, which the result keeps.
"""

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from benchmarks import cli
from benchmarks.learning import algorithm
from benchmarks.machine import machine_info
from benchmarks.processes import die_with_parent, kill_tree, note
from benchmarks.report import machine_line, optional, table, write_result
from benchmarks.run import BenchmarkError, failure
from benchmarks.studies.cleanrl import cleanrl_copy

# the return at which a task counts as solved: gymnasium's reward_threshold where it has one;
# Hopper's registered 3,800 is beyond what CleanRL's scripts reach at 1M steps, and Walker2d has
# none: a round bar near CleanRL's published 1M-step returns stands in for each (time-to-solve.md)
THRESHOLDS = {"CartPole-v1": 475, "Acrobot-v1": -100, "MountainCar-v0": -110, "Pendulum-v1": -200}
THRESHOLDS |= {"InvertedDoublePendulum-v5": 9100, "HalfCheetah-v5": 4800}
THRESHOLDS |= {"Hopper-v5": 3000, "Walker2d-v5": 3000}
BENCHMARK_FLAGS = ("--env-id", "--seed", "--run-name", "--no-tensorboard")
POLL_SECONDS = 0.2
RETURN_TAG = "charts/episodic_return"
PRINTED = re.compile(r"global_step=(\d+), episodic_return=\[?([-+\d.eE]+)")
CACHES = ("warm", "cold")


def solve_point(episodes, threshold, window):
    """The first (seconds, step) at which the mean return of the last `window` episodes of
    `episodes` ([(seconds, step, return)], in the order they ended) reaches `threshold`, or None;
    fewer than `window` episodes never solve."""
    returns = [r for _, _, r in episodes]
    total = sum(returns[:window])
    for end in range(window, len(returns) + 1):
        if end > window:
            total += returns[end - 1] - returns[end - window - 1]
        if total / window >= threshold:
            seconds, step, _ = episodes[end - 1]
            return seconds, step
    return None


class EventEpisodes:
    """The episodes that our runs in `folder` log to TensorBoard, read as the events are written
    (TensorBoard's loader follows each file; a record written in part waits for the rest):
    `read(ended)` returns {member: [(seconds since `launched`, step, return)]}, a member per event
    file (a `_seeds` script writes one per member); `ended` (the run has ended, its events are all
    in the files) changes nothing here."""

    def __init__(self, folder, launched):
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto.event_pb2 import Event

        self.folder, self.launched = Path(folder), launched
        self.Loader, self.Event = RawEventFileLoader, Event
        self.loaders, self.episodes = {}, {}

    def read(self, ended=False):
        for path in sorted(self.folder.glob("runs/**/events.out.tfevents.*")):
            member = str(path.parent.relative_to(self.folder))
            loader = self.loaders.setdefault(path, self.Loader(str(path)))
            episodes = self.episodes.setdefault(member, [])
            for event in map(self.Event.FromString, loader.Load()):
                for value in event.summary.value:
                    if value.tag == RETURN_TAG:
                        episodes.append(
                            (event.wall_time - self.launched, event.step, value.simple_value)
                        )
        return self.episodes


class PrintedEpisodes:
    """The episodes a CleanRL script prints on `stream` (its stdout), each stamped when its line
    arrives: `read(ended)` returns {"cleanrl": [(seconds since `launched`, step, return)]}, once the
    run has `ended` with the lines that were still in the pipe."""

    def __init__(self, stream, launched):
        self.launched, self.episodes = launched, {"cleanrl": []}
        self.thread = threading.Thread(target=self.follow, args=(stream,), daemon=True)
        self.thread.start()

    def follow(self, stream):
        for line in stream:
            found = PRINTED.match(line)
            if found:
                seconds = time.time() - self.launched
                self.episodes["cleanrl"].append((seconds, int(found[1]), float(found[2])))

    def read(self, ended=False):
        if ended:  # the lines still in the pipe
            self.thread.join(timeout=30)
        return {member: list(episodes) for member, episodes in self.episodes.items()}


def watch(proc, reader, threshold, window, timeout, launched):
    """Follow a started run until every member has solved (then kill it), it ends, or it passes
    `timeout` seconds (then kill it): its members' solve points (None: unsolved), the exit status
    (None: killed) and how long it ran."""
    while True:
        ended = proc.poll() is not None
        solved = {
            member: solve_point(episodes, threshold, window)
            for member, episodes in reader.read(ended).items()
        }
        done = solved and all(solved.values())
        if ended or done or time.time() - launched > timeout:
            break
        time.sleep(POLL_SECONDS)
    if not ended:
        kill_tree(proc.pid)
    status = proc.wait(timeout=30)
    return solved, status if ended else None, time.time() - launched


def start(cmd, folder, env, printing):
    """Start `cmd` in `folder` (its output to output.txt there, or stdout to a pipe where it prints
    its episodes), in a session of its own that dies with this process; returns the process and
    its launch time."""
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = dict(start_new_session=True, preexec_fn=die_with_parent, text=True)
    with open(folder / "output.txt", "w") as output:  # the process keeps its own copy
        stdout = subprocess.PIPE if printing else output
        launched = time.time()
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=stdout, stderr=output, **kwargs)
    return proc, launched


def measure(variant, seed, cache, settings, folder):
    """One run of `variant` (a dict: label, command, cleanrl) from `seed`: {member: solve point},
    its status and seconds, or a BenchmarkError for a run that failed."""
    cmd = [*variant["command"], "--env-id", settings["env_id"], "--seed", str(seed)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=str(cache))
    if settings["device"] == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if variant["cleanrl"]:
        env["PYTHONPATH"] = str(settings["cleanrl_copy"])  # its cleanrl_utils
    proc, launched = start(cmd, folder, env, variant["cleanrl"])
    reader = (
        PrintedEpisodes(proc.stdout, launched)
        if variant["cleanrl"]
        else EventEpisodes(folder, launched)
    )
    threshold, window, timeout = settings["threshold"], settings["window"], settings["timeout"]
    solved, status, seconds = watch(proc, reader, threshold, window, timeout, launched)
    if status not in (0, None):
        raise failure(cmd, f"exited with status {status}", (folder / "output.txt").read_text())
    return dict(members=solved, status=status, run_seconds=seconds)


def summarize(label, cache, runs):
    """A row: the fraction of members solved, the median seconds and steps at the solve point (an
    unsolved member counts as infinite), their range, and where a run has several members, the
    median over runs of the seconds until all of its members had solved."""
    points = [point for run in runs for point in run["members"].values()]
    seconds = [p[0] if p else float("inf") for p in points]
    steps = [p[1] if p else float("inf") for p in points]
    solved = [s for s in seconds if s != float("inf")]
    row = dict(variant=label, cache=cache, runs=len(runs), members=len(points))
    row |= dict(solved=len(solved) / max(1, len(points)))
    row |= dict(seconds_median=finite(statistics.median(seconds)) if points else None)
    row |= dict(seconds_min=min(solved, default=None), seconds_max=max(solved, default=None))
    row["steps_median"] = finite(statistics.median(steps)) if points else None
    if any(len(run["members"]) > 1 for run in runs):
        every = [all_solved(run) for run in runs]
        row["all_members_median"] = finite(statistics.median(every))
    return row


def all_solved(run):
    """The seconds until every member of a run had solved (infinite if one did not)."""
    points = run["members"].values()
    return max((p[0] if p else float("inf") for p in points), default=float("inf"))


def finite(value):
    return None if value == float("inf") else value


def rows(results, variants):
    """One row per variant and cache in the order they ran, and each row's median seconds over
    the median of CleanRL's row of its algorithm (same cache)."""
    table_rows = [
        summarize(v["label"], cache, results[(v["label"], cache)])
        for v in variants
        for cache in CACHES
        if (v["label"], cache) in results
    ]
    by_label = {v["label"]: v for v in variants}
    cleanrl = {
        (by_label[r["variant"]]["algo"], r["cache"]): r["seconds_median"]
        for r in table_rows
        if by_label[r["variant"]].get("reference")
    }
    for r in table_rows:
        reference = cleanrl.get((by_label[r["variant"]]["algo"], r["cache"]))
        mine = r["seconds_median"]
        r["vs_cleanrl"] = reference / mine if reference and mine else None
    return table_rows


def markdown(result):
    s = result["settings"]
    lines = [
        machine_line(result["machine"]),
        f"{s['env_id']}: solved when the mean return of the last {s['window']} episodes reaches "
        f"{s['threshold']:g}; seeds {s['seeds'][0]}-{s['seeds'][-1]}, device {s['device']}, "
        f"timeout {s['timeout']:g} s, started {s['started']}, load average {s['load'][0]:.1f} at "
        f"the start, {s['load'][1]:.1f} at the end. Seconds from launch, compile included.",
        "",
    ]
    seeds_rows = any("all_members_median" in r for r in result["rows"])  # a `_seeds` script's
    body = []
    for r in result["rows"]:
        span = "n/a"
        if r["seconds_min"] is not None:
            span = f"{r['seconds_min']:.1f}-{r['seconds_max']:.1f}"
        cells = [f"`{r['variant']}`", r["cache"], f"{r['solved']:.0%} of {r['members']}"]
        cells += [optional(r["seconds_median"], ".1f"), span, optional(r["steps_median"], ",.0f")]
        cells += [optional(r["vs_cleanrl"], ".2f", "x")]
        cells += [optional(r.get("all_members_median"), ".1f")] if seeds_rows else []
        body.append(cells)
    header = "variant | cache | solved | median s | min-max s | median steps | CleanRL's s / ours"
    header += " | all members s" if seeds_rows else ""
    lines += table(header, body, "llrrrrr" + ("r" if seeds_rows else ""))
    return "\n".join(lines) + "\n"


def variant_of(text, scripts_dir, parser):
    """A `--variants` string as a dict: its label, command and algorithm; bad ones exit 2."""
    words = shlex.split(text)
    if not words or not (scripts_dir / f"{words[0]}.py").is_file():
        parser.error(f"--variants {text!r}: the first word must name a script of {scripts_dir}")
    taken = [w for w in words[1:] if w.split("=")[0] in BENCHMARK_FLAGS]
    if taken:
        parser.error(f"--variants {text!r}: {taken[0]} is the benchmark's to set")
    command = [sys.executable, str(scripts_dir / f"{words[0]}.py"), *words[1:]]
    return dict(label=text, command=command, algo=algorithm(words[0]), cleanrl=False)


def cleanrl_variants(variants, checkout, copy, flag_sets=()):
    """CleanRL's script of each algorithm among `variants` that it has, at its defaults and then
    with each string of flags of `flag_sets`; the first is the one ours are compared with."""
    found = []
    for algo in dict.fromkeys(v["algo"] for v in variants):
        if not (Path(checkout) / "cleanrl" / f"{algo}.py").is_file():
            note(f"CleanRL has no {algo}.py: no CleanRL row for it")
            continue
        script = [sys.executable, str(Path(copy) / "cleanrl" / f"{algo}.py")]
        for flags in ["", *flag_sets]:
            label = " ".join([f"CleanRL {algo}.py", flags]).strip()
            command = [*script, *shlex.split(flags)]
            found.append(dict(label=label, command=command, algo=algo, cleanrl=True))
            found[-1]["reference"] = not flags
    return found


def labelled(label):
    """The variant of a stored result's `label`: its algorithm, and for CleanRL's script whether
    it is the row ours are compared with (as `variant_of` and `cleanrl_variants` made them)."""
    words = label.split()
    if words[0] == "CleanRL":
        return dict(label=label, algo=words[1].removesuffix(".py"), reference=len(words) == 2)
    return dict(label=label, algo=algorithm(words[0]))


def comparable(paths, made):
    """The results at `paths`, read, their seeds and their shortest timeout. Results of another
    task, machine or setting than the first, that share a seed, or with a run longer than the
    shortest timeout, exit 2."""
    parts = []
    for path in paths:
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            made.error(f"--merge {path}: {error}")
    same, first = ("env_id", "threshold", "window", "device"), parts[0]
    timeout = min(part["settings"]["timeout"] for part in parts)
    for path, part in zip(paths, parts):
        differs = [key for key in same if part["settings"][key] != first["settings"][key]]
        differs += ["machine"] if part["machine"] != first["machine"] else []
        if differs:
            made.error(f"--merge {path}: its {differs[0]} differs from that of {paths[0]}")
        seconds = [run["run_seconds"] for runs in part["runs"].values() for run in runs]
        if part["settings"]["timeout"] > timeout and max(seconds, default=0) > timeout:
            made.error(f"--merge {path}: a run took longer than another's timeout, {timeout:g} s")
    seeds = [seed for part in parts for seed in part["settings"]["seeds"]]
    if len(set(seeds)) < len(seeds):
        made.error("--merge: a seed is in two of the results")
    return parts, sorted(seeds), timeout


def merged(paths, made):
    """One result of the results at `paths` (`comparable`): their runs joined per variant and
    cache, the seeds listed, the shortest timeout kept, the rows computed again."""
    parts, seeds, timeout = comparable(paths, made)
    results = {}
    for part in parts:
        for key, runs in part["runs"].items():
            label, cache = key.removesuffix(")").rsplit(" (", 1)
            results.setdefault((label, cache), []).extend(runs)
    settings = parts[0]["settings"] | dict(seeds=seeds, timeout=timeout)
    settings["load"] = [parts[0]["settings"]["load"][0], parts[-1]["settings"]["load"][1]]
    settings["parts"] = [{k: p["settings"][k] for k in ("started", "seeds", "load")} for p in parts]
    runs = {f"{label} ({cache})": value for (label, cache), value in results.items()}
    result = dict(machine=parts[0]["machine"], settings=settings, runs=runs)
    variants = [labelled(label) for label in dict.fromkeys(label for label, _ in results)]
    result["rows"] = rows(results, variants)
    return result


def parse_args(argv):
    common = "--device --out-dir --scripts-dir"
    made, add = cli.parser("benchmarks.time_to_solve", __doc__, common, one_line=True)
    add("--variants", nargs="+", help="a script and its flags, one string each")
    add("--env-id", default="CartPole-v1")
    add("--threshold", type=float, help="the return that solves (default: the env's, THRESHOLDS)")
    add("--window", type=cli.positive_int, default=20, help="episodes in the mean")
    add("--seeds", type=cli.positive_int, default=10, help="seeds per variant")
    add("--first-seed", type=int, default=1)
    add("--cache", nargs="+", choices=CACHES, default=["warm"], help="inductor's cache")
    add("--timeout", type=cli.positive_float, default=600, help="seconds a run may take")
    add("--cleanrl", type=Path, help="a CleanRL checkout: its script beside ours")
    flags = "CleanRL's script again with these flags, one string a row (with --cleanrl)"
    add("--cleanrl-flags", nargs="+", default=[], help=flags)
    add("--warm-dir", type=Path, help="the warm cache's folder, used as it is (default: a new one)")
    add("--merge", nargs="+", type=Path, help="earlier results to join, instead of --variants")
    args = cli.parse(made, argv)
    if bool(args.variants) == bool(args.merge):
        made.error("give either --variants or --merge")
    if args.merge:
        args.result = merged(args.merge, made)
        return args
    if args.threshold is None:
        if args.env_id not in THRESHOLDS:
            made.error(f"--env-id {args.env_id}: no known threshold, give --threshold")
        args.threshold = THRESHOLDS[args.env_id]
    if args.cleanrl and not (args.cleanrl / "cleanrl").is_dir():
        made.error(f"--cleanrl {args.cleanrl}: not a CleanRL checkout (no cleanrl/ folder)")
    if args.cleanrl_flags and not args.cleanrl:
        made.error("--cleanrl-flags: CleanRL's flags need --cleanrl")
    args.variants = [variant_of(text, args.scripts_dir, made) for text in args.variants]
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        stem = f"time_to_solve-{datetime.now():%Y%m%d-%H%M%S}"
        paths = write_result(args.result, args.out_dir, stem, markdown)
        return cli.conclude(markdown(args.result), paths)
    started = datetime.now()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    settings = dict(env_id=args.env_id, threshold=args.threshold, window=args.window)
    settings |= dict(device=cli.pick_device(args.device).type, timeout=args.timeout, seeds=seeds)
    load = os.getloadavg()[0]
    results = {}
    with tempfile.TemporaryDirectory(prefix="time_to_solve-") as tmp:
        work = Path(tmp)
        variants = args.variants
        if args.cleanrl:
            settings["cleanrl_copy"] = work / "cleanrl"
            cleanrl = cleanrl_variants(variants, args.cleanrl, work / "cleanrl", args.cleanrl_flags)
            cleanrl_copy(args.cleanrl, [v["algo"] for v in cleanrl], work / "cleanrl")
            variants = cleanrl + variants
        try:
            warm = args.warm_dir or work / "warm"
            if "warm" in args.cache and not args.warm_dir:
                for k, variant in enumerate(variants):  # fills the warm cache, not counted
                    if variant["cleanrl"]:  # CleanRL's scripts compile nothing
                        continue
                    run = measure(variant, seeds[0], warm, settings, work / f"fill{k}")
                    note(f"{variant['label']}: cache filled in {run['run_seconds']:.1f} s")
            for seed in seeds:
                for k, variant in enumerate(variants):
                    for cache in args.cache:
                        inductor = work / f"cold{k}-{seed}" if cache == "cold" else warm
                        folder = work / f"{k}-{seed}-{cache}"
                        run = measure(variant, seed, inductor, settings, folder)
                        results.setdefault((variant["label"], cache), []).append(
                            run | dict(seed=seed)
                        )
                        points = [p and f"{p[0]:.1f} s" for p in run["members"].values()]
                        note(f"seed {seed} {variant['label']} ({cache}): {points or 'no episode'}")
        except BenchmarkError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    settings |= dict(started=started.isoformat("T", "seconds"), load=[load, os.getloadavg()[0]])
    settings.pop("cleanrl_copy", None)
    runs = {f"{label} ({cache})": value for (label, cache), value in results.items()}
    result = dict(machine=machine_info(), settings=settings, runs=runs)
    result["rows"] = rows(results, variants)
    paths = write_result(result, args.out_dir, f"time_to_solve-{started:%Y%m%d-%H%M%S}", markdown)
    return cli.conclude(markdown(result), paths)


if __name__ == "__main__":
    sys.exit(main())
