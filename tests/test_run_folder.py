"""What a CleanRL user expects of every script: a run folder with the whole summary, `--save-model`,
`--eval-episodes` after training or of a saved model (`--eval-model`, also one saved by another
script of the same algorithm), `--capture-video`, and a Ctrl-C or SIGTERM that stops cleanly.
`conftest.summary` checks on every run that summary.json holds what the SUMMARY line printed."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    SCRIPTS,
    assert_user_error,
    load_script,
    run_script,
    script_env,
    slow_unless,
    summary,
)

PENDULUM = ("--env-id", "Pendulum-v1")
RECURRENT = tuple("--total-timesteps 96 --num-envs 2 --num-steps 8 --num-minibatches 1".split())
# tiny training runs that reach the updates, per algorithm; the first two flags, where they name the
# env, are what a replay of the saved model needs
OFF_POLICY = (*PENDULUM, *"--total-timesteps 600 --learning-starts 500 --batch-size 32".split())
BUDGETS = {"sac_continuous_action": OFF_POLICY, "td3_continuous_action": OFF_POLICY}
BUDGETS["dqn"] = ("--total-timesteps", "1500", "--learning-starts", "1000")
BUDGETS["ppo_continuous_action"] = (*PENDULUM, *"--total-timesteps 640 --num-steps 64".split())
BUDGETS["ppo_continuous_action"] += ("--num-minibatches", "2")
BUDGETS |= dict.fromkeys(["ppo_lstm", "ppo_mingru"], (*RECURRENT, "--update-epochs", "1"))
ATARI = tuple("--total-timesteps 512 --num-steps 32 --num-minibatches 2 --update-epochs 1".split())
# each algorithm's scripts in a ring: a model one of them saves is replayed by the next one
FAMILIES = {algo: ["", "_torchcompile", "_cpu"] for algo in list(BUDGETS)[:4]}
FAMILIES |= {"ppo_lstm": ["", "_torchcompile"], "ppo_mingru": ["", "_torchcompile"]}
RING = [
    (f"{algo}{suffixes[i]}", f"{algo}{suffixes[(i + 1) % len(suffixes)]}", algo)
    for algo, suffixes in FAMILIES.items()
    for i in range(len(suffixes))
]


def saved(result):
    """The model file a run saved, loaded as a user would: `weights_only=True`."""
    path = Path(result["model_file"])
    assert path.name == f"{result['script']}.pt"
    assert path.parent == Path(result["summary_file"]).parent
    return torch.load(path, weights_only=True)


def training_flags(script, algo):
    """`BUDGETS[algo]`; a CPU script trains without compiling (what it compiles does not change the
    run folder)."""
    return (*BUDGETS[algo], *(("--no-compile",) if script.endswith("_cpu") else ()))


# the quick tier keeps each family's first link (its eager script's model, replayed by its twin)
@pytest.mark.parametrize(
    "script, replayer, algo",
    slow_unless(lambda link: link[0] == link[2], RING, [f"{s}->{r}" for s, r, _ in RING]),
)
def test_a_saved_model_evaluates_as_the_live_policy_also_in_a_sibling_script(
    script, replayer, algo, tmp_path
):
    """Train, save and evaluate 2 episodes; the next script of the algorithm (eager -> twin -> CPU
    -> eager) evaluates the saved file to the same returns (float32 rounding of the sums)."""
    flags = (*training_flags(script, algo), "--save-model", "--eval-episodes", "2")
    trained = summary(run_script(script, *flags, cwd=tmp_path))
    assert trained["interrupted"] is False and len(trained["eval_returns"]) == 2
    assert trained["diverged"] is None
    assert trained["eval_return_mean"] == pytest.approx(np.mean(trained["eval_returns"]))
    checkpoint = saved(trained)
    assert checkpoint["script"] == script and checkpoint["args"]["env_id"] == trained["env_id"]
    leaves = torch.utils._pytree.tree_leaves(checkpoint["model"])
    assert all(isinstance(value, torch.Tensor) for value in leaves)
    env_flags = BUDGETS[algo][:2] if BUDGETS[algo][0] == "--env-id" else ()
    flags = (*env_flags, "--eval-model", trained["model_file"], "--eval-episodes", "2")
    replayed = summary(run_script(replayer, *flags, cwd=tmp_path))
    assert replayed["script"] == replayer
    assert replayed["eval_returns"] == pytest.approx(trained["eval_returns"], rel=1e-5)
    assert (replayed["total_timesteps"], replayed["episodes"], replayed["model_file"]) == (
        0,
        0,
        None,
    )


@pytest.mark.slow  # trains, saves and evaluates on Breakout (21-23 s each here)
@pytest.mark.parametrize("script", ["ppo_atari_envpool", "ppo_atari_envpool_torchcompile"])
def test_atari_saves_a_model_that_loads_into_a_fresh_agent_and_evaluates(script, tmp_path):
    """The Atari scripts evaluate by sampling (as CleanRL does), so two evaluations differ; here the
    saved weights load, strictly, into a fresh agent of the other Atari script, and an evaluation of
    the file runs."""
    trained = summary(
        run_script(script, *ATARI, "--save-model", "--eval-episodes", "1", cwd=tmp_path)
    )
    other = "ppo_atari_envpool" if script.endswith("_torchcompile") else f"{script}_torchcompile"
    module = load_script(other)
    agent = module.make_learner(module.Args(), 4, torch.device("cpu")).agent
    agent.load_state_dict(saved(trained)["model"])  # strict: the same names and shapes
    flags = ("--eval-model", trained["model_file"], "--eval-episodes", "1")
    replayed = summary(run_script(script, *flags, cwd=tmp_path))
    assert len(replayed["eval_returns"]) == 1
    assert replayed["eval_return_mean"] == replayed["eval_returns"][0]


@pytest.mark.slow  # records and encodes videos (10-31 s each here)
@pytest.mark.parametrize(
    "script, env_id, flags",
    [
        ("dqn", "CartPole-v1", ("--total-timesteps", "300", "--learning-starts", "100")),
        # Hopper's episodes end when it falls (~20 steps here): HalfCheetah's 1,000 steps took 109 s
        (
            "sac_continuous_action",
            "Hopper-v4",
            tuple("--total-timesteps 60 --learning-starts 40 --batch-size 16".split()),
        ),
    ],
    ids=["classic-control", "mujoco"],
)
def test_videos_of_training_and_of_every_evaluation_episode(script, env_id, flags, tmp_path):
    flags = ("--env-id", env_id, *flags, "--capture-video", "--eval-episodes", "2")
    result = summary(run_script(script, *flags, cwd=tmp_path))
    videos = Path(result["summary_file"]).parent / "videos"
    sizes = {path.name: path.stat().st_size for path in videos.iterdir()}
    assert {"train-episode-0.mp4", "eval-episode-0.mp4", "eval-episode-1.mp4"} <= set(sizes), sizes
    assert "eval-episode-2.mp4" not in sizes, "a video of the episode the autoreset starts after"
    assert all(size > 1000 for size in sizes.values()), sizes


def test_a_run_leaves_the_callers_flags_as_given(tmp_path, monkeypatch):
    """`Run` fills in --exp-name (the script's name) and names its folder on a copy of the flags:
    the `args` its caller holds stay as parsed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)
    args = load_script("dqn").Args(seed=3)
    given = dict(vars(args))
    run = load_script("runs").Run(args, "dqn")
    assert vars(args) == given and args.exp_name is None
    assert run.args.exp_name == "dqn" and run.args.seed == 3 and run.args is not args
    assert Path(run.folder.dir).name.startswith("CartPole-v1__dqn__3__")


