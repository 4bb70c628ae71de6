"""The run plumbing of the scripts beside this file: everything a training script does around its
algorithm, written once. A script imports what it uses, as CleanRL's scripts import
`cleanrl_utils`:

    from runs import Run, RunFlags, evaluate, fail, finished_episodes, make_envs

- flags: `RunFlags` (every script's run flags), `CudaFlags` (adds `--cuda`), `ThreadFlags` (adds
  `--threads`), `CPUFlags` (adds `--bf16`); a script's `Args` extends them with its algorithm's
  flags;
- envs: `make_envs` (gymnasium's vector env, videos, episode statistics), `finished_episodes`,
  `true_next_obs`, `evaluate`;
- `Run`: the run folder `runs/<run_name>/`, seeds, wandb, TensorBoard, Ctrl-C and SIGTERM,
  divergence, checkpoints and resume, the progress bar, `--save-model`, `--eval-model`, the SUMMARY
  line;
- the families extend `Run` by what they add: `SeedsRun` (N members in one program), `AtariRun`
  (envpool's games), `RankRun` (torchrun's ranks).

To copy one script without this module, export it: the copy has the parts of this module it uses
inlined and imports nothing from the project.

    python leanrl/runs.py export leanrl/sac_continuous_action.py my_sac.py
"""

import ast
import dataclasses
import itertools
import json
import os
import pickle
import random
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

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
    """train on classic control as batched tensors (tensor_envs.py) instead of gymnasium's envs"""
    tensorboard: bool = True
    """write CleanRL's TensorBoard scalars to runs/<run_name>/ (`tensorboard --logdir runs`)"""


@dataclass
class CudaFlags(RunFlags):
    cuda: bool = True
    """use a CUDA device when there is one, else the CPU"""


@dataclass
class ThreadFlags(RunFlags):
    threads: int | None = None
    """torch's intra-op threads (default: 1 or every core, whichever the run measures faster)"""


@dataclass
class CPUFlags(ThreadFlags):
    bf16: bool = False
    """compute the compiled updates in bfloat16, the weights and the optimizer's state in float32
    (needs a CPU with AMX or AVX-512 BF16)"""


