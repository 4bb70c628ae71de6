"""Checkpoints and `--resume`: a run stopped by SIGTERM at step k and resumed ends where a run that
went through ends, bit for bit on the CPU where the envs can be saved; and the faults: a truncated,
foreign or mismatched checkpoint exits 2 in one line, a finished run is not run again."""

import copy
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_ppo_continuous_action_distributed import (
    GLOO,
    LAUNCH_TIMEOUT,
    RUNS_CWD,  # where its launches run (`conftest`'s, not `tests.conftest`'s)
    TINY,
    Finished,
    launches,  # noqa: F401 (a fixture)
    standalone,
    torchrun_command,
)

try:
    from envpool.python.envpool import EnvPoolMixin
except ImportError:  # the GPU check's machine: its CUDA tests need no envpool
    EnvPoolMixin = None
from tests.conftest import (
    ROOT,
    SCRIPTS,
    assert_same_state,
    checkpoint,
    load_script,
    requires_cuda,
    script_env,
    summary,
)

# the DQN scripts on CartPole, their target networks updated after the stop too
DQN = (
    ("--env-id", "CartPole-v1", "--total-timesteps", 500, "--learning-starts", 200),
    ("--batch-size", 32, "--buffer-size", 1000, "--target-network-frequency", 50),
)
# script -> a short run's flags and the vector step at which the stopped run gets its SIGTERM; a
# script with `--threads` fixes them: threads chosen by timing may differ between two runs
EXACT = {
    "sac_continuous_action": (
        ("--env-id", "Pendulum-v1", "--total-timesteps", 500, "--learning-starts", 200),
        ("--batch-size", 32, "--buffer-size", 1000),
        350,
    ),
    # 1 env, so the step is the vector step: the SIGTERM comes at the end of the 4th iteration, in
    # the middle of an episode, with the LSTM's state carried into the 5th
    "ppo_lstm": (
        ("--total-timesteps", 64, "--num-envs", 1, "--num-steps", 8),
        ("--num-minibatches", 1, "--update-epochs", 2),
        32,
    ),
    # 2 members; the stop leaves 4 transitions waiting for the buffer's next write
    "dqn_seeds": (
        ("--total-timesteps", 500, "--learning-starts", 200, "--num-seeds", 2, "--no-compile"),
        ("--batch-size", 32, "--buffer-size", 1000, "--target-network-frequency", 50),
        ("--threads", 1),
        355,
    ),
    # 4 iterations of 64 steps, stopped at the end of the second, in the first episode
    "ppo_continuous_action": (
        ("--env-id", "Pendulum-v1", "--total-timesteps", 256, "--num-steps", 64),
        ("--num-minibatches", 2, "--update-epochs", 2),
        128,
    ),
    # one process, without torchrun: its envs travel in the checkpoint's `ranks`; stopped in the
    # last step of its 2nd iteration
    "ppo_continuous_action_distributed": (
        ("--no-cuda", "--env-id", "Pendulum-v1", "--total-timesteps", 384, "--num-steps", 64),
        ("--num-minibatches", 2, "--update-epochs", 2),
        128,
    ),
    "td3_continuous_action_cpu": (
        ("--env-id", "Pendulum-v1", "--total-timesteps", 500, "--learning-starts", 200),
        ("--batch-size", 32, "--buffer-size", 1000, "--no-compile", "--threads", 1),
        350,
    ),
    # what each hides: the pending buffer writes (one per 10 steps, 4 due at the stop) of the twin
    # and the CPU script, the random actions' generator of the eager script, the CPU script's step
    "dqn": (*DQN, 355),
    "dqn_torchcompile": (*DQN, 355),
    "dqn_cpu": (*DQN, ("--no-compile", "--threads", 1), 355),
    # 4 iterations of 64 steps, stopped at the end of the second, in the middle of an episode
    "pqn": (
        ("--total-timesteps", 256, "--num-envs", 1, "--num-steps", 64),
        ("--num-minibatches", 2, "--update-epochs", 2),
        128,
    ),
}
EXACT["pqn_cpu"] = (*EXACT["pqn"][:2], ("--no-compile", "--threads", 1), 128)
# a sweep: 2 learning rates x 2 seeds (a key: the script, then a name of the case)
EXACT["dqn_seeds sweep"] = (*EXACT["dqn_seeds"][:2], ("--learning-rate", 1e-3, 2.5e-4), 355)