def start_training(script, tmp_path, *flags):
    """`script` started on a budget too large to end, once its run folder exists (made after the
    signal handlers are installed) and it has trained a few seconds; the Popen."""
    small_iterations = ("--num-steps", "128", "--num-minibatches", "2", "--update-epochs", "2")
    budget = {"ppo_continuous_action": (*PENDULUM, *small_iterations)}.get(script, ())
    cmd = [sys.executable, str(SCRIPTS / f"{script}.py"), *budget, "--total-timesteps", "1000000"]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen([*cmd, *flags], cwd=tmp_path, env=script_env(), **pipes)
    deadline = time.monotonic() + 120
    while not (tmp_path / "runs").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(3)  # some training
    return proc


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("script", ["dqn_torchcompile", "ppo_continuous_action"])
def test_ctrl_c_or_sigterm_stops_after_the_step_and_reports_and_saves_what_it_has(
    script, signum, tmp_path
):
    """SIGINT (Ctrl-C) or SIGTERM (`kill`, Slurm's time limit) during training: the run ends with
    the status a shell reports for the signal (130, 143), a valid summary of the steps it did,
    `interrupted`, and a loadable model."""
    proc = start_training(script, tmp_path, "--save-model", "--eval-episodes", "1")
    try:
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    finished = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    result = summary(finished, returncode=128 + signum)
    assert result["interrupted"] is True and result["diverged"] is None
    assert 0 < result["total_timesteps"] < 1_000_000
    assert len(result["eval_returns"]) == 1
    assert saved(result)["script"] == script


