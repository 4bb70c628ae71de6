"""What a run logs of its training, as CleanRL's scripts log it, one `Log` per series (a run's, or
each member's of a seeds script): its episodes (the last 20 returns, the learning curve), its
TensorBoard scalars through torch's `SummaryWriter` (`--tensorboard`; `--track` sends them on to
wandb) and its divergence, a loss that is not finite."""

import math
import sys
import time
from collections import deque

import numpy as np
import tqdm


class Log:
    """The series of a run with `flags` (its hyperparameters' table and learning rates), its event
    file in the run folder's subfolder `name` (a member's; a run's: the folder). `who` names it in
    the line a divergence prints (a member of a seeds run, and what the others do); `quiet`: a
    process that writes and prints nothing (torchrun's ranks but the first)."""

    # the metrics CleanRL charts; every other one a script logs is a loss's
    CHARTS = {"SPS": "charts/SPS", "learning_rate": "charts/learning_rate"}

    def __init__(self, flags, name="", who=("", ""), quiet=False):
        self.flags, self.name, self.who, self.quiet = flags, name, who, quiet
        self.returns = deque(maxlen=20)  # the last 20 episodic returns
        self.curve = []  # [step, seconds, return] of every episode
        self.diverged, self.writer = None, None

    def open(self, folder, purge_step=None):
        """The event file in `folder`, from training's start: a resumed run's hides what the run
        logged past its checkpoint, `purge_step`."""
        if self.flags.tensorboard and not self.quiet:
            from torch.utils.tensorboard import SummaryWriter  # only with --tensorboard

            # its thread writes the file each second: a live run shows, a solved one is seen
            self.writer = SummaryWriter(folder, purge_step=purge_step or None, flush_secs=1)
            self.pending, self.flushed = [], time.time()  # what `add` holds, since when
            rows = "\n".join(f"|{key}|{value}|" for key, value in vars(self.flags).items())
            self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{rows}")

    def add(self, step, scalars):
        """TensorBoard's `scalars`, a dict of numbers by tag, at `step`, handed to the writer once a
        second: its thread then takes the interpreter once for all of them, not once each."""
        if self.writer:
            now = time.time()
            self.pending += [(tag, value, step, now) for tag, value in scalars.items()]
            if now > self.flushed + 1.0:
                self.flush()

    def flush(self):
        for tag, value, step, wall_time in self.pending:
            self.writer.add_scalar(tag, value, step, wall_time)
        self.pending, self.flushed = [], time.time()

    def add_episodes(self, step, seconds, returns):
        """The episodes that ended at `step`, `seconds` into the run (`Episodes`: with their
        lengths)."""
        for episodic_return in returns:
            self.returns.append(episodic_return)
            self.curve.append([step, seconds, episodic_return])
            self.add(step, {"charts/episodic_return": episodic_return})
        for length in getattr(returns, "lengths", []):
            self.add(step, {"charts/episodic_length": length})

    def add_metrics(self, step, metrics):
        """`metrics` as `losses/<name>` (CleanRL's charts as `charts/<name>`); a loss or
        `weight_norm` that is not finite diverges the run."""
        self.add(step, {self.CHARTS.get(k, f"losses/{k}"): v for k, v in metrics.items()})
        self.check(step, {k: v for k, v in metrics.items() if "loss" in k or k == "weight_norm"})

    def check_end(self, step, model):
        """The sum of `model`'s weights (a dict of tensors and dicts of them) and the mean return
        must be finite."""
        weights = [w for v in model.values() for w in (v.values() if isinstance(v, dict) else [v])]
        weight_sum = float(sum(w.double().sum() for w in weights))  # host sync, once
        self.check(step, dict(weight_sum=weight_sum, return_mean=self.return_mean() or 0.0))

    def check(self, step, numbers):
        """A number that is not finite diverges the run."""
        for name, value in numbers.items():
            if not math.isfinite(value):
                self.diverge(step, name, value)

    def close(self):
        if self.writer:
            self.flush()
            self.writer.close()

    def return_mean(self):
        return float(np.mean(self.returns)) if self.returns else None

    def diverge(self, step, metric, value):
        """The first divergence: one line on stderr naming the learning rates."""
        if self.diverged:
            return
        flags = vars(self.flags).items()
        rates = [(k, v) for k, v in flags if k.endswith(("lr", "learning_rate"))]
        rates = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in rates if isinstance(v, float))
        line = f"error: {self.who[0]}diverged at step {step}: {metric} is {value}{self.who[1]}"
        if not self.quiet:
            tqdm.tqdm.write(f"{line}; maybe too large: {rates}", file=sys.stderr)
        self.diverged = dict(step=step, metric=metric, value=str(value))