def same_runs(a, b):
    """Runs that end in the same state: the final checkpoints' training states and each process's
    envs (but the pickled envs, whose episode statistics hold clock times), steps, curves (steps
    and returns; a seeds script's: one per member) and last returns."""
    assert a["final"] and b["final"]
    envs = [[envs and (type(envs[0]), *envs[1:]) for _, envs in s["ranks"]] for s in (a, b)]
    assert_same_state(envs[0], envs[1], "envs")
    assert_same_state(a["state"], b["state"])
    assert (a["step"], a["returns"]) == (b["step"], b["returns"])
    assert [[(s, r) for s, _, r in curve] for curve in a["curves"]] == [
        [(s, r) for s, _, r in curve] for curve in b["curves"]
    ]


# one script of each family as `python leanrl/export.py` writes it: the copy resumes as well
EXPORTED = ("sac_continuous_action", "td3_continuous_action_cpu", "dqn_seeds", "ppo_lstm")
EXPORTED += ("ppo_continuous_action_distributed",)


@pytest.mark.parametrize(
    "script, copy",
    [(script, False) for script in EXACT] + [(script, True) for script in EXPORTED],
    ids=[*EXACT, *(f"{script}-exported" for script in EXPORTED)],
)
def test_a_resumed_run_ends_as_one_that_went_through(script, copy, train, tmp_path, request):
    *flags, stop_at = EXACT[script]
    script = script.split()[0]
    flags = [flag for group in flags for flag in group]
    directory = request.getfixturevalue("exported") if copy else SCRIPTS
    assert train(script, *flags, "--run-name", "through", directory=directory) == 0
    stop = dict(stop_at=stop_at, directory=directory)
    assert train(script, *flags, "--run-name", "stopped", **stop) == 143
    stopped = checkpoint(tmp_path / "runs" / "stopped")
    assert not stopped["final"] and stopped["step"] == stop_at * 1
    resume = ("--resume", tmp_path / "runs" / "stopped")
    assert train(script, *flags, *resume, directory=directory) == 0
    resumed = checkpoint(tmp_path / "runs" / "stopped")
    assert resumed["resumes"] == [dict(step=stop_at, fresh_episodes=False)]
    same_runs(checkpoint(tmp_path / "runs" / "through"), resumed)


# the twins under CUDA graphs: script -> EXACT's entry for its eager script
GRAPHED = ("--compile", "--cudagraphs")
EXACT_GRAPHED = {
    "sac_continuous_action_torchcompile": (*EXACT["sac_continuous_action"][:2], GRAPHED, 350),
    "ppo_continuous_action_torchcompile": (*EXACT["ppo_continuous_action"][:2], GRAPHED, 128),
    "dqn_torchcompile": (*DQN, GRAPHED, 355),
}


@requires_cuda
@pytest.mark.parametrize("script", EXACT_GRAPHED)
def test_a_run_resumed_under_cuda_graphs_ends_as_one_that_went_through(script, train, tmp_path):
    """The restore writes into the tensors the recorded graphs read (parameters, optimizer state,
    tensor learning rates) and the CUDA generators: the resumed run records its graphs afresh and
    ends, on the same GPU, as the run that went through."""
    *flags, stop_at = EXACT_GRAPHED[script]
    flags = [flag for group in flags for flag in group]
    assert train(script, *flags, "--run-name", "through") == 0
    assert train(script, *flags, "--run-name", "stopped", stop_at=stop_at) == 143
    assert train(script, *flags, "--resume", tmp_path / "runs" / "stopped") == 0
    resumed = checkpoint(tmp_path / "runs" / "stopped")
    assert resumed["resumes"] == [dict(step=stop_at, fresh_episodes=False)]
    same_runs(checkpoint(tmp_path / "runs" / "through"), resumed)


