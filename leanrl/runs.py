"""The run: everything a training script does around its algorithm, written once. A script
imports what it uses, as CleanRL's scripts import `cleanrl_utils`:

    from runs import CudaFlags, Run, fail
    from vector_envs import evaluate, finished_episodes, make_envs, true_next_obs

- `RunFlags` (every script's run flags) and `CudaFlags` (adds `--cuda`); a script's `Args` extends
  one with its algorithm's flags (threads.py has the CPU scripts' `ThreadFlags` and `CPUFlags`);
- `fail`: a user error, one line and exit status 2;
- `Run`: the run folder `runs/<run_name>/`, seeds, wandb, TensorBoard, Ctrl-C and SIGTERM,
  divergence, checkpoints and resume, the progress bar, `--save-model`, `--eval-model`, the SUMMARY
  line.

Beside it, by purpose: vector_envs.py (gymnasium's vector env, episodes, evaluation), threads.py
(the thread choice and bf16), seeds.py (`SeedsRun`: N members in one program, sweeps), atari.py
(`AtariRun`: envpool's games), ranks.py (`RankRun`: torchrun's ranks), tensor_envs.py (classic
control as tensors). To copy one script without them, export it (export.py): the copy has the
parts it uses inlined and imports nothing from the project.

    python leanrl/export.py leanrl/sac_continuous_action.py my_sac.py
"""

import gc
import json
import os
import pickle
import random
import re
import signal
import socket
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import tqdm


