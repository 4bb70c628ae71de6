"""The run flags and their checks: `RunFlags`, every script's; `CudaFlags`, which adds `--cuda`;
`TensorEnvFlags`, which the scripts that can train on the tensor envs add (`--tensor-envs`);
`check_flags`, the checks of the run flags and of every number; and `fail`, a user error. A
script's `Args` extends one of them with its algorithm's flags (threads.py has the CPU scripts'
`ThreadFlags` and `CPUFlags`)."""

import os
import sys
from dataclasses import dataclass


@dataclass
class RunFlags:
    exp_name: str | None = None
    """the name of this experiment (default: the script's name)"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    track: bool = False
    """send TensorBoard's scalars to Weights and Biases, as CleanRL (the only use of wandb)"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of the first env and of every evaluation episode to runs/<run_name>/videos/"""
    save_model: bool = False
    """save the policy's weights and the run's arguments to runs/<run_name>/<script>.pt"""
    eval_episodes: int = 0
    """after training, play this many episodes with the trained policy (0: none)"""
    eval_model: str | None = None
    """evaluate this saved .pt file for --eval-episodes episodes instead of training"""
    measure_burnin: int = 3
    """updates (off-policy: after the random steps) or iterations left out of `sps`: they compile
    and warm up"""
    checkpoint_minutes: float = 10.0
    """save the training state to runs/<run_name>/checkpoint.pt this often, and always on a first
    Ctrl-C or SIGTERM and at the end (0: only then)"""
    resume: str | None = None
    """continue the run of this checkpoint or run folder (`auto`: of runs/<run_name>, if any)"""
    run_name: str | None = None
    """the run folder's name under runs/ (default: <env_id>__<exp_name>__<seed>__<unix time>)"""
    tensorboard: bool = True
    """write CleanRL's TensorBoard scalars to runs/<run_name>/ (`tensorboard --logdir runs`)"""


@dataclass
class CudaFlags(RunFlags):
    cuda: bool = True
    """use a CUDA device when there is one, else the CPU"""


@dataclass
class TensorEnvFlags:
    tensor_envs: bool = False
    """train on batched tensor envs (classic control, MuJoCo Warp's tasks) instead of gymnasium's"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


def check_flags(args, seeds=1):
    """The run flags, and every number: one line naming the flag and exit status 2. `seeds`: how
    many seeds from --seed on the run gives its members' envs (a seeds script's)."""
    for flag, value in vars(args).items():
        # nan fails every comparison; past 1e30 float32 overflows
        if isinstance(value, float) and not abs(value) <= 1e30:
            name = flag.replace("_", "-")
            fail(f"--{name} must be a finite number, at most 1e30 in size, got {value}")
    if not 0 <= args.seed <= 2**31 - seeds:  # numpy's seeds are below 2**32, envpool's 2**31
        fail(f"--seed must be in [0, {2**31 - seeds}], got {args.seed}")
    if args.eval_episodes < 0 or (args.eval_model and args.eval_episodes == 0):
        n = args.eval_episodes
        fail(f"--eval-episodes must be >= 0, and > 0 with --eval-model, got {n}")
    if args.checkpoint_minutes < 0 or (args.resume and args.eval_model):
        fail("--checkpoint-minutes must be >= 0, and --resume cannot go with --eval-model")
    if args.measure_burnin < 0:
        fail(f"--measure-burnin must be >= 0, got {args.measure_burnin}")
    if args.track and not args.tensorboard:
        fail("--track sends TensorBoard's scalars to wandb, as CleanRL: --no-tensorboard stops it")
    folder = args.run_name
    if folder is not None and (os.sep in folder or folder in ("", ".", "..")):
        fail(f"--run-name must name one folder under runs/, got {folder!r}")
    if hasattr(args, "check_threads"):  # threads.py's flags
        args.check_threads()
