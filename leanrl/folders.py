"""The run folder, runs/<run_name>/, and what a run writes there: the model (`--save-model`), the
summary and, written by the parts they belong to, the checkpoint, TensorBoard's events and the
videos; and the model a run evaluates instead of training (`--eval-model`)."""

import json
import os
import re
import time

import torch
from flags import fail


def named_folder(args):
    """runs/<run_name>/ under the working folder, `run_name` being --run-name or
    <env_id>__<exp_name>__<seed>__<unix time>."""
    name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    return os.path.join("runs", (args.run_name or name).replace(":", "_"))


class RunFolder:
    """The run's folder, `dir`: `named_folder`'s, or that of the checkpoint a run resumes. It is
    made when a run first writes to it, so that a run refused before training leaves none."""

    def __init__(self, folder):
        self.dir = folder

    def path(self, name):
        os.makedirs(self.dir, exist_ok=True)
        return os.path.join(self.dir, name)

    def save(self, obj, name):
        """`obj` to `name` with torch.save, atomically (a temporary file, then renamed); returns the
        file's absolute path."""
        path = os.path.abspath(self.path(name))
        torch.save(obj, path + ".tmp")
        os.replace(path + ".tmp", path)
        return path

    def save_model(self, script, log, model):
        """`model`, the policy's tensors, with the series' flags (`log`'s) to <script>.pt, a
        member's to <script>_<member>.pt; returns its path. It loads with `torch.load(path,
        weights_only=True)`."""
        name = f"{script}_{log.name}" if log.name else script
        return self.save(dict(script=script, args=vars(log.flags), model=model), f"{name}.pt")

    def write_summary(self, summary, curves):
        """summary.json, atomically, its numbers that are not finite as strings; returns the SUMMARY
        line's object: the same without the learning `curves` (name -> curve), with the file's
        path."""
        summary = json.loads(json.dumps(summary | curves), parse_constant=lambda c: str(float(c)))
        path = self.path("summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary, f)
        os.replace(path + ".tmp", path)
        line = {k: v for k, v in summary.items() if k not in curves}
        return line | {"summary_file": os.path.abspath(path)}


def load_model(args, script, policy_flags):
    """The model of --eval-model, saved by a script of this algorithm with the same `policy_flags`
    (what the policy acts on)."""
    path = args.eval_model
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        saved_by, trained = saved["script"], dict(saved["args"])
    except Exception as e:
        fail(f"--eval-model {path} is not a model saved by these scripts ({e!r})")
    variants = r"_(torchcompile|cpu|distributed|ray|async|seeds)$"  # one algorithm's scripts
    algorithm = re.sub(variants, "", script)
    if re.sub(variants, "", saved_by) != algorithm:
        fail(f"--eval-model {path} was saved by {saved_by}, not by a script of {algorithm}")
    for flag in policy_flags:
        if trained.get(flag) != getattr(args, flag):
            value = trained.get(flag)
            fail(f"--eval-model {path} was trained with --{flag.replace('_', '-')} {value}")
    return saved["model"]
