"""The seeds scripts: N independent runs (members) in one program. Member k is the single-seed
script run with seed `seeds[k]`; the vector env holds every member's envs, member k's the k-th
slice of its rows. A sweep: the flags a member may have of its own (a field whose default is a
tuple) given several values make a grid of settings, each trained by `--num-seeds` members."""

import dataclasses
import functools
import itertools
import os
import sys
import time

import numpy as np
import torch
from flags import check_flags, fail
from logs import Log
from runs import Run
from vector_envs import Episodes


def sweep_flags(args):
    """The flags a sweep may vary, each with the values given (a number alone: one value)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    sweepable = [f.name for f in dataclasses.fields(args) if isinstance(f.default, tuple)]
    return {k: values[k] if isinstance(values[k], tuple) else (values[k],) for k in sweepable}


def settings(args):
    """A sweep's settings: `args` with one value of each flag a sweep may vary, in the grid of the
    values given, the last flag varying fastest; one setting without a sweep."""
    flags = sweep_flags(args)
    for flag, values in flags.items():
        if not values:
            fail(f"--{flag.replace('_', '-')} needs a value")
    grid = itertools.product(*flags.values())
    return [dataclasses.replace(args, **dict(zip(flags, values))) for values in grid]


def member_values(args, members, device):
    """Each of `members` members' value of each flag a sweep may vary, a tensor [members] per flag:
    the settings in order, an equal run of members each."""
    points = settings(args)
    per_setting = members // len(points)
    points = [points[member // per_setting] for member in range(members)]
    return {
        f: torch.tensor([getattr(p, f) for p in points], device=device) for f in sweep_flags(args)
    }


def member_view(value, like):
    """`value` [members], shaped to broadcast over `like` [members, ...]."""
    return value.view(-1, *[1] * (like.dim() - 1))


def sweep_argv(Args, argv=None):
    """The command line (default: this process's), once no flag but a sweep's is given several
    values: any other exits 2, with the reason. A sweep's boolean flag takes the single-seed
    scripts' spelling too: `--autotune` is `--autotune True`, `--no-autotune` `--autotune False`."""
    argv = sys.argv[1:] if argv is None else argv
    fields = {f.name: f for f in dataclasses.fields(Args)}
    booleans = [k for k, f in fields.items() if is_bool_tuple(f.default)]
    argv = [
        word
        for i, token in enumerate(argv)
        for word in bool_flag(token, argv[i + 1 : i + 2], booleans)
    ]
    swept = [f"--{k.replace('_', '-')}" for k, f in fields.items() if isinstance(f.default, tuple)]
    for i, token in enumerate(argv):
        name = token[2:].replace("-", "_")
        if not token.startswith("--") or name not in fields or token in swept:
            continue
        count = len(list(itertools.takewhile(lambda t: not t.startswith("--"), argv[i + 1 :])))
        if count > 1:
            shared = "every member shares it (it sets a tensor's shape or when a step runs)"
            fail(
                f"{token} takes one value, got {count}: {shared}; a sweep varies {' '.join(swept)}"
            )
    return argv


def is_bool_tuple(default):
    return isinstance(default, tuple) and default and all(type(v) is bool for v in default)


def bool_flag(token, following, booleans):
    """`token` as tyro reads a tuple of booleans: `--flag` (no value follows) as `--flag True`,
    `--no-flag` as `--flag False`."""
    name = token.removeprefix("--").replace("-", "_")
    if not token.startswith("--"):
        return [token]
    if name in booleans and not (following and not following[0].startswith("--")):
        return [token, "True"]
    if name.startswith("no_") and name[3:] in booleans:
        return [f"--{name[3:].replace('_', '-')}", "False"]
    return [token]


def per_member(x, num_seeds):
    """The vector env's rows [num_seeds * num_envs, ...] as [num_seeds, num_envs, ...]."""
    return x.reshape(num_seeds, -1, *x.shape[1:])


def flat(x):
    """[num_seeds, num_envs, ...] as the vector env's rows [num_seeds * num_envs, ...]."""
    return x.reshape(-1, *x.shape[2:])


def finished_member_episodes(infos, num_seeds):
    """Per member, the returns of every episode that ended on this step."""
    final_info = infos.get("final_info", {})
    if "episode" not in final_info:
        return [[]] * num_seeds
    columns = (final_info["episode"]["r"], final_info["episode"]["l"], final_info["_episode"])
    members = zip(*(per_member(column, num_seeds) for column in columns))
    return [Episodes(r[ends].tolist(), n[ends].tolist()) for r, n, ends in members]


class MemberEpisodes:
    """The episodes that end on each step, held until `flush` hands them to the run, each at its
    step: the tensor envs' stay on their device until then, read in one host sync."""

    def __init__(self, num_seeds):
        self.num_seeds, self.held = num_seeds, []

    def add(self, global_step, infos):
        if "episode" in infos.get("final_info", {}):
            self.held.append((global_step, infos["final_info"]))

    def flush(self, run):
        columns = [[f["episode"]["r"], f["episode"]["l"], f["_episode"]] for _, f in self.held]
        stacked = [torch.stack([torch.as_tensor(x) for x in xs]).cpu() for xs in zip(*columns)]
        for (step, _), r, n, ends in zip(self.held, *stacked):  # after the one host sync
            infos = {"final_info": {"episode": {"r": r, "l": n}, "_episode": ends}}
            run.log_episodes(step, finished_member_episodes(infos, self.num_seeds))
        self.held.clear()


def check_memory(members, per_member, what, device=None):
    """Exit status 2 if the `members` members' `what`, `per_member` bytes each, cannot fit in
    `device`'s memory (a GPU's free memory; the machine's by default)."""
    need = members * per_member / 2**30
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    memory, where = pages / 2**30, "the machine has"
    if device is not None and device.type == "cuda":
        memory, where = torch.cuda.mem_get_info(device)[0] / 2**30, "the GPU has free"
    if need > memory:
        members = f"--num-seeds: {members} members' {what} (a sweep's: of every setting)"
        fail(f"{members} need {need:.1f} GiB, {where} {memory:.1f} GiB")


class SeedsRun(Run):
    """The run of N members, or of a sweep: each setting's `--num-seeds` members. Member k has seed
    `seeds[k]`, the flags `member_settings[k]` (a single run's) and its own series, `logs[k]`
    (`runs/<run_name>/<member>/` for TensorBoard); a non-finite loss or weight diverges it, and the
    others go on; the run stops once every member has diverged."""

    def __init__(self, args, script, free_flags=(), policy_flags=("env_id",)):
        # each setting's members are `--num-seeds` single runs of it: within a setting, no two
        # share an env seed; across settings, the same seeds, so that the settings compare
        self.settings = settings(args)
        for setting in self.settings:  # each value of a sweep's flags
            check_flags(setting, seeds=args.num_seeds * args.num_envs)
        super().__init__(args, script, free_flags, policy_flags)
        seeds = [args.seed + k * args.num_envs for k in range(args.num_seeds)]
        self.seeds = seeds * len(self.settings)
        self.member_settings = [setting for setting in self.settings for _ in seeds]
        # a member's name in file names and logs
        sweep = len(self.settings) > 1
        self.labels = [
            f"setting{k // len(seeds)}_seed{seed}" if sweep else f"seed{seed}"
            for k, seed in enumerate(self.seeds)
        ]
        # env i of member k is seeded seeds[k] + i
        self.env_seeds = [seed + i for seed in self.seeds for i in range(args.num_envs)]
        members = zip(self.member_settings, self.seeds, self.labels)
        self.logs = [  # as a single run's, with its own flags and seed
            Log(
                dataclasses.replace(s, seed=seed),
                label,
                (f"member {k} (seed {seed}) ", "; the others go on"),
            )
            for k, (s, seed, label) in enumerate(members)
        ]

    def log_episodes(self, global_step, member_returns):
        """`member_returns[k]`: the returns of member k's episodes that ended on this step."""
        seconds = time.time() - self.start_time
        for log, returns in zip(self.logs, member_returns):
            log.add_episodes(global_step, seconds, returns)

    def log_progress(self, global_step, metrics):
        """Show sps and the mean return, and log `metrics` (numbers, arrays or tensors, each one
        value or one per member) in one host sync."""
        arrays = {k: torch.as_tensor(v) for k, v in metrics.items() if hasattr(v, "shape")}
        device = next((v.device for v in arrays.values() if v.device.type != "cpu"), "cpu")
        members = range(len(self.logs))
        values = [v.to(device, torch.float64).expand(len(members)) for v in arrays.values()]
        values = dict(zip(arrays, torch.stack(values).tolist()))  # host sync
        self.show(global_step, [metrics | {k: v[m] for k, v in values.items()} for m in members])

    def finish(self, device, models, evaluate):
        """`Run.finish` of the members: member k's model `models[k]`, played by `evaluate(k,
        episodes, videos)`, its own file, evaluation and results in the summary, beside each
        setting's; a sweep prints its table (and plots it). A diverged member has no model file,
        evaluation or return mean."""
        evaluates = [functools.partial(evaluate, k) for k in range(len(models))]
        report = self.report_sweep if len(self.settings) > 1 else None
        super().finish(device, models, evaluates, self.member_results, report)

    def member_results(self, files, returns):
        """The members' fields of their model `files` and evaluation `returns` (a list per member,
        None where one diverged; [] before evaluating), their flags and each setting's results."""
        args, seeds, logs = self.args, self.seeds, self.logs
        means = [None if log.diverged else log.return_mean() for log in logs]
        kept = [mean for mean, log in zip(means, logs) if not log.diverged]
        return_mean = float(np.mean(kept)) if kept and None not in kept else None
        eval_means = [None if r is None else float(np.mean(r)) for r in returns]
        played = [mean for mean in eval_means if mean is not None]
        swept = sweep_flags(args)
        return dict(
            episodes=sum(len(log.curve) for log in logs),
            return_mean=return_mean,
            model_file=next(filter(None, files), None),
            eval_returns=returns,
            eval_return_mean=float(np.mean(played)) if played else None,
            num_seeds=args.num_seeds,
            seeds=seeds,
            return_means=means,
            hyperparameters=[{k: getattr(s, k) for k in swept} for s in self.member_settings],
            settings=self.setting_rows(means),
            model_files=files if args.save_model else [],
            diverged=[
                log.diverged | dict(seed=seeds[k], member=k)
                for k, log in enumerate(logs)
                if log.diverged
            ],
            eval_return_means=eval_means,
        )

    def swept_flags(self):
        """The flags given several values."""
        return [k for k, values in sweep_flags(self.args).items() if len(values) > 1]

    def setting_rows(self, means):
        """Per setting: the values of the flags given several, its members and their final returns
        (each one's last-20 mean; a diverged member's None), their mean and spread."""
        swept = self.swept_flags()
        per_setting = len(self.seeds) // len(self.settings)
        rows = []
        for index, setting in enumerate(self.settings):
            members = range(index * per_setting, (index + 1) * per_setting)
            finals = [means[k] for k in members if means[k] is not None]
            rows.append({k: getattr(setting, k) for k in swept})
            rows[-1] |= dict(members=list(members), return_means=[means[k] for k in members])
            rows[-1] |= dict(
                return_mean=float(np.mean(finals)) if finals else None,
                return_std=float(np.std(finals)) if finals else None,
                return_min=min(finals, default=None),
                return_max=max(finals, default=None),
            )
        return rows

    def report_sweep(self, summary):
        """The summary's settings, best first, as a table printed and written to sweep.md, and the
        final returns against each flag swept in sweep.png (where matplotlib is installed)."""
        rows, flags = summary["settings"], self.swept_flags()
        # the best first, settings whose every member diverged last
        ranked = sorted(rows, key=lambda r: (r["return_mean"] is None, -(r["return_mean"] or 0)))
        lines = [f"| {' | '.join(flags)} | return mean | std | min | max | members |"]
        lines.append("|" + "---|" * (len(flags) + 4) + "---:|")
        for row in ranked:
            numbers = [row[k] for k in ("return_mean", "return_std", "return_min", "return_max")]
            numbers = ["-" if x is None else f"{x:.1f}" for x in numbers]
            kept = sum(r is not None for r in row["return_means"])
            values = [number(row[k]) for k in flags]
            lines.append(f"| {' | '.join(values + numbers)} | {kept}/{len(row['members'])} |")
        title = (
            f"sweep: {len(rows)} settings x {self.args.num_seeds} seeds, final returns, best first"
        )
        table = "\n".join([title, "", *lines]) + "\n"
        print(table, flush=True)
        with open(self.folder.path("sweep.md"), "w") as f:
            f.write(table)
        try:
            from matplotlib.figure import Figure
        except ImportError:
            print("sweep.png skipped: matplotlib is not installed", file=sys.stderr)
            return
        figure = Figure(figsize=(4 * len(flags), 3.5), layout="constrained")
        for ax, flag in zip(figure.subplots(1, len(flags), squeeze=False)[0], flags):
            values = sorted({row[flag] for row in rows})
            for row in rows:  # each member a dot, each setting's mean a bar
                x = values.index(row[flag])
                finals = [r for r in row["return_means"] if r is not None]
                ax.plot([x] * len(finals), finals, ".", color="C0", alpha=0.6)
                if row["return_mean"] is not None:
                    ax.plot([x - 0.2, x + 0.2], [row["return_mean"]] * 2, "-", color="C1")
            ax.set_xticks(range(len(values)), [number(v) for v in values])
            ax.set(xlabel=flag, ylabel="final return")
        figure.suptitle("each member a dot, each setting's mean a bar", fontsize=9)
        figure.savefig(self.folder.path("sweep.png"), dpi=120)


def number(value):
    """A flag's value, short: 0.0003 as 0.0003, 1e-05 as 1e-05, True as True."""
    return f"{value:g}" if isinstance(value, float) else str(value)