def bf16_native():
    """Whether this CPU computes bfloat16 natively: AMX or AVX-512 BF16 (Linux's cpuinfo flags)."""
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def fail(message):
    """A user error: one line on stderr and exit status 2, before any training."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    sys.exit(2)


class SyncVectorEnv(gym.vector.SyncVectorEnv):
    """gymnasium's SyncVectorEnv, same-step autoreset, its step written out for what the scripts
    step, Box observations and an array of actions: the same arrays and infos at about half the
    cost of the general one, which counts where the env step is much of a step (DQN, PQN)."""

    def step(self, actions):
        box = isinstance(self.single_observation_space, gym.spaces.Box)
        if not box or not isinstance(actions, np.ndarray):
            return super().step(actions)
        infos = {}
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, info = env.step(actions[i])
            self._rewards[i], self._terminations[i] = reward, terminated
            self._truncations[i] = truncated
            if terminated or truncated:  # the episode's last obs and info, then the next's first
                infos = self._add_info(infos, {"final_obs": obs, "final_info": info}, i)
                obs, info = env.reset()
            self._env_obs[i] = self._observations[i] = obs
            if info:
                infos = self._add_info(infos, info, i)
        arrays = self._observations, self._rewards, self._terminations, self._truncations
        return *(array.copy() for array in arrays), infos


def make_envs(
    env_id,
    num_envs,
    seed,
    videos=None,
    video_episodes=None,
    wrap=None,
    tensor=False,
    device="cpu",
    compile=False,
):
    """gymnasium's vector env with same-step autoreset (the true last observation of an episode is
    in `infos`), each env counting its episodes' returns, then `wrap(env)`, the script's own
    wrappers; its first env records videos to the folder `videos`: gymnasium's schedule in
    training, the first `video_episodes` in an evaluation. With `tensor`, the same as batched
    tensors on `device` (tensor_envs.py), which take and return tensors, their step compiled whole
    with `compile` (a few envs step faster so than gymnasium's on a CPU)."""
    if tensor:
        try:
            from tensor_envs import TENSOR_ENVS, make_tensor_envs
        except ModuleNotFoundError:  # an exported copy, without leanrl/tensor_envs.py beside it
            fail("--tensor-envs needs tensor_envs.py (leanrl/tensor_envs.py) beside this script")
        if env_id not in TENSOR_ENVS:
            there = ", ".join(TENSOR_ENVS)
            fail(f"--tensor-envs: no tensor version of {env_id!r}; there are {there}")
        if videos is not None or wrap is not None:
            fail("--tensor-envs cannot record videos or take this script's env wrappers")
        envs = make_tensor_envs(env_id, num_envs, device, seed)
        envs.action_space.seed(seed)
        if compile:
            envs.step = torch.compile(envs.step, fullgraph=True)
        return envs

    def make_env(seed, video_dir):
        def thunk():
            # no render_mode without video: some envs (POPGym's) take none
            render = {} if video_dir is None else dict(render_mode="rgb_array")
            env = gym.make(env_id, **render)
            if video_dir is not None:
                record = None if video_episodes is None else lambda e: e < video_episodes
                prefix = "train" if video_episodes is None else "eval"
                env = gym.wrappers.RecordVideo(
                    env, video_dir, record, name_prefix=prefix, disable_logger=True
                )
            env = gym.wrappers.RecordEpisodeStatistics(env)
            env = wrap(env) if wrap else env
            env.action_space.seed(seed)
            return env

        return thunk

    try:
        dirs = [videos] + [None] * (num_envs - 1)
        thunks = [make_env(seed + i, dirs[i]) for i in range(num_envs)]
        envs = SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except (gym.error.Error, ModuleNotFoundError) as e:  # ModuleNotFoundError: `module:EnvId`
        fail(f"--env-id {env_id!r} cannot be made: {e}")
    envs.action_space.seed(seed)  # random actions, where an algorithm takes them
    return envs


class Episodes(list):
    """The returns of the episodes that ended on a step, and their lengths, `lengths` (a plain
    list, where no episode ended or the lengths are not known)."""

    def __init__(self, returns=(), lengths=()):
        super().__init__(returns)
        self.lengths = list(lengths)


def finished_episodes(infos):
    """The returns of every episode that ended on this step (several envs can end on one step)."""
    final_info = infos.get("final_info", {})
    if "episode" not in final_info:
        return []
    ended, episode = final_info["_episode"], final_info["episode"]
    return Episodes(episode["r"][ended].tolist(), episode["l"][ended].tolist())


def true_next_obs(next_obs, infos):
    """`next_obs` with the true final observation of each episode that ended on this step, where
    same-step autoreset put the reset one: a truncated episode bootstraps from where it was cut."""
    if isinstance(next_obs, torch.Tensor):  # the tensor envs: no host sync
        return torch.where(infos["_final_obs"][:, None], infos["final_obs"], next_obs)
    real_next_obs = next_obs.copy()
    for idx in np.flatnonzero(infos.get("_final_obs", [])):
        real_next_obs[idx] = infos["final_obs"][idx]
    return real_next_obs


def evaluate(act, envs, episodes, seed, device):
    """The returns of `episodes` episodes played on `envs` (one env, closed after) with
    `act(obs) -> actions`."""
    obs, _ = envs.reset(seed=seed)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device, dtype=torch.float))
        obs, _, _, _, infos = envs.step(actions.cpu().numpy())
        returns += finished_episodes(infos)
    envs.close()
    return returns[:episodes]


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
        self.threads = None  # the thread choice, where it is the run's to make
        if hasattr(args, "threads"):
            # a second thread speeds the updates' matmuls on an idle CPU, but a thread pool that
            # loses a core to other work waits for it at every op: without --threads, the run
            # starts on one and measures
            torch.set_num_threads(args.threads or 1)
            cores = len(os.sched_getaffinity(0))  # the cores it may use, at most OMP_NUM_THREADS
            limit = os.environ.get("OMP_NUM_THREADS", "")
            cores = min(cores, int(limit)) if limit.isdigit() and int(limit) > 0 else cores
            if args.threads is None and cores > 1:
                self.threads = ThreadChoice(cores)
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
        if getattr(args, "threads", None) is not None and args.threads <= 0:
            fail(f"--threads must be positive, got {args.threads}")
        if getattr(args, "bf16", False) and not bf16_native():
            fail("--bf16 needs a CPU with AMX or AVX-512 BF16, and this one has neither")
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
        self.last_iteration = iterations.stop - 1
        self.pbar = tqdm.tqdm(iterations, mininterval=1.0, disable=not self.main_process)
        return self.timed(self.pbar) if self.threads else self.pbar

    def open_writers(self):
        """CleanRL's TensorBoard writer, with --tensorboard: a resumed run hides what the run had
        logged past its checkpoint."""
        if self.args.tensorboard:
            purge_step = self.steps if self.resumes else None
            self.writer = summary_writer(self.dir, vars(self.args), purge_step)

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
        if isinstance(obj, SimpleNamespace):
            obj = vars(obj)
        if isinstance(obj, dict):  # what has a state: no functions
            kept = {k: v for k, v in obj.items() if hasattr(v, "state_dict") or not callable(v)}
            return {k: self.state_of(v) for k, v in kept.items()}
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
        elif isinstance(obj, (dict, SimpleNamespace)):
            items = obj.items() if isinstance(obj, dict) else vars(obj).items()
            for key, value in items:
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
            write_episodes(self.writer, global_step, returns)

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
            write_scalars(self.writer, global_step, (losses | self.sps_chart(sps)).items())
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