@dataclass
class RunFlags:
    exp_name: str | None = None
    """the name of this experiment (default: the script's name)"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    track: bool = False
    """log to Weights and Biases (the only way wandb is touched)"""
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
    tensor_envs: bool = False
    """train on batched tensor envs (classic control, MuJoCo Warp's tasks) instead of gymnasium's"""
    tensorboard: bool = True
    """write CleanRL's TensorBoard scalars to runs/<run_name>/ (`tensorboard --logdir runs`)"""


@dataclass
class CudaFlags(RunFlags):
    cuda: bool = True
    """use a CUDA device when there is one, else the CPU"""


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


class Run:
    """Everything around training: seeds, `runs/<run_name>/`, wandb, TensorBoard, signals,
    checkpoints, the progress bar, the summary. A first Ctrl-C or SIGTERM sets `stop_signal` and a
    non-finite loss sets `diverged`: `stopped` tells the loop to end after its step.

    `free_flags`: the script's flags that a resumed run may change (they do not change what is
    trained); `policy_flags`: the flags a saved policy must share to be evaluated (what it acts on).
    """

    VARIANTS = r"_(torchcompile|cpu|distributed|ray|async|seeds)$"  # one algorithm, many scripts
    FREE_FLAGS = ("total_timesteps", "track", "wandb_project_name", "wandb_entity", "cuda")
    FREE_FLAGS += ("capture_video", "save_model", "eval_episodes", "measure_burnin")
    FREE_FLAGS += ("checkpoint_minutes", "resume", "run_name", "threads", "tensorboard")
    main_process = True  # the process that keeps the folder, wandb and the messages

    def __init__(self, args, script, free_flags=(), policy_flags=("env_id",), tensor_envs=False):
        self.args, self.script, self.free_flags = args, script, self.FREE_FLAGS + free_flags
        self.tensor_envs = tensor_envs  # whether the script can train on the tensor envs
        self.check(args)
        args.exp_name = args.exp_name or script
        self.saved_model = (
            self.load_model(args.eval_model, policy_flags) if args.eval_model else None
        )
        self.name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.name = (args.run_name or self.name).replace(":", "_")
        self.dir = os.path.join("runs", self.name)
        self.saved = self.load_checkpoint()  # None unless resumed; its folder becomes the run's
        self.videos = self.video_folder() if args.capture_video and self.main_process else None
        self.wandb, self.writer = None, None  # the writer: made when training starts
        if args.track and self.main_process:
            self.wandb = __import__("wandb")  # only with --track
            self.wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                config=vars(args),
                name=self.name,
                id=self.saved and self.saved["wandb_id"],  # a resumed run logs to the same run
                resume="allow",
            )
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        # the thread choice, where the flags leave it to the run (threads.py's ThreadFlags)
        self.threads = args.start_threads() if hasattr(args, "start_threads") else None
        self.returns = deque(maxlen=20)  # the last 20 episodic returns
        self.curve = []  # [step, seconds, return] of every episode
        self.start_time, self.measure_start, self.measure_step = time.time(), None, 0
        self.steps, self.stop_signal, self.diverged = 0, 0, None
        self.resumes, self.last_iteration, self.pbar = [], None, None
        self.next_checkpoint = time.time() + 60 * (args.checkpoint_minutes or float("inf"))
        self.envs_restored = False  # by `resume`, where the checkpoint holds them
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)

    def check(self, args):
        """The run flags, and every number: one line naming the flag and exit status 2."""
        # nan fails every comparison; past 1e30 float32 overflows
        for flag, value in vars(args).items():
            if isinstance(value, float) and not abs(value) <= 1e30:
                name = flag.replace("_", "-")
                fail(f"--{name} must be a finite number, at most 1e30 in size, got {value}")
        self.check_seed(args)
        if args.eval_episodes < 0 or (args.eval_model and args.eval_episodes == 0):
            n = args.eval_episodes
            fail(f"--eval-episodes must be >= 0, and > 0 with --eval-model, got {n}")
        if args.checkpoint_minutes < 0 or (args.resume and args.eval_model):
            fail("--checkpoint-minutes must be >= 0, and --resume cannot go with --eval-model")
        if args.tensor_envs and not self.tensor_envs:
            fail(f"--tensor-envs: {self.script} trains on gymnasium's envs only")
        if args.measure_burnin < 0:
            fail(f"--measure-burnin must be >= 0, got {args.measure_burnin}")
        if hasattr(args, "check_threads"):  # threads.py's flags
            args.check_threads()
        folder = args.run_name
        if folder is not None and (os.sep in folder or folder in ("", ".", "..")):
            fail(f"--run-name must name one folder under runs/, got {folder!r}")

    def check_seed(self, args):
        if not 0 <= args.seed < 2**31:  # numpy's seeds are below 2**32, envpool's below 2**31
            fail(f"--seed must be in [0, 2**31), got {args.seed}")

    def on_signal(self, signum, frame):
        self.stop_signal = signum
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second signal stops at once
            signal.signal(signum, signal.SIG_DFL)

    @property
    def stopped(self):
        """A first Ctrl-C or SIGTERM, or divergence: the loop ends after this step."""
        return bool(self.stop_signal or self.diverged)

    def load_model(self, path, policy_flags):
        algorithm = re.sub(self.VARIANTS, "", self.script)
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            saved_by, trained = saved["script"], dict(saved["args"])
        except Exception as e:
            fail(f"--eval-model {path} is not a model saved by these scripts ({e!r})")
        if re.sub(self.VARIANTS, "", saved_by) != algorithm:
            fail(f"--eval-model {path} was saved by {saved_by}, not by a script of {algorithm}")
        for flag in policy_flags:
            if trained.get(flag) != getattr(self.args, flag):
                value = trained.get(flag)
                fail(f"--eval-model {path} was trained with --{flag.replace('_', '-')} {value}")
        return saved["model"]

    def load_checkpoint(self):
        """The checkpoint that --resume names (a file or a run folder), checked against the
        flags."""
        args, own = self.args, os.path.join(self.dir, "checkpoint.pt")
        if args.resume is None and args.run_name and os.path.exists(own):
            fail(f"{own} exists: --resume auto continues that run, or choose another --run-name")
        if args.resume == "auto" and not args.run_name:
            fail("--resume auto needs --run-name, the folder under runs/ to continue")
        if args.resume is None or (args.resume == "auto" and not os.path.exists(own)):
            return None
        path = own if args.resume == "auto" else args.resume
        path = os.path.join(path, "checkpoint.pt") if os.path.isdir(path) else path
        try:
            saved = torch.load(path, map_location="cpu", weights_only=False)
            saved_by, trained = saved["script"], saved["args"]
        except Exception as e:
            fail(f"--resume {path} is not a checkpoint of these scripts ({e!r})")
        if saved_by != self.script:
            fail(f"--resume {path} was written by {saved_by}, not {self.script}")
        self.check_resumed(path, saved)
        for flag, value in self.trained_flags().items():
            if flag not in self.free_flags and trained.get(flag) != value:
                fail(f"--resume {path} trained with --{flag.replace('_', '-')} {trained.get(flag)}")
        if saved["final"] and args.total_timesteps <= trained["total_timesteps"]:
            print(f"{path}: the run finished at step {saved['step']}; nothing to resume")
            sys.exit(0)
        self.dir = os.path.dirname(os.path.abspath(path))
        self.name = os.path.basename(self.dir)
        return saved

    def path(self, name):
        """runs/<run_name>/`name`; the folder is made when training starts or a run first writes to
        it, so that a run refused before training leaves none."""
        os.makedirs(self.dir, exist_ok=True)
        return os.path.join(self.dir, name)

    def check_resumed(self, path, saved):
        """What a family checks of a checkpoint beyond the flags."""

    def trained_flags(self):
        """The flags as a checkpoint of this run would hold them."""
        return vars(self.args)

    def resume(self, state):
        """Copy the checkpoint's training state into `state` (in place) and its counters, curve and
        generators into the run; returns the iteration to start from (0 in a fresh run)."""
        saved, self.saved = self.saved, None  # the buffer once
        if saved is None:
            return 0
        self.restore(state, saved["state"] | self.own_state(saved), self.args.seed + saved["step"])
        python, numpy, cpu, cuda = self.own_generators(saved)
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if len(cuda) == torch.cuda.device_count() > 0:  # on as many GPUs
            torch.cuda.set_rng_state_all(cuda)
        self.steps = saved["step"]
        self.restore_results(saved)
        self.start_time = time.time() - saved["wall_s"]
        resumed = dict(step=self.steps, fresh_episodes=not self.envs_restored)
        self.resumes = saved["resumes"] + [resumed]
        self.start_clock(self.steps)
        return saved["iteration"]

    def own_state(self, saved):
        """What this process restores beside the saved training state (a rank: its envs)."""
        return {}

    def own_generators(self, saved):
        return saved["generators"]

    def restore_results(self, saved):
        self.curve = saved["curve"]
        self.returns.extend(saved["returns"])

    def results(self):
        """The episodes so far, as a checkpoint keeps them."""
        return dict(curve=self.curve, returns=list(self.returns))

    def progress(self, iterations):
        """`iterations` (a range) under a progress bar; the last one ends the run. Training starts:
        the run folder is made."""
        if self.main_process:
            os.makedirs(self.dir, exist_ok=True)
            self.open_writers()
        gc.freeze()  # the loop's full garbage collections skip what setup made (0.25 s each here)
        self.last_iteration = iterations.stop - 1
        self.pbar = tqdm.tqdm(iterations, mininterval=1.0, disable=not self.main_process)
        return self.timed(self.pbar) if self.threads else self.pbar

    def open_writers(self):
        """CleanRL's TensorBoard writer, with --tensorboard: a resumed run hides what the run had
        logged past its checkpoint."""
        if self.args.tensorboard:
            purge_step = self.steps if self.resumes else None
            self.writer = Scalars(self.dir, vars(self.args), purge_step)

    def timed(self, iterations):
        """`iterations`, each timed for the thread choice."""
        for iteration in iterations:
            yield iteration
            line = self.threads.tick(time.perf_counter(), self.steps)
            if line:
                tqdm.tqdm.write(line, file=sys.stderr)

    def checkpoint(self, iteration, state, steps):
        """After `iteration`, which brought the env steps to `steps` (every iteration tells the run
        its steps here): when due, on a first signal and at the end, `state()`, the counters and
        the generators to checkpoint.pt, written to a temporary file and renamed."""
        self.steps = steps
        final = iteration == self.last_iteration
        if self.all_diverged() or not (final or self.stop_signal or self.due()):
            return
        self.next_checkpoint = time.time() + 60 * (self.args.checkpoint_minutes or float("inf"))
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        generators = (random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)
        state = self.state_of(state())
        extra = self.gather(generators, state)
        if not self.main_process:
            return
        saved = dict(script=self.script, args=vars(self.args), iteration=iteration + 1)
        saved |= dict(step=self.steps, final=final, **self.results())
        saved |= dict(wall_s=time.time() - self.start_time, resumes=self.resumes)
        saved |= dict(wandb_id=self.wandb and self.wandb.run.id, **extra)
        path = self.path("checkpoint.pt")
        torch.save(saved | dict(state=state), path + ".tmp")
        os.replace(path + ".tmp", path)

    def all_diverged(self):
        return bool(self.diverged)

    def due(self):
        return time.time() > self.next_checkpoint

    def gather(self, generators, state):
        """What the checkpoint keeps beside the training state (every rank's, under torchrun)."""
        return dict(generators=generators)

    def state_of(self, obj):
        """What `restore` puts back: state dicts, tensors, arrays, and for (envs, obs, ...) the
        envs' wrappers and envs pickled but their functions, which the same flags make again
        (observation transforms), or None where they cannot be (a video recorder, envpool)."""
        if hasattr(obj, "state_dict"):
            return obj.state_dict()
        if isinstance(obj, np.random.Generator):
            return obj.bit_generator.state
        if isinstance(obj, dict):
            return {k: self.state_of(v) for k, v in obj.items()}
        if isinstance(obj, tuple) and getattr(obj[0], "whole_state", False):  # tensor envs
            return tuple(self.state_of(x) for x in obj)
        if isinstance(obj, tuple):  # (envs, obs, ...)
            # between the layers, and how to make them
            links = ("env", "envs", "env_fns", "_saved_kwargs")
            try:
                layers = [
                    {k: v for k, v in vars(x).items() if k not in links and not callable(v)}
                    for x in self.layers(obj)
                ]
                envs = pickle.dumps(layers)
            except Exception:  # a renderer's screen cannot be pickled, nor envpool's envs walked
                envs = None
            return (envs, *(self.state_of(x) for x in obj[1:]))
        if isinstance(obj, np.ndarray):
            return obj.copy()
        return obj.to("cpu", copy=True)

    def restore(self, obj, saved, seed):
        """`saved` into `obj`, in place; envs that were not saved start fresh episodes, seeded with
        `seed`."""
        if isinstance(obj, torch.optim.Optimizer):  # a tensor lr in place: a CUDA graph reads it
            rates = [group["lr"] for group in obj.param_groups]
            obj.load_state_dict(saved)
            for group, rate in zip(obj.param_groups, rates):
                if isinstance(rate, torch.Tensor):
                    group["lr"] = rate.copy_(group["lr"])
        elif hasattr(obj, "load_state_dict"):
            obj.load_state_dict(saved)
        elif isinstance(obj, np.random.Generator):
            obj.bit_generator.state = saved
        elif isinstance(obj, dict):
            for key, value in obj.items():
                if key in saved:
                    self.restore(value, saved[key], seed)
        elif isinstance(obj, tuple) and getattr(obj[0], "whole_state", False):  # tensor envs
            for x, value in zip(obj, saved):
                self.restore(x, value, seed)
            self.envs_restored = True
        elif isinstance(obj, tuple) and saved[0] is None:  # fresh episodes: no dones, no memory
            self.restore(obj[1], obj[0].reset(seed=seed)[0], seed)
            for carried in obj[2:]:
                carried.zero_()
        elif isinstance(obj, tuple):
            for layer, attributes in zip(self.layers(obj), pickle.loads(saved[0])):
                vars(layer).update(attributes)
            for x, value in zip(obj[1:], saved[1:]):
                self.restore(x, value, seed)
            self.envs_restored = True
        elif isinstance(obj, np.ndarray):
            obj[...] = saved
        else:
            with torch.no_grad():
                obj.copy_(torch.as_tensor(saved))

    @staticmethod
    def layers(envs_obs):
        """The vector env, then each env's wrappers and the env itself, outermost first."""
        layers = [envs_obs[0]]
        for env in envs_obs[0].envs:
            layers.append(env)
            while hasattr(env, "env"):
                env = env.env
                layers.append(env)
        return layers

    def video_folder(self):
        """runs/<run_name>/videos, once we know that this machine can record the env."""
        os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders without a display
        # torch's compiler loads triton's LLVM (CUDA builds); after Mesa's EGL has loaded its own,
        # that crashes the process, so it comes first
        __import__("torch._dynamo")
        try:
            self.check_video()
        except Exception as e:
            fail(f"--capture-video: {self.args.env_id} cannot record video here ({e!r})")
        videos = os.path.join(self.dir, "videos")
        # a resumed run's recorder counts episodes from 0 again: a folder of its own keeps the first
        return os.path.join(videos, f"resumed-{self.saved['step']}") if self.saved else videos

    def check_video(self):
        """Raises if the env cannot draw a frame here."""
        __import__("moviepy")  # RecordVideo's writer
        env = gym.make(self.args.env_id, render_mode="rgb_array")
        env.reset(seed=0)
        assert isinstance(env.render(), np.ndarray), "no frame"

    def start_clock(self, global_step):
        """sps counts from here: compile and warm-up are behind. Where threads are the run's to
        choose, their first trial starts here."""
        self.measure_start, self.measure_step = time.time(), global_step
        if self.threads and not self.threads.trials:
            self.threads.start(time.perf_counter(), global_step)

    def sps(self, global_step, now=None):
        """The steady state: where the run chooses its threads, without what measuring them cost
        (`ThreadChoice.left_out`)."""
        if self.measure_start:  # None before the clock starts
            seconds, steps = self.threads.left_out() if self.threads else (0.0, 0)
            seconds = (now or time.time()) - self.measure_start - seconds
            return (global_step - self.measure_step - steps) / seconds

    def sps_chart(self, sps):
        return {"charts/SPS": sps} if self.measure_start else {}

    def log_episodes(self, global_step, returns):
        """`returns`: of the episodes that ended on this step (`Episodes`: with their lengths)."""
        for episodic_return in returns:
            self.returns.append(episodic_return)
            self.curve.append([global_step, time.time() - self.start_time, episodic_return])
            if self.wandb:
                self.wandb.log({"charts/episodic_return": episodic_return}, step=global_step)
        if self.writer and returns:  # most steps end no episode
            self.writer.add_episodes(global_step, returns)

    def log_progress(self, global_step, metrics):
        """Show sps and the mean return; log `metrics` to wandb. A loss or `weight_norm` that is not
        finite diverges the run."""
        tensors = {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)}
        values = torch.stack([*tensors.values()]).tolist() if tensors else []  # host sync
        metrics = metrics | dict(zip(tensors, values))
        sps = self.sps(global_step) or 0.0
        return_mean = np.mean(self.returns) if self.returns else float("nan")
        if self.pbar:  # none before `progress`
            self.pbar.set_description(f"sps {sps:5.0f} | return {return_mean:8.1f}", refresh=False)
        losses = {f"losses/{k}": float(v) for k, v in metrics.items()}
        if self.wandb:
            self.wandb.log(losses | {"charts/SPS": sps}, step=global_step)
        if self.writer:  # sps, once its clock has started
            self.writer.add(global_step, (losses | self.sps_chart(sps)).items())
        for name, value in metrics.items():
            if ("loss" in name or name == "weight_norm") and not np.isfinite(value):
                self.diverge(global_step, name, value)

    def diverge(self, step, metric, value):
        if self.diverged:
            return
        rates = [(k, v) for k, v in vars(self.args).items() if k.endswith(("lr", "learning_rate"))]
        rates = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in rates if isinstance(v, float))
        line = f"error: diverged at step {step}: {metric} is {value}; maybe too large: {rates}"
        if self.main_process:
            tqdm.tqdm.write(line, file=sys.stderr)
        self.diverged = dict(step=step, metric=metric, value=str(value))

    def finish(self, device, model, evaluate, **extra):
        """Save `model` (--save-model), write summary.json, play --eval-episodes with
        `evaluate(episodes, videos)`, print the SUMMARY line. A diverged run saves and plays
        nothing and exits 3; a stopped one exits as a shell reports a signal (130 or 143)."""
        args, end_time = self.args, time.time()
        weights = [w for v in model.values() for w in (v.values() if isinstance(v, dict) else [v])]
        weight_sum = float(sum(w.double().sum() for w in weights))  # host sync, once
        if not np.isfinite(weight_sum):
            self.diverge(self.steps, "weight_sum", weight_sum)
        if self.returns and not np.isfinite(np.mean(self.returns)):
            self.diverge(self.steps, "return_mean", np.mean(self.returns))
        model_file = None
        if args.save_model and not self.diverged:  # torch.load(model_file, weights_only=True)
            model_file = self.save_model(model, f"{self.script}.pt", vars(args))
        wall_s = end_time - self.start_time
        summary = self.summary(device, end_time) | dict(
            episodes=len(self.curve),
            return_mean=float(np.mean(self.returns)) if self.returns else None,
            model_file=model_file,
            eval_returns=[],
            eval_return_mean=None,
            diverged=self.diverged,
        )
        summary["sps_wall"], summary["wall_s"] = self.steps / wall_s, wall_s
        summary |= extra  # a script's own fields, which may override the ones above
        if args.eval_episodes and not self.diverged:
            self.write_summary(summary)  # kept if a second signal kills the evaluation
            returns = evaluate(args.eval_episodes, self.videos)
            summary |= dict(eval_returns=returns, eval_return_mean=float(np.mean(returns)))
        self.end(summary, 3 if self.diverged else 0)

    def summary(self, device, end_time):
        """The SUMMARY's fields that every script has."""
        args = self.args
        summary = dict(
            script=self.script,
            env_id=args.env_id,
            seed=args.seed,
            device=str(device),
            compile=getattr(args, "compile", False),
            cudagraphs=getattr(args, "cudagraphs", False),
            num_envs=args.num_envs,
            total_timesteps=self.steps,
            sps=self.sps(self.steps, end_time),
            torch_version=torch.__version__,
            interrupted=self.stop_signal > 0,
            resumes=self.resumes,
        )
        if hasattr(args, "threads"):
            summary["threads"] = torch.get_num_threads()
            summary["thread_trials"] = self.threads.trials if self.threads else []
        return summary

    def save_model(self, model, name, flags):
        """`model` and the run's `flags` to runs/<run_name>/`name`, atomically; returns its path."""
        path = os.path.abspath(self.path(name))
        torch.save({"script": self.script, "args": flags, "model": model}, path + ".tmp")
        os.replace(path + ".tmp", path)
        return path

    def end(self, summary, status):
        """Print the SUMMARY line, close wandb and exit with `status` (a signal's, if stopped)."""
        print("SUMMARY " + json.dumps(self.write_summary(summary)), flush=True)
        if self.wandb:
            self.wandb.finish()
        self.close_writers()
        if status or self.stop_signal:
            sys.exit(status or 128 + self.stop_signal)

    def close_writers(self):
        if self.writer:
            self.writer.close()

    def curve_fields(self):
        """The learning curve, which summary.json holds and the SUMMARY line leaves out."""
        return {"curve": self.curve}

    def write_summary(self, summary):
        """summary.json, written atomically, non-finite numbers as strings; returns what the SUMMARY
        line prints."""
        curves = self.curve_fields()
        text = json.dumps(summary | curves)
        summary = json.loads(text, parse_constant=lambda c: str(float(c)))
        curves = {k: summary.pop(k) for k in curves}
        path = self.path("summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary | curves, f)
        os.replace(path + ".tmp", path)
        return summary | {"summary_file": os.path.abspath(path)}


class Scalars:
    """CleanRL's TensorBoard charts, written to an event file in `folder` from the loop's thread
    once a second: the loop keeps each event's numbers, and the events are built and written
    together. (torch's `SummaryWriter` hands each event to a thread of its own, and each hand-off
    switched threads: 31 µs of the loop an event here. Built one by one between steps, an event
    took 25-30 µs of the loop, 6 µs in a batch.) A resumed run hides what was logged past
    `purge_step`."""

    def __init__(self, folder, flags, purge_step=None):
        from tensorboard.compat.proto import event_pb2, summary_pb2  # only with --tensorboard

        self.Event, self.Summary = event_pb2.Event, summary_pb2.Summary
        os.makedirs(folder, exist_ok=True)
        # TensorBoard's name, which ends with a count: here, of the event files already in `folder`
        count = sum(name.startswith("events.out.tfevents.") for name in os.listdir(folder))
        name = f"{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{count}"
        self.file = open(os.path.join(folder, f"events.out.tfevents.{name}"), "xb")
        self.write(self.Event(file_version="brain.Event:2"))
        if purge_step is not None:  # a session's start hides the later steps of earlier files
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self.write(self.Event(step=purge_step, session_log=start))
        self.write(self.Event(summary=self.table("hyperparameters", flags)))
        self.pending, self.flushed = [], time.monotonic()  # (step, wall time, scalars) to write

    def table(self, tag, flags):
        """`flags` as a text summary's table, as torch's `add_text` writes it (without importing
        torch's writer: 0.2 s and 300 modules)."""
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.plugins.text.metadata import create_summary_metadata

        rows = "".join(f"\n|{key}|{value}|" for key, value in flags.items())
        tensor = TensorProto(dtype="DT_STRING", string_val=[f"|param|value|\n|-|-|{rows}".encode()])
        tensor.tensor_shape.dim.add(size=1)
        metadata = create_summary_metadata(display_name=None, description=None)
        value = self.Summary.Value(tag=f"{tag}/text_summary", metadata=metadata, tensor=tensor)
        return self.Summary(value=[value])

    def write(self, event, wall_time=None):
        """One TFRecord: the length, its checksum, the event, its checksum."""
        event.wall_time = wall_time or time.time()
        data = event.SerializeToString()
        length = struct.pack("<Q", len(data))
        self.file.write(length + masked_crc32c(length) + data + masked_crc32c(data))

    def add(self, step, scalars):
        """(tag, number) pairs at `step`, one event."""
        self.pending.append((step, time.time(), scalars))
        if time.monotonic() > self.flushed + 1.0:
            self.flush()

    def flush(self):
        for step, wall_time, scalars in self.pending:
            values = [self.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars]
            if values:
                self.write(self.Event(step=step, summary=self.Summary(value=values)), wall_time)
        self.pending = []
        self.file.flush()
        self.flushed = time.monotonic()

    def add_episodes(self, step, returns):
        lengths = getattr(returns, "lengths", [])  # `Episodes` have them
        scalars = [("charts/episodic_return", r) for r in returns]
        self.add(step, scalars + [("charts/episodic_length", n) for n in lengths])

    def close(self):
        self.flush()
        self.file.close()


def masked_crc32c(data):
    """TFRecord's masked CRC-32C, 4 bytes, with google-crc32c's C function (TensorBoard's is pure
    Python)."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