def test_a_second_signal_stops_at_once(tmp_path):
    """SIGTERM, then Ctrl-C while the run evaluates (10,000 episodes): the second signal's default
    action ends the process at once, with no summary."""
    proc = start_training("dqn", tmp_path, "--eval-episodes", "10000")
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(2)  # the step ends, the evaluation starts
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGINT and "SUMMARY" not in stdout


def make_checkpoint(tmp_path, script, env_id):
    """A file in the saved-model format (`Run.finish`'s), by `script`, for `env_id`."""
    path = tmp_path / f"{script}-{env_id}.pt"
    torch.save({"script": script, "args": {"env_id": env_id}, "model": {"w": torch.zeros(1)}}, path)
    return str(path)


@pytest.mark.parametrize("script", ["sac_continuous_action_cpu", "dqn"])
def test_bad_evaluation_inputs_exit_2(script, tmp_path, refused):
    env_id = load_script(script).Args().env_id
    other = "td3_continuous_action" if script.startswith("sac") else "ppo_lstm_torchcompile"
    (tmp_path / "junk.pt").write_text("not a model")
    files = {
        ("--eval-model", "missing.pt"): str(tmp_path / "missing.pt"),
        ("--eval-model", "not a model saved"): str(tmp_path / "junk.pt"),
        ("saved by", other): make_checkpoint(tmp_path, other, env_id),
        ("--env-id Acrobot-v1",): make_checkpoint(tmp_path, script, "Acrobot-v1"),
    }
    for words, path in files.items():
        refused(script, ("--eval-model", path, "--eval-episodes", "1"), words)
    refused(
        script, ("--eval-model", make_checkpoint(tmp_path, script, env_id)), ("--eval-episodes",)
    )
    refused(script, ("--eval-episodes", "-1"), ("--eval-episodes",))
    assert not (tmp_path / "runs").exists(), "a user error makes no run folder"


ATARI_VIDEO = ("--total-timesteps", "512", "--num-steps", "128", "--update-epochs", "1")


def video_frames(path):
    """The frames of an .mp4, decoded."""
    from moviepy import VideoFileClip

    with VideoFileClip(str(path)) as clip:
        return list(clip.iter_frames())


@pytest.mark.slow  # records and encodes Breakout's games (9-12 s each here)
@pytest.mark.parametrize(
    "script, flags",
    [
        ("ppo_atari_envpool", ("--num-envs", "1", "--eval-episodes", "1")),
        # env 0 is in some of the batches `recv` returns only
        ("ppo_atari_envpool_async", ("--num-envs", "4", "--async-batch-size", "2")),
    ],
    ids=["eager", "async-4-envs"],
)
def test_atari_videos_of_training_games_and_of_every_evaluation_game(script, flags, tmp_path):
    """envpool's `render()` draws env 0's whole games: gymnasium's schedule in training, every game
    of the evaluation (the twin shares the recorder, byte for byte: test_plumbing)."""
    result = summary(run_script(script, *ATARI_VIDEO, *flags, "--capture-video", cwd=tmp_path))
    videos = Path(result["summary_file"]).parent / "videos"
    frames = {path.name: video_frames(path) for path in sorted(videos.iterdir())}
    # game 1 only if game 0 ended; `close()` saves a game left unfinished
    evaluated = ("eval-episode-0.mp4",) if "--eval-episodes" in flags else ()
    assert {*evaluated, "train-episode-0.mp4"} <= set(frames)
    assert set(frames) <= {"eval-episode-0.mp4", "train-episode-0.mp4", "train-episode-1.mp4"}
    assert all((videos / name).stat().st_size > 1000 for name in frames)
    for name in (*evaluated, "train-episode-0.mp4"):
        video = frames[name]
        assert len(video) > 10 and video[0].shape == (210, 160, 3), (name, len(video))
        assert video[0].std() > 0 and not np.array_equal(video[0], video[-1]), name
    if script == "ppo_atari_envpool":
        # game 0 ends at the global step of the first point of the curve: its frames are the
        # reset's and one per step; moviepy writes int(duration * fps) of them, which a float
        # duration can make one fewer
        steps = result["curve"][0][0]
        assert steps <= len(frames["train-episode-0.mp4"]) <= steps + 1, steps


@pytest.mark.parametrize("script", ["dqn", "ppo_lstm_torchcompile", "ppo_atari_envpool_async"])
def test_capture_video_without_moviepy_names_the_flag(script, tmp_path):
    """gymnasium writes videos with moviepy; without it `--capture-video` is the flag named, before
    a run folder."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "moviepy.py").write_text("raise ImportError('No module named moviepy')\n")
    proc = run_script(
        script, "--capture-video", timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(blocked)}
    )
    assert_user_error(proc, "--capture-video", "moviepy")
    assert not (tmp_path / "runs").exists()