def summary_writer(folder, flags, purge_step=None):
    """A TensorBoard writer of `folder`, as CleanRL's scripts make it, with the hyperparameters'
    table; `purge_step`: a resumed run's first step, past which what was logged before is hidden."""
    from torch.utils.tensorboard import SummaryWriter  # only with --tensorboard

    writer = SummaryWriter(folder, purge_step=purge_step)
    rows = "\n".join(f"|{key}|{value}|" for key, value in flags.items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{rows}")
    return writer


def write_scalars(writer, step, scalars):
    """`scalars`, (tag, number) pairs, at `step` as one event, as `add_scalar` writes each: the
    writer's cost is mostly per event (about 40 µs)."""
    from tensorboard.compat.proto.summary_pb2 import Summary  # the writer's, imported with it

    values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars]
    if values:
        writer.file_writer.add_summary(Summary(value=values), step)


def write_episodes(writer, step, returns):
    """CleanRL's episode charts: each return, and each length where `returns` has them."""
    lengths = getattr(returns, "lengths", [])
    scalars = [("charts/episodic_return", r) for r in returns]
    write_scalars(writer, step, scalars + [("charts/episodic_length", n) for n in lengths])


def compiled_graphs():
    """How many graphs torch.compile has compiled in this process: torch guards compiled code on
    the thread count, so the first calls at a new count compile again, for it. Without compile,
    none, and nothing imported (torch._dynamo takes seconds to import: it would be timed)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return dynamo.counters["stats"]["unique_graphs"] if dynamo else 0


class ThreadChoice:
    """torch's intra-op threads, chosen by measurement where `--threads` does not fix them. A trial
    times the run's own iterations at one thread and at every core the process may use, in turns
    of at least `turn_seconds` and one iteration, alternately, until each count has run
    `trial_seconds`, and keeps the faster. Time in which anything compiled is not the count's: a
    turn or window that compiled starts again. After the trial, each `window_seconds` the time of
    an iteration is checked against the trial's: `band` times longer or shorter (the machine got
    busy, or idle) starts a new trial. `left_out()`: what measuring cost, which sps leaves out."""

    def __init__(
        self,
        cores,
        turn_seconds=0.25,
        trial_seconds=1.0,
        window_seconds=5.0,
        band=1.5,
        compiles=compiled_graphs,
    ):
        self.counts, self.turn_seconds, self.trial_seconds = (1, cores), turn_seconds, trial_seconds
        self.window_seconds, self.band, self.compiles = window_seconds, band, compiles
        self.trials, self.chosen, self.mark = [], None, None
        self.excluded = [0.0, 0]  # the seconds and steps left out of sps so far

    def start(self, now, step=0):
        self.seconds = {n: [0.0, 0] for n in self.counts}  # each count's timed turns, iterations
        self.spent = {n: [0.0, 0] for n in self.counts}  # and all its seconds and steps
        self.chosen, self.last = None, (now, step)
        self.turn(now, self.counts[1])

    def turn(self, now, count):
        self.count = count
        torch.set_num_threads(count)
        self.restart(now)

    def restart(self, now):
        self.mark, self.compiled = (now, 0), self.compiles()

    def tick(self, now, step):
        """After an iteration: on to the next turn, the choice or a new trial; returns a line to
        print when a trial ends."""
        if self.mark is None:
            return None
        spent = [now - self.last[0], step - self.last[1]]  # this iteration's
        self.last = (now, step)
        if self.compiles() != self.compiled:
            self.leave_out(spent)
            self.restart(now)
            return None
        start, iterations = self.mark[0], self.mark[1] + 1
        self.mark = (start, iterations)
        if self.chosen is None:  # in a trial
            self.spent[self.count] = [a + b for a, b in zip(self.spent[self.count], spent)]
            if now - start < self.turn_seconds:
                return None
            self.seconds[self.count][0] += now - start
            self.seconds[self.count][1] += iterations
            if all(t >= self.trial_seconds and n for t, n in self.seconds.values()):
                return self.choose(now, step)
            self.turn(now, self.counts[self.count == self.counts[0]])  # the other count
        elif now - start >= self.window_seconds:  # a window of the chosen count
            per_iteration = (now - start) / iterations
            if 1 / self.band < per_iteration / self.chosen[1] < self.band:
                self.restart(now)
            else:
                self.start(now, step)
        return None

    def leave_out(self, spent):
        self.excluded = [a + b for a, b in zip(self.excluded, spent)]

    def left_out(self):
        """The seconds and steps that sps leaves out: iterations that compiled (for a new count, as
        the first compile is), and each trial's iterations at the count it did not keep; of a trial
        still running, those at the count slower so far, once both have a timed turn."""
        trial = self.mark is not None and self.chosen is None
        if not trial or not all(n for _, n in self.seconds.values()):
            return tuple(self.excluded)
        ms = {n: seconds / count for n, (seconds, count) in self.seconds.items()}
        slower = max(ms, key=ms.get)
        return tuple(a + b for a, b in zip(self.excluded, self.spent[slower]))

    def choose(self, now, step):
        ms = {n: 1e3 * seconds / max(1, count) for n, (seconds, count) in self.seconds.items()}
        threads = min(ms, key=ms.get)
        self.chosen = (threads, ms[threads] / 1e3)
        self.leave_out(self.spent[self.counts[threads == self.counts[0]]])  # the other count's
        torch.set_num_threads(threads)
        self.trials.append(dict(step=step, threads=threads, ms=ms))
        self.restart(now)
        times = ", ".join(f"{n}: {t:.2f} ms" for n, t in ms.items())
        return (
            f"threads: {threads}, faster at step {step} (an iteration: {times}); --threads fixes it"
        )


# ==================================================================================================
# The seeds scripts: N independent runs (members) in one program. Member k is the single-seed
# script run with seed `seeds[k]`; the vector env holds every member's envs, member k's the k-th
# slice of its rows. A sweep: the flags a member may have of its own (a field whose default is a
# tuple) given several values make a grid of settings, each trained by `--num-seeds` members.


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
    returns = per_member(final_info["episode"]["r"], num_seeds)
    lengths = per_member(final_info["episode"]["l"], num_seeds)
    ended = per_member(final_info["_episode"], num_seeds)
    members = zip(returns, lengths, ended)
    return [Episodes(r[ends].tolist(), n[ends].tolist()) for r, n, ends in members]


def check_memory(members, per_member, what):
    """Exit status 2 if the `members` members' `what`, `per_member` bytes each, cannot fit in
    memory."""
    need = members * per_member / 2**30
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE") / 2**30
    if need > memory:
        members = f"--num-seeds: {members} members' {what} (a sweep's: of every setting)"
        fail(f"{members} need {need:.1f} GiB, the machine has {memory:.1f} GiB")


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
                self.writers.append(summary_writer(folder, member_flags, purge_step))

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
                write_episodes(writer, global_step, episodes)

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
            write_scalars(writer, global_step, (losses | self.sps_chart(sps)).items())
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


# ==================================================================================================
# The Atari scripts: envpool's games, which cannot be saved (a resumed run's games start fresh,
# seeded by its step), scored over whole games, and recorded from envpool's `render()`.


class AtariRun(Run):
    def __init__(self, args, script, free_flags=(), policy_flags=("env_id",)):
        super().__init__(args, script, free_flags, policy_flags)
        # envpool's seeds are below 2**31
        self.env_seed = (args.seed + (self.saved["step"] if self.saved else 0)) % 2**31

    def check_video(self):
        __import__("gymnasium.utils.save_video")  # the writer, moviepy's
        envs = __import__("envpool").make_gymnasium(
            self.args.env_id, num_envs=1, render_mode="rgb_array"
        )
        envs.reset()
        assert isinstance(envs.render(env_ids=[0]), np.ndarray), "no frame"
        envs.close()


def finished_games(game_returns, infos, truncations):
    """The scores of the games that ended on this step, over all their lives. envpool's info
    has no episode statistics, so `game_returns` (one per env) adds up `info["reward"]` in place."""
    game_returns += infos["reward"]
    game_over = infos["terminated"].astype(bool) | truncations
    scores = game_returns[game_over].tolist()
    game_returns[game_over] = 0.0
    return scores


def evaluate_games(act, envs, games, device):
    """The scores of `games` whole games played on `envs` (one env, closed after) with `act(obs) ->
    actions`."""
    obs, _ = envs.reset()
    game_returns, scores = np.zeros(1), []
    while len(scores) < games:
        with torch.no_grad():
            actions = act(torch.as_tensor(obs, device=device))
        obs, _, _, truncations, infos = envs.step(actions.cpu().numpy())
        scores += finished_games(game_returns, infos, truncations)
    envs.close()
    return scores[:games]


class VideoRecorder:
    """envpool's `envs`, recording the games of env 0 from `render()` to
    `<folder>/<prefix>-episode-<game>.mp4`: every game for "eval", gymnasium's schedule (games 0, 1,
    8, 27, ...) for "train". A game is a whole game, all its lives; `close()` saves one unfinished.
    The envs must be made with `render_mode="rgb_array"`."""

    def __init__(self, envs, folder, prefix):
        from gymnasium.utils.save_video import capped_cubic_video_schedule, save_video

        self.envs, self.folder, self.prefix, self.save_video = envs, folder, prefix, save_video
        self.schedule = capped_cubic_video_schedule if prefix == "train" else lambda game: True
        self.fps = 60 / envs.spec.config.frame_skip  # the console draws 60 frames a second
        self.game, self.frames = 0, []

    def __getattr__(self, name):  # the rest is envpool's
        return getattr(self.envs, name)

    def reset(self):
        obs, infos = self.envs.reset()
        self.record(infos, np.zeros(len(obs), dtype=bool))  # no game ends at a reset
        return obs, infos

    def step(self, actions):
        outcome = self.envs.step(actions)
        self.record(outcome[4], outcome[3])
        return outcome

    def recv(self):
        outcome = self.envs.recv()
        self.record(outcome[4], outcome[3])
        return outcome

    def record(self, infos, truncations):
        """env 0's frame, if it is in this batch; its video when its game ends."""
        for i in np.flatnonzero(infos["env_id"] == 0):  # async: env 0 is in some batches only
            if self.schedule(self.game):
                self.frames.append(self.envs.render(env_ids=[0])[0])
            if infos["terminated"][i] or truncations[i]:
                self.save()
                self.game += 1

    def save(self):
        if self.frames:
            self.save_video(
                self.frames,
                self.folder,
                episode_trigger=lambda game: True,  # self.frames holds only scheduled games
                name_prefix=self.prefix,
                episode_index=self.game,
                fps=self.fps,
            )
        self.frames = []

    def close(self):
        self.save()
        self.envs.close()


