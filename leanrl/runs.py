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

import dataclasses
import gc
import json
import os
import sys
import time

import gymnasium as gym
import numpy as np
import torch
import tqdm
from checkpoints import (
    Checkpoint,
    OneProcess,
    generators,
    read_checkpoint,
    restore,
    seed_generators,
    set_generators,
    state_of,
)
from flags import check_flags, fail
from folders import RunFolder, load_model, named_folder
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
        self.script = script
        # a copy: the caller's args stay as given
        self.args = dataclasses.replace(args, exp_name=args.exp_name or script)
        self.processes = processes or OneProcess()
        self.main = self.processes.rank == 0  # the process that keeps the folder and the messages
        check_flags(self.processes.first_flags(self.args))
        # --eval-model's policy, which the run plays instead of training (None without it)
        self.saved_model = load_model(args, script, policy_flags) if args.eval_model else None
        free = self.FREE_FLAGS + free_flags
        named = named_folder(self.args)
        # the checkpoint a resumed run continues (None in a fresh run), and the folder it lives in
        checkpoint, folder = read_checkpoint(self.args, script, named, free, self.processes)
        self.last_checkpoint = checkpoint
        self.folder = RunFolder(folder)
        self.videos = self.video_folder() if args.capture_video and self.main else None
        self.wandb = self.start_wandb() if args.track and self.main else None
        seed_generators(args.seed, args.torch_deterministic)
        # the thread choice, where the flags leave it to the run (threads.py's ThreadFlags)
        self.threads = args.start_threads() if hasattr(args, "start_threads") else None
        self.logs = [Log(self.args, quiet=not self.main)]  # one series; a seeds run's: one each
        self.signals = Signals()
        self.start_time, self.measure_start, self.measure_step = time.time(), None, 0
        self.steps, self.resumes, self.last_iteration, self.pbar = 0, [], None, None
        self.next_checkpoint = self.start_time + 60 * (args.checkpoint_minutes or float("inf"))

    def start_wandb(self):
        """wandb's run, which gets TensorBoard's scalars as CleanRL's does; a resumed run logs to
        the same one."""
        args, wandb = self.args, __import__("wandb")  # only with --track
        run = dict(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args))
        resumed = self.last_checkpoint and self.last_checkpoint.wandb_id
        run |= dict(name=os.path.basename(self.folder.dir), id=resumed)
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
        videos, checkpoint = os.path.join(self.folder.dir, "videos"), self.last_checkpoint
        return os.path.join(videos, f"resumed-{checkpoint.step}") if checkpoint else videos

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
        checkpoint, self.last_checkpoint = self.last_checkpoint, None  # the buffer once
        if checkpoint is None:
            return 0
        own_generators, envs = checkpoint.ranks[self.processes.rank]
        restore(state, checkpoint.state | dict(envs=envs), self.args.seed + checkpoint.step)
        set_generators(own_generators)
        series = zip(self.logs, checkpoint.curves, checkpoint.diverged, checkpoint.returns)
        for log, curve, diverged, returns in series:
            log.curve, log.diverged = curve, diverged
            log.returns.extend(returns)
        self.steps, self.start_time = checkpoint.step, time.time() - checkpoint.wall_s
        fresh_episodes = envs is None or envs[0] is None  # envs that could not be saved
        self.resumes = checkpoint.resumes + [dict(step=self.steps, fresh_episodes=fresh_episodes)]
        self.start_clock(self.steps)
        return checkpoint.iteration

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
        envs = state.pop("envs", None)  # each process's own
        ranks = self.processes.gather((generators(), envs))
        if not self.main:
            return
        checkpoint = Checkpoint(
            script=self.script,
            args=vars(self.processes.first_flags(self.args)),
            iteration=iteration + 1,
            step=steps,
            final=final,
            wall_s=now - self.start_time,
            resumes=self.resumes,
            wandb_id=self.wandb and self.wandb.run.id,
            state=state,
            ranks=ranks,
            curves=[log.curve for log in self.logs],
            returns=[list(log.returns) for log in self.logs],
            diverged=[log.diverged for log in self.logs],
        )
        self.folder.save(vars(checkpoint), "checkpoint.pt")

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

    def finish(self, device, model, evaluate, results=None, report=None, **extra):
        """Save `model` (--save-model), write summary.json, play --eval-episodes with
        `evaluate(episodes, videos)`, print the SUMMARY line with the script's `extra` fields. A
        diverged series (the run, or a member) saves and plays nothing; a run whose every series
        diverged exits 3; a stopped one, once evaluated, as a shell reports a signal (130, 143).
        A seeds run (seeds.py) gives its members' as lists and its own `results(files, returns)`,
        the fields of their model files and evaluation returns ([] before; `run_results` by
        default), and `report(summary)`, what it prints before the SUMMARY (a sweep's table)."""
        members = isinstance(model, list)
        models, evaluates = (model, evaluate) if members else ([model], [evaluate])
        results, logs = results or self.run_results, self.logs
        summary = self.summary(device)
        for log, policy in zip(logs, models):
            log.check_end(self.steps, policy)
        saved = [self.args.save_model and not log.diverged for log in logs]
        files = [
            self.folder.save_model(self.script, log, policy) if save else None
            for log, policy, save in zip(logs, models, saved)
        ]
        summary |= results(files, []) | extra  # a script's own fields may override
        curves = dict(curves=[log.curve for log in logs]) if members else dict(curve=logs[0].curve)
        if self.args.eval_episodes:
            self.folder.write_summary(summary, curves)  # kept if a second signal kills the run
            played = [self.play(log, evaluate) for log, evaluate in zip(logs, evaluates)]
            summary |= results(files, played) | extra
        if report:
            report(summary)
        self.end(summary, curves, 0 if any(not log.diverged for log in logs) else 3)

    def play(self, log, evaluate):
        """The returns of `evaluate(episodes, videos)` for series `log` (None where it diverged),
        logged as `eval/episodic_return`; a member's videos go to a folder of its own."""
        if log.diverged:
            return None
        videos = os.path.join(self.videos, log.name) if self.videos and log.name else self.videos
        returns = evaluate(self.args.eval_episodes, videos)
        for episode, episodic_return in enumerate(returns):
            log.add(episode, {"eval/episodic_return": episodic_return})
        return returns

    def run_results(self, files, returns):
        """A single run's fields of its model file and evaluation `returns` (one list, or none)."""
        log, played = self.logs[0], returns[0] if returns else None
        summary = dict(episodes=len(log.curve), return_mean=log.return_mean(), model_file=files[0])
        mean = float(np.mean(played)) if played else None
        summary |= dict(eval_returns=played or [], eval_return_mean=mean)
        return summary | dict(diverged=log.diverged)

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