# script -> a tiny run's flags: stopped by a SIGTERM at its 20th vector step, then resumed
TINY_SEEDS = ("--num-seeds", 2, "--no-compile", "--batch-size", 8, "--buffer-size", 100)
TINY_PENDULUM = ("--env-id", "Pendulum-v1", "--total-timesteps", 50, "--learning-starts", 30)
TINY_PPO_SEEDS = ("--num-seeds", 2, "--no-compile", "--env-id", "Pendulum-v1", "--num-steps", 16)
TINY_PPO_SEEDS += ("--num-minibatches", 2, "--update-epochs", 1)
PENDULUM = ("--env-id", "Pendulum-v1", "--total-timesteps", 100, "--learning-starts", 10)
PENDULUM += ("--batch-size", 32, "--buffer-size", 1000)
CARTPOLE = ("--env-id", "CartPole-v1", "--total-timesteps", 100, "--learning-starts", 10)
CARTPOLE += ("--batch-size", 32, "--buffer-size", 1000)
PPO = ("--env-id", "Pendulum-v1", "--total-timesteps", 192, "--num-steps", 64)
PPO += ("--num-minibatches", 2, "--update-epochs", 1)
ATARI = ("--num-envs", 2, "--num-steps", 16, "--total-timesteps", 96, "--num-minibatches", 2)
ATARI += ("--update-epochs", 1)
RECURRENT = ("--total-timesteps", 96, "--num-envs", 2, "--num-steps", 8)
PQN = ("--total-timesteps", 160, "--num-steps", 8, "--num-minibatches", 2, "--update-epochs", 1)
RECURRENT += ("--num-minibatches", 1, "--update-epochs", 1)
SMOKE = {
    "sac_continuous_action_torchcompile": PENDULUM,
    "sac_continuous_action_cpu": (*PENDULUM, "--no-compile"),
    "td3_continuous_action": PENDULUM,
    "td3_continuous_action_torchcompile": PENDULUM,
    "td3_continuous_action_cpu": (*PENDULUM, "--no-compile"),
    "dqn": CARTPOLE,
    "dqn_torchcompile": CARTPOLE,
    "dqn_cpu": (*CARTPOLE, "--no-compile"),
    "ppo_continuous_action": PPO,
    "ppo_continuous_action_torchcompile": PPO,
    "ppo_continuous_action_cpu": (*PPO, "--no-compile"),
    "ppo_lstm": RECURRENT,
    "ppo_lstm_torchcompile": RECURRENT,
    "ppo_mingru": RECURRENT,
    "ppo_mingru_torchcompile": RECURRENT,
    "dqn_seeds": (*TINY_SEEDS, "--total-timesteps", 60, "--learning-starts", 10),
    "sac_continuous_action_seeds": (*TINY_SEEDS, *TINY_PENDULUM),
    "td3_continuous_action_seeds": (*TINY_SEEDS, *TINY_PENDULUM),
    "ppo_continuous_action_seeds": (*TINY_PPO_SEEDS, "--total-timesteps", 64),
    "ppo_atari_envpool": ATARI,
    "ppo_atari_envpool_torchcompile": ATARI,
    "ppo_atari_envpool_async": ATARI,
    "pqn": PQN,
    "pqn_torchcompile": PQN,
    "pqn_cpu": (*PQN, "--no-compile"),
    "pqn_atari_envpool": ATARI,
    "pqn_atari_envpool_torchcompile": ATARI,
}
# what the `train` fixture counts where a vector step is not vector_envs.py's SyncVectorEnv.step (a
# class of the script by its name, or envpool's step, or the async script's recv of a batch), and
# the scripts whose envs cannot be saved
COUNTED = {
    "ppo_continuous_action_seeds": ("EnvpoolWrappers", "step"),
    "ppo_atari_envpool": (EnvPoolMixin, "step"),
    "ppo_atari_envpool_torchcompile": (EnvPoolMixin, "step"),
    "ppo_atari_envpool_async": (EnvPoolMixin, "recv"),
    "pqn_atari_envpool": (EnvPoolMixin, "step"),
    "pqn_atari_envpool_torchcompile": (EnvPoolMixin, "step"),
}
FRESH_EPISODES = ("ppo_continuous_action_seeds", *(s for s in COUNTED if "atari" in s))