# ==================================================================================================
# The recurrent scripts: a policy with a state, carried from step to step.


def episode_starts(terminations, truncations, memory):
    """1 where an episode ended; 1 everywhere without `memory`."""
    dones = np.logical_or(terminations, truncations)
    return dones if memory else np.ones_like(dones)


def evaluate_recurrent(agent, envs, episodes, seed, state, memory, device):
    """The returns of `episodes` episodes on `envs` (one env, closed after) by `agent`'s most likely
    action, its state (`state`: zeros) carried from step to step and zeroed when an episode starts
    (at every step without `memory`)."""
    obs, _ = envs.reset(seed=seed)
    done = torch.full((1, 1), 0.0 if memory else 1.0, device=device)
    returns = []
    while len(returns) < episodes:
        with torch.no_grad():
            obs = torch.as_tensor(obs, device=device, dtype=torch.float)
            hidden, state = agent.get_states(obs[None], state, done)
            actions = agent.actor(hidden[0]).argmax(-1)
        obs, _, terminations, truncations, infos = envs.step(actions.cpu().numpy())
        starts = episode_starts(terminations, truncations, memory)
        done = torch.as_tensor(starts, device=device, dtype=torch.float)[None]
        returns += finished_episodes(infos)
    envs.close()
    return returns[:episodes]


