"""The run: what a training script does around its algorithm, made of small parts, each in the
module named for its purpose. A script imports what it uses, as CleanRL's scripts import
`cleanrl_utils`:

    from flags import CudaFlags, fail
    from runs import Run
    from vector_envs import evaluate, finished_episodes, make_envs, true_next_obs

- flags.py: the run flags (`RunFlags`, `CudaFlags`, `TensorEnvFlags`), their checks, `fail`;
- signals.py: Ctrl-C and SIGTERM; folders.py: runs/<run_name>/, the model and the summary;
- checkpoints.py: checkpoints and resume; logs.py: episodes, TensorBoard, divergence;
- this file: `Run`, which puts them together, with seeds, wandb, the progress bar and sps.

Beside them, by purpose: vector_envs.py (gymnasium's vector env, episodes, evaluation), threads.py
(the thread choice and bf16), seeds.py (`SeedsRun`: N members in one program, sweeps), atari.py
(`AtariRun`: envpool's games), ranks.py (`RankRun`: torchrun's ranks), tensor_envs.py (classic
control as tensors), mujoco_envs.py (MuJoCo's tasks on MuJoCo Warp). To copy one script without
them, export it (export.py): the copy has the parts it uses inlined and imports nothing from the
project.

    python leanrl/export.py leanrl/sac_continuous_action.py my_sac.py
"""

import gc
import json
import os
import random
import sys
import time

import gymnasium as gym
import numpy as np
import torch
import tqdm
from checkpoints import (
    OneProcess,
    generators,
    read_checkpoint,
    restore,
    set_generators,
    state_of,
)
from flags import check_flags, fail
from folders import RunFolder, load_model
from logs import Log
from signals import Signals


