"""What a CleanRL user expects of every script: a run folder with the whole summary, `--save-model`,
`--eval-episodes` after training or of a saved model (`--eval-model`), `--capture-video`, and a Ctrl-C that stops
cleanly. `conftest.summary` checks on every run that summary.json holds what the SUMMARY line printed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SCRIPTS, assert_user_error, load_script, run_script, script_env, summary
from test_ppo_continuous_action import SMOKE as PPO_SMOKE
from test_ppo_lstm import SMOKE as PPO_LSTM_SMOKE
from test_sac import SMOKE as SAC_SMOKE

# tiny training runs that reach the updates, per algorithm
BUDGETS = {
    "sac_continuous_action": SAC_SMOKE,
    "td3_continuous_action": SAC_SMOKE,
    "dqn": ("--total-timesteps", "1500", "--learning-starts", "1000"),
    "ppo_continuous_action": PPO_SMOKE,
    "ppo_lstm": PPO_LSTM_SMOKE,
    "ppo_mingru": PPO_LSTM_SMOKE,
    "ppo_atari_envpool": ("--total-timesteps", "512", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"),
}
ENV_FLAGS = {"sac_continuous_action": SAC_SMOKE[:2], "td3_continuous_action": SAC_SMOKE[:2],
             "ppo_continuous_action": PPO_SMOKE[:2]}
ALL = [name for algo in BUDGETS for name in (algo, f"{algo}_torchcompile")]


def algo_of(script):
    return script.removesuffix("_torchcompile")


def saved(result):
    """The model file a run saved, loaded as a user would: `weights_only=True`."""
    path = Path(result["model_file"])
    assert path.name == f"{result['script']}.pt" and path.parent == Path(result["summary_file"]).parent
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("script", [name for name in ALL if "atari" not in name])
def test_a_saved_model_evaluates_as_the_live_policy(script, tmp_path):
    """Train, save and evaluate 2 episodes; then evaluate the saved file alone, with the same seed. The evaluation
    acts deterministically (and PPO normalizes observations with the saved statistics, frozen), so both give the
    same returns, to the last bit."""
    trained = summary(run_script(script, *BUDGETS[algo_of(script)], "--save-model", "--eval-episodes", "2", cwd=tmp_path))
    assert trained["interrupted"] is False and len(trained["eval_returns"]) == 2
    assert trained["eval_return_mean"] == pytest.approx(np.mean(trained["eval_returns"]))
    checkpoint = saved(trained)
    assert checkpoint["script"] == script and checkpoint["args"]["env_id"] == trained["env_id"]
    assert all(isinstance(value, torch.Tensor) for value in torch.utils._pytree.tree_leaves(checkpoint["model"]))
    env_flags = ENV_FLAGS.get(algo_of(script), ())
    replayed = summary(run_script(script, *env_flags, "--eval-model", trained["model_file"], "--eval-episodes", "2", cwd=tmp_path))
    assert replayed["eval_returns"] == trained["eval_returns"]
    assert (replayed["total_timesteps"], replayed["episodes"], replayed["model_file"]) == (0, 0, None)


@pytest.mark.parametrize("script", ["ppo_atari_envpool", "ppo_atari_envpool_torchcompile"])
def test_atari_saves_a_model_that_acts_as_the_live_agent(script, tmp_path):
    """The Atari scripts evaluate by sampling (as CleanRL does), so two evaluations differ; here the saved weights,
    loaded into a fresh agent, give the trained run's agent's logits exactly, and an evaluation of the file runs."""
    module = load_script(script)
    args = module.Args(save_model=True)
    agent, _, _ = module.make_learner(args, 4, torch.device("cpu"))
    path = str(tmp_path / f"{script}.pt")
    module.save_model(path, script, args, agent.state_dict())
    fresh, _, _ = module.make_learner(args, 4, torch.device("cpu"))
    fresh.load_state_dict(module.load_model(path, script, args.env_id))
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(fresh.actor(fresh.network(frames.float() / 255)), agent.actor(agent.network(frames.float() / 255)), rtol=0, atol=0)
    trained = summary(run_script(script, *BUDGETS["ppo_atari_envpool"], "--save-model", "--eval-episodes", "1", cwd=tmp_path))
    assert set(saved(trained)["model"]) == set(agent.state_dict())
    replayed = summary(run_script(script, "--eval-model", trained["model_file"], "--eval-episodes", "1", cwd=tmp_path))
    assert len(replayed["eval_returns"]) == 1 and replayed["eval_return_mean"] == replayed["eval_returns"][0]


@pytest.mark.parametrize("script, env_id, flags", [("dqn", "CartPole-v1", ("--total-timesteps", "300", "--learning-starts", "100")),
                                                   ("sac_continuous_action", "HalfCheetah-v4", ("--total-timesteps", "60", "--learning-starts", "40", "--batch-size", "16"))],
                         ids=["classic-control", "mujoco"])
def test_videos_of_training_and_of_every_evaluation_episode(script, env_id, flags, tmp_path):
    result = summary(run_script(script, "--env-id", env_id, *flags, "--capture-video", "--eval-episodes", "2", cwd=tmp_path))
    videos = Path(result["summary_file"]).parent / "videos"
    sizes = {path.name: path.stat().st_size for path in videos.iterdir()}
    assert {"train-episode-0.mp4", "eval-episode-0.mp4", "eval-episode-1.mp4"} <= set(sizes), sizes
    assert "eval-episode-2.mp4" not in sizes, "a video of the episode the autoreset starts after the last one"
    assert all(size > 1000 for size in sizes.values()), sizes


@pytest.mark.parametrize("script", ["dqn_torchcompile", "ppo_continuous_action"])
def test_ctrl_c_stops_after_the_step_and_reports_and_saves_what_it_has(script, tmp_path):
    """SIGINT once the run folder exists (the handler is installed just before): the run ends with status 130, a
    valid summary of the steps it did, `interrupted`, and a loadable model."""
    budget = {"dqn_torchcompile": ("--total-timesteps", "1000000"), "ppo_continuous_action": (*PPO_SMOKE[:2], "--total-timesteps", "1000000")}
    cmd = [sys.executable, str(SCRIPTS / f"{script}.py"), *budget[script], "--save-model", "--eval-episodes", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=script_env())
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "runs").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # some training
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    result = summary(subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), returncode=130)
    assert result["interrupted"] is True
    assert 0 < result["total_timesteps"] < 1_000_000
    assert len(result["eval_returns"]) == 1
    assert saved(result)["script"] == script


def make_checkpoint(tmp_path, script, env_id):
    path = tmp_path / f"{script}-{env_id}.pt"
    module = load_script(script)
    module.save_model(str(path), script, module.Args(env_id=env_id), {"w": torch.zeros(1)})
    return str(path)


@pytest.mark.parametrize("script", ["sac_continuous_action_torchcompile", "dqn"])
def test_bad_evaluation_inputs_exit_2(script, tmp_path):
    env_id = load_script(script).Args().env_id
    other = "td3_continuous_action" if script.startswith("sac") else "dqn_torchcompile"
    (tmp_path / "junk.pt").write_text("not a model")
    cases = [
        (("--eval-model", str(tmp_path / "missing.pt"), "--eval-episodes", "1"), ("--eval-model", "no such file")),
        (("--eval-model", str(tmp_path / "junk.pt"), "--eval-episodes", "1"), ("--eval-model", "not a saved model")),
        (("--eval-model", make_checkpoint(tmp_path, other, env_id), "--eval-episodes", "1"), ("saved by", other)),
        (("--eval-model", make_checkpoint(tmp_path, script, "Acrobot-v1"), "--eval-episodes", "1"), ("--env-id Acrobot-v1",)),
        (("--eval-model", make_checkpoint(tmp_path, script, env_id)), ("--eval-episodes",)),
        (("--eval-episodes", "-1"), ("--eval-episodes",)),
    ]
    for flags, words in cases:
        assert_user_error(run_script(script, *flags, timeout=120, cwd=tmp_path), *words)
    assert not (tmp_path / "runs").exists(), "a user error makes no run folder"


def test_atari_refuses_to_capture_video(tmp_path):
    assert_user_error(run_script("ppo_atari_envpool_torchcompile", "--capture-video", timeout=120, cwd=tmp_path), "--capture-video", "envpool")
    assert os.listdir(tmp_path) == []