# ==================================================================================================
# The torchrun script: one run in `world_size` processes (ranks). Rank 0 alone keeps the folder,
# wandb and the messages; the checkpoint holds every rank's generators and envs.


def collective(function, tensor, **kwargs):
    """`function(tensor, **kwargs)`, a collective in place. Under gloo, a lost or late rank ends
    this one with exit status 1 and one line (nccl's watchdog aborts the process instead)."""
    try:
        function(tensor, **kwargs)
    except RuntimeError as e:
        # without gloo's "[source file:line] " prefix
        cause = str(e).strip().splitlines()[0].split("] ")[-1]
        what = f"rank {torch.distributed.get_rank()}: {function.__name__} failed"
        sys.exit(f"error: {what}, another rank died or hung past --dist-timeout ({cause})")


class RankRun(Run):
    """The run of one rank. `checkpoint` is called by every rank after each iteration, with the
    signal the ranks agreed on; the learner, the same on every rank, is rank 0's."""

    def __init__(self, args, script, rank, world_size, free_flags=()):
        self.rank, self.world_size, self.main_process = rank, world_size, rank == 0
        self.signal = 0  # this rank's own first Ctrl-C or SIGTERM
        super().__init__(args, script, free_flags)

    def on_signal(self, signum, frame):
        """Only `signal`: `stop_signal`, which stops the loop, is the one the ranks agreed on, which
        the script sets on every rank alike after each iteration (an all-reduce of `signal`), so
        that a rank that gets its signal after that waits for the next iteration as the others."""
        self.signal = signum
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second signal stops at once
            signal.signal(signum, signal.SIG_DFL)

    def end(self, summary, status):
        self.stop_signal = self.stop_signal or self.signal  # a signal after the last iteration
        super().end(summary, status)

    def check_seed(self, args):  # the seed given: rank r's is seed + r * num_envs
        super().check_seed(SimpleNamespace(seed=args.seed - self.rank * args.num_envs))

    def check_resumed(self, path, saved):
        if len(saved["ranks"]) != self.world_size:
            fail(
                f"--resume {path} was trained by {len(saved['ranks'])} ranks, not {self.world_size}"
            )

    def trained_flags(self):
        """Rank 0's flags, the ones the checkpoint keeps (each rank's seed is its own)."""
        return vars(self.args) | dict(seed=self.args.seed - self.rank * self.args.num_envs)

    def own_state(self, saved):
        return dict(envs=saved["ranks"][self.rank][1])

    def own_generators(self, saved):
        return saved["ranks"][self.rank][0]

    def due(self):
        due = [super().due()]
        if self.world_size > 1:  # each rank has its own clock: rank 0's decides
            collective(torch.distributed.broadcast_object_list, due, src=0)
        return due[0]

    def gather(self, generators, state):
        own = (generators, state.pop("envs"))
        ranks = [own]
        if self.world_size > 1:  # every rank's, on rank 0
            ranks = [None] * self.world_size if self.rank == 0 else None
            collective(torch.distributed.gather_object, own, object_gather_list=ranks, dst=0)
        return dict(ranks=ranks)