class Run:
    """A run of `script` with `args`: its flags checked, seeds, folder, wandb, signals, checkpoints,
    progress bar, sps clock, logs and summary. `main` calls it in a few named lines: `resume`,
    `progress`, `log_episodes`, `log_progress`, `checkpoint`, `stopped`, `finish`.

    `free_flags`: the script's flags that a resumed run may change (they do not change what is
    trained); `policy_flags`: the flags a saved policy must share to be evaluated (what it acts
    on); `processes`: the processes the checkpoint holds (ranks.py's `Ranks`: torchrun's)."""

    # the run flags a resumed run may change: they do not change what is trained
    FREE_FLAGS = ("total_timesteps", "track", "wandb_project_name", "wandb_entity", "cuda")
    FREE_FLAGS += ("capture_video", "save_model", "eval_episodes", "measure_burnin")
    FREE_FLAGS += ("checkpoint_minutes", "resume", "run_name", "threads", "tensorboard")

    def __init__(self, args, script, free_flags=(), policy_flags=("env_id",), processes=None):
        self.args, self.script = args, script
        self.processes = processes or OneProcess()
        self.main = self.processes.rank == 0  # the process that keeps the folder and the messages
        check_flags(self.processes.first_flags(args))
        args.exp_name = args.exp_name or script
        model = args.eval_model and load_model(args.eval_model, script, args, policy_flags)
        self.saved_model = model  # --eval-model's
        self.folder, free_flags = RunFolder(args), self.FREE_FLAGS + free_flags
        # the checkpoint of a resumed run (its folder becomes the run's), None in a fresh run
        self.saved = read_checkpoint(args, script, self.folder, free_flags, self.processes)
        self.videos = self.video_folder() if args.capture_video and self.main else None
        self.wandb = self.start_wandb() if args.track and self.main else None
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        # the thread choice, where the flags leave it to the run (threads.py's ThreadFlags)
        self.threads = args.start_threads() if hasattr(args, "start_threads") else None
        self.logs = [Log(args, quiet=not self.main)]  # one series; a seeds run's: one per member
        self.signals = Signals()
        self.start_time, self.measure_start, self.measure_step = time.time(), None, 0
        self.steps, self.resumes, self.last_iteration, self.pbar = 0, [], None, None
        self.next_checkpoint = self.start_time + 60 * (args.checkpoint_minutes or float("inf"))

    def start_wandb(self):
        """wandb's run, which gets TensorBoard's scalars as CleanRL's does; a resumed run logs to
        the same one."""
        args, wandb = self.args, __import__("wandb")  # only with --track
        run = dict(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args))
        run |= dict(
            name=os.path.basename(self.folder.dir), id=self.saved and self.saved["wandb_id"]
        )
        wandb.init(**run, resume="allow", sync_tensorboard=True)
        return wandb

    def video_folder(self):
        """runs/<run_name>/videos, once we know that this machine can record the env (a resumed
        run's recorder counts episodes from 0 again: a folder of its own keeps the first's)."""
        os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders without a display
        # torch's compiler loads triton's LLVM (CUDA builds); after Mesa's EGL has loaded its own,
        # that crashes the process, so it comes first
        __import__("torch._dynamo")
        try:
            self.check_video()
        except Exception as e:
            fail(f"--capture-video: {self.args.env_id} cannot record video here ({e!r})")
        videos = os.path.join(self.folder.dir, "videos")
        return os.path.join(videos, f"resumed-{self.saved['step']}") if self.saved else videos

    def check_video(self):
        """Raises if the env cannot draw a frame here."""
        __import__("moviepy")  # RecordVideo's writer
        env = gym.make(self.args.env_id, render_mode="rgb_array")
        env.reset(seed=0)
        assert isinstance(env.render(), np.ndarray), "no frame"

    @property
    def stopped(self):
        """A first Ctrl-C or SIGTERM, or every series diverged: the loop ends after this step."""
        return bool(self.signals.stop) or all(log.diverged for log in self.logs)

    def resume(self, state):
        """Copy the checkpoint's training state into `state` (in place), and its counters, curves
        and generators into the run; returns the iteration to start from (0 in a fresh run)."""
        saved, self.saved = self.saved, None  # the buffer once
        if saved is None:
            return 0
        own_generators, envs = saved["ranks"][self.processes.rank]
        restored = restore(state, saved["state"] | dict(envs=envs), self.args.seed + saved["step"])
        set_generators(own_generators)
        for k, log in enumerate(self.logs):
            log.curve, log.diverged = saved["curves"][k], saved["diverged"][k]
            log.returns.extend(saved["returns"][k])
        self.steps, self.start_time = saved["step"], time.time() - saved["wall_s"]
        self.resumes = saved["resumes"] + [dict(step=self.steps, fresh_episodes=not restored)]
        self.start_clock(self.steps)
        return saved["iteration"]

    def progress(self, iterations):
        """`iterations` (a range) under a progress bar; the last one ends the run. Training starts:
        the run folder and the event files are made (a resumed run's hide what the run logged past
        its checkpoint)."""
        if self.main:
            os.makedirs(self.folder.dir, exist_ok=True)
            for log in self.logs:
                log.open(os.path.join(self.folder.dir, log.name), self.resumes and self.steps)
        gc.freeze()  # the loop's full garbage collections skip what setup made (0.25 s each here)
        self.last_iteration = iterations.stop - 1
        self.pbar = tqdm.tqdm(iterations, mininterval=1.0, disable=not self.main)
        return self.threads.timed(self.pbar, self) if self.threads else self.pbar

    def checkpoint(self, iteration, state, steps):
        """After `iteration`, which brought the env steps to `steps` (every iteration tells the run
        its steps here): when due, on a first signal and at the end, `state()`, the counters and
        the generators to checkpoint.pt."""
        self.steps = steps
        final, now = iteration == self.last_iteration, time.time()
        due = final or self.signals.stop or self.processes.due(now > self.next_checkpoint)
        if not due or all(log.diverged for log in self.logs):  # never after divergence
            return
        self.next_checkpoint = now + 60 * (self.args.checkpoint_minutes or float("inf"))
        state = state_of(state())
        ranks = self.processes.gather((generators(), state.pop("envs", None)))
        if self.main:
            args = vars(self.processes.first_flags(self.args))
            saved = dict(script=self.script, args=args, iteration=iteration + 1, step=steps)
            saved |= dict(final=final, wall_s=now - self.start_time, resumes=self.resumes)
            saved |= dict(wandb_id=self.wandb and self.wandb.run.id, ranks=ranks, state=state)
            saved |= dict(curves=[log.curve for log in self.logs])
            saved |= dict(returns=[list(log.returns) for log in self.logs])
            saved |= dict(diverged=[log.diverged for log in self.logs])
            self.folder.save(saved, "checkpoint.pt")

    def start_clock(self, global_step):
        """sps counts from here: compile and warm-up are behind. Where threads are the run's to
        choose, their first trial starts here."""
        self.measure_start, self.measure_step = time.time(), global_step
        if self.threads and not self.threads.trials:
            self.threads.start(time.perf_counter(), global_step)

    def sps(self, global_step, now=None):
        """Every series' env steps per second (`global_step` counts one's) since `start_clock`;
        where the run chooses its threads, without what measuring them cost."""
        if self.measure_start:  # None before the clock starts
            seconds, steps = self.threads.left_out() if self.threads else (0.0, 0)
            seconds = (now or time.time()) - self.measure_start - seconds
            return len(self.logs) * (global_step - self.measure_step - steps) / seconds

    def log_episodes(self, global_step, returns):
        """`returns`: of the episodes that ended on this step (`Episodes`: with their lengths)."""
        self.logs[0].add_episodes(global_step, time.time() - self.start_time, returns)

    def log_progress(self, global_step, metrics):
        """Show sps and the mean return, and log `metrics` (numbers and tensors on one device) with
        `charts/SPS`, in one host sync."""
        tensors = {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)}
        values = torch.stack([*tensors.values()]).tolist() if tensors else []  # host sync
        self.show(global_step, [metrics | dict(zip(tensors, values))])

    def show(self, global_step, metrics):
        """`metrics[k]`, the numbers of series k, with `charts/SPS` once its clock has started; the
        bar shows sps and the series' mean return (of those that did not diverge)."""
        sps = self.sps(global_step)
        for log, numbers in zip(self.logs, metrics):
            log.add_metrics(global_step, numbers | ({} if sps is None else {"SPS": sps}))
        means = [np.mean(log.returns) for log in self.logs if log.returns and not log.diverged]
        if self.pbar:  # none before `progress`
            line = f"sps {sps or 0:5.0f} | return {np.mean(means) if means else np.nan:8.1f}"
            self.pbar.set_description(line, refresh=False)

    def finish(self, device, model, evaluate, **extra):
        """Save `model` (--save-model), write summary.json, play --eval-episodes with
        `evaluate(episodes, videos)`, print the SUMMARY line. A diverged run saves and plays
        nothing and exits 3; a stopped one exits as a shell reports a signal (130 or 143)."""
        args, log, summary = self.args, self.logs[0], self.summary(device)
        log.check_end(self.steps, model)
        model_file = None
        if args.save_model and not log.diverged:  # torch.load(model_file, weights_only=True)
            saved = dict(script=self.script, args=vars(args), model=model)
            model_file = self.folder.save(saved, f"{self.script}.pt")
        summary |= dict(episodes=len(log.curve), return_mean=log.return_mean())
        summary |= dict(model_file=model_file, eval_returns=[], eval_return_mean=None)
        summary |= dict(diverged=log.diverged, **extra)  # a script's own fields may override
        if args.eval_episodes and not log.diverged:
            self.folder.write_summary(summary, dict(curve=log.curve))  # kept if a signal kills
            returns = evaluate(args.eval_episodes, self.videos)
            for episode, episodic_return in enumerate(returns):
                log.add(episode, {"eval/episodic_return": episodic_return})
            summary |= dict(eval_returns=returns, eval_return_mean=float(np.mean(returns)))
        self.end(summary, dict(curve=log.curve), 3 if log.diverged else 0)

    def summary(self, device):
        """The SUMMARY's fields that every script has."""
        args, now = self.args, time.time()
        summary = dict(script=self.script, env_id=args.env_id, seed=args.seed, device=str(device))
        summary |= dict(compile=getattr(args, "compile", False), num_envs=args.num_envs)
        summary |= dict(cudagraphs=getattr(args, "cudagraphs", False), total_timesteps=self.steps)
        wall_s = now - self.start_time
        summary |= dict(
            sps=self.sps(self.steps, now), sps_wall=len(self.logs) * self.steps / wall_s
        )
        summary |= dict(wall_s=wall_s, torch_version=torch.__version__, resumes=self.resumes)
        summary["interrupted"] = self.signals.stop > 0
        return summary | (args.thread_summary(self.threads) if hasattr(args, "threads") else {})

    def end(self, summary, curves, status):
        """Print the SUMMARY line (summary.json: with the learning `curves`), close the event files
        and wandb, and exit with `status` (a signal's, if stopped)."""
        print("SUMMARY " + json.dumps(self.folder.write_summary(summary, curves)), flush=True)
        for log in self.logs:
            log.close()
        if self.wandb:
            self.wandb.finish()
        signum = self.signals.stop or self.signals.received  # or one after the last iteration
        if status or signum:
            sys.exit(status or 128 + signum)