@pytest.mark.parametrize("script", SMOKE)
def test_a_run_stopped_by_sigterm_resumes_to_its_end(script, train):
    """Stopped between its first and last step, resumed with --resume auto, the run reaches its
    end with one entry in `resumes`, which says whether its episodes started fresh."""
    counted = COUNTED.get(script)
    flags = (*SMOKE[script], "--run-name", "run")
    assert train(script, *flags, stop_at=20, counted=counted) == 143
    stopped = checkpoint("runs/run")
    assert not stopped["final"] and 20 <= stopped["step"] < stopped["args"]["total_timesteps"]
    assert train(script, *flags, "--resume", "auto", counted=counted) == 0
    resumed = checkpoint("runs/run")
    assert resumed["final"] and resumed["step"] == resumed["args"]["total_timesteps"]
    fresh = script in FRESH_EPISODES
    assert resumed["resumes"] == [dict(step=stopped["step"], fresh_episodes=fresh)]


def test_an_envpool_run_resumes_its_learner_and_statistics_with_fresh_episodes(train):
    """ppo_continuous_action_seeds: resumed with --total-timesteps at the checkpoint's step, no
    iteration is left and the saved models are the learner as the checkpoint restored it; each
    member's observation statistics went on from the checkpoint's by the fresh episodes' first
    observation."""
    script, flags = "ppo_continuous_action_seeds", (*TINY_PPO_SEEDS, "--total-timesteps")
    stop = dict(stop_at=20, counted=COUNTED[script])  # in the second 16-step rollout
    assert train(script, *flags, 64, "--run-name", "run", **stop) == 143
    stopped = checkpoint("runs/run")
    assert stopped["step"] == 32 and stopped["ranks"][0][1][0] is None  # its envs: not saved
    resume = ("--save-model", "--resume", "runs/run")
    assert train(script, *flags, 32, *resume, counted=COUNTED[script]) == 0
    summary = json.loads(Path("runs/run/summary.json").read_text())
    assert summary["resumes"] == [dict(step=32, fresh_episodes=True)]
    params = stopped["state"]["learner"]["params"]
    count = stopped["state"]["normalization"]["obs_rms"][2]
    assert len(summary["model_files"]) == 2
    for member, model_file in enumerate(summary["model_files"]):
        model = torch.load(model_file, weights_only=True)["model"]
        assert_same_state(model["agent"], {name: p[member] for name, p in params.items()})
        assert float(model["obs_rms"]["count"]) == pytest.approx(count + 1)  # float32


SHORT = ("--env-id", "Pendulum-v1", "--total-timesteps", 300, "--learning-starts", 100)
SHORT += ("--batch-size", 32, "--buffer-size", 1000)


@pytest.mark.slow  # two runs that record videos (19 s here)
def test_a_resumed_run_records_its_videos_beside_the_first(train, tmp_path):
    """A video recorder cannot be saved, so the resumed run's counts episodes from 0 again: its
    videos go to a folder of their own, and the stopped run's stay as they were."""
    flags = (*DQN[0], "--capture-video", "--eval-episodes", 0, "--run-name", "job")
    assert train("dqn", *flags, stop_at=150) == 143
    videos = tmp_path / "runs" / "job" / "videos"
    first = (videos / "train-episode-0.mp4").read_bytes()
    assert train("dqn", *flags, "--resume", "auto") == 0
    assert (videos / "train-episode-0.mp4").read_bytes() == first
    assert (videos / "resumed-150" / "train-episode-0.mp4").stat().st_size > 1000
    assert checkpoint(tmp_path / "runs" / "job")["resumes"] == [dict(step=150, fresh_episodes=True)]