# ==================================================================================================
# One file for people who copy one file: `python leanrl/runs.py export SCRIPT [OUT]`.


def top_level(source):
    """This module's definitions and import bindings: name -> (source text, the names it uses)."""
    lines, defs, imports = source.splitlines(), {}, {}
    for node in ast.parse(source).body:
        first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        text = "\n".join(lines[first - 1 : node.end_lineno])
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if isinstance(node, ast.Import | ast.ImportFrom):  # one statement for each name
            for alias in node.names:
                head = (
                    f"from {node.module} import" if isinstance(node, ast.ImportFrom) else "import"
                )
                name = alias.name + (f" as {alias.asname}" if alias.asname else "")
                imports[(alias.asname or alias.name).split(".")[0]] = f"{head} {name}"
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            defs[node.name] = (text, used)
    return defs, imports


def import_time_names(tree):
    """The names a script's top level uses as it is imported: base classes, decorators, defaults,
    module-level statements (not what its functions use when called)."""
    parts = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            parts += node.bases + node.decorator_list
            parts += [n for n in node.body if not isinstance(n, ast.FunctionDef)]
        elif isinstance(node, ast.FunctionDef):
            parts += node.decorator_list + node.args.defaults
        elif not isinstance(node, ast.Import | ast.ImportFrom | ast.If | ast.Expr):
            parts.append(node)
    return {n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)}


