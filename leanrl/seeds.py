"""The seeds scripts: N independent runs (members) in one program. Member k is the single-seed
script run with seed `seeds[k]`; the vector env holds every member's envs, member k's the k-th
slice of its rows. A sweep: the flags a member may have of its own (a field whose default is a
tuple) given several values make a grid of settings, each trained by `--num-seeds` members."""

import dataclasses
import itertools
import os
import sys
import time
from collections import deque

import numpy as np
import torch
import tqdm
from runs import Run, Scalars, fail
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
    `seeds[k]`, the flags `member_settings[k]` (a single run's), its last 20 returns `returns[k]`
    and its curve `curves[k]`; a non-finite loss or weight sets `diverged[k]`, and the others go
    on; the run stops once every member has diverged."""

    def __init__(self, args, script, free_flags=(), policy_flags=("env_id",), tensor_envs=False):
        # each setting's members are `--num-seeds` single runs of it: within a setting, no two
        # share an env seed; across settings, the same seeds, so that the settings compare
        self.settings = settings(args)
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
        super().__init__(args, script, free_flags, policy_flags, tensor_envs)
        self.returns = [deque(maxlen=20) for _ in self.seeds]  # the last 20 episodic returns
        self.curves = [[] for _ in self.seeds]  # [step, seconds, return] of every episode
        self.diverged, self.writers = {}, []

    def open_writers(self):
        """A TensorBoard writer per member, in runs/<run_name>/<member>/, as a single run's with
        its flags; `charts/SPS` counts every member's steps."""
        self.writers = []
        if self.args.tensorboard:
            purge_step = self.steps if self.resumes else None
            flags = [vars(s) | {"seed": seed} for s, seed in zip(self.member_settings, self.seeds)]
            for label, member_flags in zip(self.labels, flags):
                folder = os.path.join(self.dir, label)
                self.writers.append(Scalars(folder, member_flags, purge_step))

    def close_writers(self):
        for writer in self.writers:
            writer.close()

    def check(self, args):
        for setting in self.settings:  # each value of a sweep's flags
            super().check(setting)

    def check_seed(self, args):
        if not 0 <= args.seed <= 2**31 - args.num_seeds * args.num_envs:  # env seeds below 2**31
            fail(f"--seed must be in [0, 2**31 - num_seeds x num_envs], got {args.seed}")

    @property
    def stopped(self):
        """A first Ctrl-C or SIGTERM, or every member diverged."""
        return bool(self.stop_signal) or self.all_diverged()

    def all_diverged(self):
        return len(self.diverged) == len(self.seeds)

    def restore_results(self, saved):
        self.curves, self.diverged = saved["curves"], saved["diverged"]
        for returns, saved_returns in zip(self.returns, saved["returns"]):
            returns.extend(saved_returns)

    def results(self):
        returns = [list(returns) for returns in self.returns]
        return dict(curves=self.curves, returns=returns, diverged=self.diverged)

    def curve_fields(self):
        return {"curves": self.curves}

    def sps(self, global_step, now=None):
        """Every member's env steps per second (`global_step` counts one member's)."""
        sps = super().sps(global_step, now)
        return sps and len(self.seeds) * sps

    def log_episodes(self, global_step, member_returns):
        """`member_returns[k]`: the returns of member k's episodes that ended on this step."""
        members = zip(self.labels, self.returns, self.curves, member_returns)
        for label, returns, curve, episode_returns in members:
            for r in episode_returns:  # a diverged policy's nan goes to its curve, as a string
                returns.extend([r] if np.isfinite(r) else [])
                value = r if np.isfinite(r) else str(r)
                curve.append([global_step, time.time() - self.start_time, value])
                if self.wandb:
                    self.wandb.log({f"charts/episodic_return_{label}": r}, step=global_step)
        for writer, episodes in zip(self.writers, member_returns):
            if episodes:  # most steps end no episode
                writer.add_episodes(global_step, episodes)

    def log_progress(self, global_step, metrics):
        """Show sps and the mean return; log `metrics` (numbers, or tensors on one device with one
        value or one per member) to wandb. A member whose loss is not finite diverges."""
        device = next(v.device for v in metrics.values() if isinstance(v, torch.Tensor))
        values = [torch.as_tensor(v, dtype=torch.float, device=device) for v in metrics.values()]
        values = torch.stack([v.expand(len(self.seeds)) for v in values]).tolist()  # host sync
        metrics = dict(zip(metrics, values))  # a list per metric: a value per member
        sps = self.sps(global_step) or 0.0
        means = [np.mean(r) for k, r in enumerate(self.returns) if r and k not in self.diverged]
        return_mean = np.mean(means) if means else float("nan")
        if self.pbar:  # none before `progress`
            self.pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
        if self.wandb:
            members = list(enumerate(self.labels))
            losses = {f"losses/{k}_{s}": v[m] for k, v in metrics.items() for m, s in members}
            self.wandb.log(losses | {"charts/SPS": sps}, step=global_step)
        for member, writer in enumerate(self.writers):
            losses = {f"losses/{k}": v[member] for k, v in metrics.items()}
            writer.add(global_step, (losses | self.sps_chart(sps)).items())
        for name, member_values in metrics.items():
            for member, value in enumerate(member_values):
                if name.endswith("loss") and not np.isfinite(value):
                    self.diverge(member, global_step, name, value)

    def diverge(self, member, step, metric, value):
        if member in self.diverged:
            return
        flags = vars(self.member_settings[member]).items()
        rates = [(k, v) for k, v in flags if k.endswith(("lr", "learning_rate"))]
        rates = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in rates if isinstance(v, float))
        seed = self.seeds[member]
        line = f"error: member {member} (seed {seed}) diverged at step {step}: {metric} is {value}"
        tqdm.tqdm.write(f"{line}; the others go on; maybe too large: {rates}", file=sys.stderr)
        self.diverged[member] = dict(step=step, metric=metric, value=str(value), seed=seed)

    def finish(self, device, models, evaluate):
        """Save each member's model (--save-model), write summary.json, play --eval-episodes per
        member with `evaluate(member, episodes, videos)`, print a sweep's table (and plot it), print
        the SUMMARY line. A diverged member has no model file, evaluation or return mean; a run
        whose every member diverged exits 3, a stopped one evaluates nothing and exits as a shell
        reports a signal (130 or 143)."""
        args, end_time, seeds = self.args, time.time(), self.seeds
        for member, model in enumerate(models):
            parts = [v.values() if isinstance(v, dict) else [v] for v in model.values()]
            weight_sum = float(sum(w.double().sum() for part in parts for w in part))  # host sync
            if not np.isfinite(weight_sum):
                self.diverge(member, self.steps, "weight_sum", weight_sum)
        kept = [member not in self.diverged for member in range(len(seeds))]
        model_files = [None] * len(seeds)
        for member, model in enumerate(models):
            if args.save_model and kept[member]:  # torch.load(model_file, weights_only=True)
                # as a single-seed run's
                flags = vars(self.member_settings[member]) | {"seed": seeds[member]}
                name = f"{self.script}_{self.labels[member]}.pt"
                model_files[member] = self.save_model(model, name, flags)
        means = [float(np.mean(r)) if r and ok else None for r, ok in zip(self.returns, kept)]
        kept_means = [m for m, ok in zip(means, kept) if ok]
        return_mean = float(np.mean(kept_means)) if kept_means and None not in kept_means else None
        wall_s = end_time - self.start_time
        swept = sweep_flags(args)
        summary = self.summary(device, end_time) | dict(
            episodes=sum(map(len, self.curves)),
            return_mean=return_mean,
            model_file=next(filter(None, model_files), None),
            eval_returns=[],
            eval_return_mean=None,
            num_seeds=args.num_seeds,
            seeds=seeds,
            return_means=means,
            hyperparameters=[{k: getattr(s, k) for k in swept} for s in self.member_settings],
            settings=self.setting_rows(means),
            model_files=model_files if args.save_model else [],
            diverged=[self.diverged[k] | dict(member=k) for k in sorted(self.diverged)],
            eval_return_means=[],
        )
        summary["sps_wall"], summary["wall_s"] = len(seeds) * self.steps / wall_s, wall_s
        if args.eval_episodes and not self.stop_signal:
            self.write_summary(summary)  # kept if a second signal kills the evaluation
            videos = [self.videos and f"{self.videos}/{label}" for label in self.labels]
            episodes, members = args.eval_episodes, range(len(seeds))
            returns = [evaluate(k, episodes, videos[k]) if kept[k] else None for k in members]
            means = [None if r is None else float(np.mean(r)) for r in returns]
            mean = float(np.mean([m for m in means if m is not None])) if any(kept) else None
            summary |= dict(eval_returns=returns, eval_return_means=means, eval_return_mean=mean)
        if len(self.settings) > 1:
            self.report_sweep(summary["settings"])
        self.end(summary, 0 if any(kept) else 3)

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

    def report_sweep(self, rows):
        """The settings, best first, as a table printed and written to sweep.md, and the final
        returns against each flag swept in sweep.png (where matplotlib is installed)."""
        flags = self.swept_flags()
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
        with open(self.path("sweep.md"), "w") as f:
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
        figure.savefig(self.path("sweep.png"), dpi=120)


def number(value):
    """A flag's value, short: 0.0003 as 0.0003, 1e-05 as 1e-05, True as True."""
    return f"{value:g}" if isinstance(value, float) else str(value)