def assert_one_error_line(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for word in words:
        assert word in err[0], err[0]


def test_resume_auto_starts_then_continues_and_a_finished_run_is_not_run_again(train, capsys):
    """The cluster's requeue: the same command line starts the run, then continues it after a
    SIGTERM; once finished, it says so and exits 0. A named folder that holds a checkpoint is not
    overwritten by a run without --resume."""
    flags = (*SHORT, "--run-name", "job", "--resume", "auto")
    assert train("sac_continuous_action", *flags, stop_at=150) == 143
    assert checkpoint("runs/job")["step"] == 150
    assert train("sac_continuous_action", *flags) == 0
    saved = checkpoint("runs/job")
    assert saved["final"] and saved["step"] == 300 and len(saved["resumes"]) == 1
    capsys.readouterr()
    assert train("sac_continuous_action", *flags) == 0
    assert "the run finished at step 300; nothing to resume" in capsys.readouterr().out
    assert train("sac_continuous_action", *SHORT, "--run-name", "job") == 2
    assert_one_error_line(capsys, "runs/job/checkpoint.pt exists", "--resume auto")
    # --total-timesteps may grow: the finished run goes on from its last step
    assert train("sac_continuous_action", *flags[:3], 400, *flags[4:]) == 0
    assert checkpoint("runs/job")["step"] == 400
    assert checkpoint("runs/job")["resumes"][-1] == dict(step=300, fresh_episodes=False)


def test_bad_checkpoints_exit_2_in_one_line(train, capsys, tmp_path):
    """A truncated, foreign or mismatched checkpoint, and --resume auto without a name, exit 2
    before training; a temporary file left by a write that was killed is ignored."""
    assert train("sac_continuous_action", *SHORT, "--run-name", "a", stop_at=150) == 143
    good = (tmp_path / "runs/a/checkpoint.pt").read_bytes()
    (tmp_path / "runs/a/checkpoint.pt.tmp").write_bytes(good[: len(good) // 2])
    capsys.readouterr()
    mismatched = [*SHORT[:-1], 999]
    assert train("sac_continuous_action", *mismatched, "--resume", "runs/a") == 2
    assert_one_error_line(capsys, "--buffer-size 1000")
    torch.save(checkpoint("runs/a") | dict(script="td3_continuous_action"), "td3.pt")
    assert train("sac_continuous_action", *SHORT, "--resume", "td3.pt") == 2
    assert_one_error_line(capsys, "written by td3_continuous_action")
    assert train("sac_continuous_action", *SHORT, "--resume", "auto") == 2
    assert_one_error_line(capsys, "--resume auto needs --run-name")
    (tmp_path / "truncated.pt").write_bytes(good[: len(good) // 2])
    (tmp_path / "foreign.pt").write_bytes(b"not a checkpoint")
    for path in ("truncated.pt", "foreign.pt", "missing.pt"):
        assert train("sac_continuous_action", *SHORT, "--resume", path) == 2
        assert_one_error_line(capsys, f"--resume {path} is not a checkpoint")
    assert train("sac_continuous_action", *SHORT, "--resume", "runs/a/checkpoint.pt") == 0
    assert checkpoint("runs/a")["step"] == 300


def test_a_checkpoint_gives_back_every_field_and_refuses_an_older_format(make_run, capsys):
    """`Run.checkpoint` writes every field of `checkpoints.Checkpoint` (with its format) and no
    other; a run that resumes it reads each one back as the first run had it and restores the
    state in place; a checkpoint of the format before (it had no number: 1) exits 2 in one line."""
    checkpoints = load_script("checkpoints")
    flags = dict(run_name="a", tensorboard=False, total_timesteps=500)
    run = make_run("sac_continuous_action", **flags)
    run.progress(range(3))
    run.log_episodes(5, [1.5])
    run.signals.received = signal.SIGTERM  # a checkpoint now, before the last iteration
    run.checkpoint(0, lambda: dict(learner=dict(w=torch.arange(3.0))), 7)
    written = checkpoint("runs/a")
    fields = [field.name for field in dataclasses.fields(checkpoints.Checkpoint)]
    assert sorted(written) == sorted(fields)
    assert written["version"] == checkpoints.Checkpoint.FORMAT == 2
    resumed = make_run("sac_continuous_action", resume="auto", **flags)
    read = resumed.last_checkpoint
    assert_same_state(vars(read), written)
    expected = dict(script="sac_continuous_action", args=vars(run.args), iteration=1, step=7)
    expected |= dict(final=False, resumes=[], wandb_id=None, returns=[[1.5]], diverged=[None])
    assert {key: getattr(read, key) for key in expected} == expected
    assert [[(step, r) for step, _, r in curve] for curve in read.curves] == [[(5, 1.5)]]
    assert read.ranks[0][1] is None and len(read.ranks) == 1  # no envs named
    assert resumed.folder.dir == os.path.abspath("runs/a") and read.wall_s >= 0
    state = dict(learner=dict(w=torch.zeros(3)))
    assert resumed.resume(state) == 1 and resumed.steps == 7
    assert torch.equal(state["learner"]["w"], torch.arange(3.0))
    assert resumed.resumes == [dict(step=7, fresh_episodes=True)]
    older = {key: value for key, value in written.items() if key != "version"}
    torch.save(older, "older.pt")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        make_run("sac_continuous_action", resume="older.pt", total_timesteps=500)
    assert stop.value.code == 2
    assert_one_error_line(capsys, "--resume older.pt is a checkpoint of format 1", "read 2")


def test_the_slurm_batch_script_checkpoints_requeues_and_continues(tmp_path):
    """docs/slurm/train.sbatch as Slurm would run it, without Slurm: signalled as `--signal=B:TERM`
    does, it checkpoints, exits 0 and asks `scontrol` (a stand-in) to requeue the job; started
    again as the requeued job, it continues the run to its end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # this interpreter (a script, not a link: a link to a virtual env's python loses the env)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n')
    for tool in ("python", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "leanrl").symlink_to(SCRIPTS)
    env = script_env() | dict(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="42")
    env |= dict(SCONTROL_LOG=str(tmp_path / "scontrol.log"), RUN_NAME="job", OMP_NUM_THREADS="1")
    batch = ["bash", str(ROOT / "docs" / "slurm" / "train.sbatch"), *map(str, SHORT)]
    total = batch.index("--total-timesteps") + 1  # where each start puts its budget
    job = subprocess.Popen(
        [*batch[:total], "100000", *batch[total + 1 :], "--checkpoint-minutes", "0.005"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    saved = tmp_path / "runs" / "job" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not saved.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-2000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 42\n"
    stopped = checkpoint(tmp_path / "runs" / "job")
    assert '"interrupted": true' in out and not stopped["final"] and stopped["step"] > 0
    end = stopped["step"] + 200
    again = subprocess.run(
        [*batch[:total], str(end), *batch[total + 1 :]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = checkpoint(tmp_path / "runs" / "job")
    assert resumed["final"] and resumed["step"] == end
    assert resumed["resumes"] == [dict(step=stopped["step"], fresh_episodes=False)]


def test_a_checkpoint_keeps_the_filled_part_of_the_buffer():
    """A 1M-transition buffer holding 5 saves 5 rows (not the storage of the whole buffer), and
    they load back into an empty buffer."""
    module = load_script("sac_continuous_action")
    rb = module.ReplayBuffer(1_000_000, 3, 1, torch.device("cpu"))
    for step in range(5):
        obs = torch.full((1, 3), float(step))
        rb.add(dict(obs=obs, next_obs=obs + 1, actions=obs[:, :1], rewards=[1.0], terminations=[0]))
    saved = io.BytesIO()
    torch.save(rb.state_dict(), saved)
    assert saved.tell() < 10_000
    saved.seek(0)
    empty = module.ReplayBuffer(1_000_000, 3, 1, torch.device("cpu"))
    empty.load_state_dict(torch.load(saved))
    assert (empty.size, empty.cursor) == (5, 5)
    assert torch.equal(empty.storage["next_obs"][:5, 0], torch.arange(1.0, 6.0))


@pytest.mark.parametrize("script", ["ppo_lstm_torchcompile", "ppo_continuous_action_torchcompile"])
def test_a_tensor_learning_rate_is_restored_in_place(script):
    """The PPO twins anneal a tensor learning rate in place, and a CUDA graph reads it there:
    restoring their optimizer copies the checkpoint's rate into that tensor."""
    checkpoints = load_script("checkpoints")
    lr = torch.tensor(1e-3)
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=lr)
    saved = checkpoints.state_of(dict(optimizer=optimizer))
    resumed_lr = torch.tensor(5e-4)
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=resumed_lr)
    checkpoints.restore(dict(optimizer=optimizer), saved, seed=1)
    assert optimizer.param_groups[0]["lr"] is resumed_lr and torch.equal(resumed_lr, lr)


def test_fresh_episodes_start_with_a_zero_recurrent_state():
    """Envs that a checkpoint could not hold start fresh episodes: the observations of a reset, no
    episode start flagged and the LSTM's state (h, c) zeroed, where they are."""
    module = load_script("ppo_lstm")
    envs = module.make_envs("CartPole-v1", 2, 1, wrap=module.observation_wrap((0, 2)))
    carried = (envs, torch.ones(2, 2), torch.ones(2), torch.ones(2, 128), torch.ones(2, 128))
    saved = (None, *(x.clone() for x in carried[1:]))
    load_script("checkpoints").restore(carried, saved, seed=7)
    expected = module.make_envs("CartPole-v1", 2, 1, wrap=module.observation_wrap((0, 2)))
    expected = expected.reset(seed=7)[0]
    assert torch.equal(carried[1], torch.as_tensor(expected, dtype=torch.float))
    assert all(not x.any() for x in carried[2:])


def test_a_resumed_atari_run_gets_its_learner_back_and_fresh_games(train, tmp_path, monkeypatch):
    """envpool's envs cannot be saved: the resumed run loads the checkpoint's network and optimizer
    (recorded as their `load_state_dict` leaves them), goes on from the checkpoint's step, curve and
    learning-rate schedule, and says that its games started fresh."""
    script, counted = "ppo_atari_envpool_torchcompile", (EnvPoolMixin, "step")
    flags = (*ATARI, "--total-timesteps", 128, "--run-name", "job")
    assert train(script, *flags, stop_at=40, counted=counted) == 143  # in the 3rd of 4 iterations
    stopped = checkpoint(tmp_path / "runs" / "job")
    assert stopped["step"] == 96 and stopped["iteration"] == 3  # the next, counted from 0
    loaded = {}
    for cls in (torch.nn.Module, torch.optim.Optimizer):
        load = cls.load_state_dict

        def recorded(obj, state, *args, load=load, **kwargs):
            out = load(obj, state, *args, **kwargs)
            loaded[type(obj).__name__] = copy.deepcopy(obj.state_dict())
            return out

        monkeypatch.setattr(cls, "load_state_dict", recorded)
    assert train(script, *flags, "--resume", "auto", counted=counted) == 0
    learner = stopped["state"]["learner"]
    assert_same_state(loaded["Agent"], learner["agent"])
    assert_same_state(loaded["Adam"], learner["optimizer"])
    assert loaded["Adam"]["state"][0]["step"] == 6  # 3 iterations of 1 epoch of 2 minibatches
    resumed = checkpoint(tmp_path / "runs" / "job")
    assert resumed["resumes"] == [dict(step=96, fresh_episodes=True)]
    assert (
        resumed["step"] == 128
        and resumed["curves"][0][: len(stopped["curves"][0])] == stopped["curves"][0]
    )
    # the last of 4 iterations anneals the learning rate to a quarter
    lr = resumed["state"]["learner"]["optimizer"]["param_groups"][0]["lr"]
    assert float(lr) == pytest.approx(2.5e-4 / 4)


def test_two_ranks_stopped_by_sigterm_resume_to_their_end(launches):  # noqa: F811
    """torchrun forwards a SIGTERM to both ranks, which stop after the same iteration; rank 0 alone
    writes the checkpoint, with each rank's generators and envs. The same command line, with more
    steps, goes on from there on both ranks, in lockstep, to its end."""
    name = "two-ranks-resumed"
    flags = (*TINY, *GLOO, "--dist-timeout", 30, "--run-name", name, "--resume", "auto")
    run = launches(torchrun_command(*standalone(2), *flags, "--total-timesteps", 10_000_000))
    assert run.wait_for(r"sps +\d+", timeout=LAUNCH_TIMEOUT), run.output[-3000:]
    run.proc.send_signal(signal.SIGTERM)
    run.finish(timeout=90)
    stopped = checkpoint(Path(RUNS_CWD) / "runs" / name)
    # whole iterations of 2 ranks x 64 steps
    assert not stopped["final"] and stopped["step"] > 0 and stopped["step"] % 128 == 0
    assert [type(envs) for _, (envs, _) in stopped["ranks"]] == [bytes, bytes]
    total = stopped["step"] + 2 * 128
    run = launches(torchrun_command(*standalone(2), *flags, "--total-timesteps", total))
    assert run.finish() == 0, run.output[-3000:]
    result = summary(Finished(0, run.output))
    assert result["total_timesteps"] == total and result["parameter_spread"] == 0.0
    assert result["resumes"] == [dict(step=stopped["step"], fresh_episodes=False)]