def inlined(script_source, module_source, module_name="runs"):
    """The names of this module that an export of `script_source` inlines: those it imports and
    those they use; and of them, the ones its top level needs as it is imported."""
    defs, _ = top_level(module_source)
    tree = ast.parse(script_source)
    wanted = [
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == module_name
        for alias in node.names
    ]

    def closure(names):
        found, todo = set(), list(names)
        while todo:
            name = todo.pop()
            if name in defs and name not in found:
                found.add(name)
                todo += defs[name][1]
        return found

    return closure(wanted), closure(set(wanted) & import_time_names(tree))


def export(script_source, module_source, module_name="runs", what="The run plumbing"):
    """`script_source` as one file: the definitions of this module it imports, and those they use,
    inlined (the ones its top level needs before its own, the rest after `main`)."""
    defs, imports = top_level(module_source)
    tree = ast.parse(script_source)
    needed, early = inlined(script_source, module_source, module_name)
    used = set().union(*(defs[name][1] for name in needed))
    lines = script_source.splitlines()
    own_imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    kept_imports = [
        "\n".join(lines[n.lineno - 1 : n.end_lineno])
        for n in own_imports
        if not (isinstance(n, ast.ImportFrom) and n.module == module_name)
    ]
    bound = {
        (alias.asname or alias.name).split(".")[0] for node in own_imports for alias in node.names
    }
    kept_imports += [imports[name] for name in sorted(used & set(imports) - bound)]
    first_def = next(n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef))
    first_def = min([d.lineno for d in first_def.decorator_list] + [first_def.lineno])
    guard = next(n.lineno for n in tree.body if isinstance(n, ast.If))
    start = own_imports[0].lineno
    banner = f"# {'=' * 98}\n# {what}, from leanrl/{module_name}.py"
    in_order = [name for name in defs if name in needed]
    before = [defs[name][0] for name in in_order if name in early]
    after = [defs[name][0] for name in in_order if name not in early]
    parts = [
        "\n".join(lines[: start - 1]).rstrip(),
        "\n".join(dict.fromkeys(kept_imports)),
        "\n\n\n".join(before),
        "\n".join(lines[first_def - 1 : guard - 1]).rstrip(),
        banner + "\n\n\n" + "\n\n\n".join(after) if after else "",
        "\n".join(lines[guard - 1 :]),
    ]
    return "\n\n\n".join(part for part in parts if part) + "\n"


def export_script(script_source, folder):
    """`export` of the optimizers (`folder`/optimizers.py) a script imports, then of the run
    module (`folder`/runs.py)."""
    with open(os.path.join(folder, "optimizers.py")) as f:
        optimizers = f.read()
    if inlined(script_source, optimizers, "optimizers")[0]:
        script_source = export(script_source, optimizers, "optimizers", "The optimizers")
    with open(os.path.join(folder, "runs.py")) as f:
        return export(script_source, f.read())


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] != "export":
        fail("usage: python leanrl/runs.py export SCRIPT [OUT] (OUT: standard output)")
    try:
        script_source = open(sys.argv[2]).read()
    except OSError as e:
        fail(f"cannot read {sys.argv[2]}: {e.strerror}")
    text = export_script(script_source, os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) == 3:
        sys.stdout.write(text)
    else:
        with open(sys.argv[3], "w") as f:
            f.write(text)
