"""vector_envs.py's vector env: its step, written out for Box observations and array actions,
returns what gymnasium's SyncVectorEnv returns (same-step autoreset), array for array and info for
info, over episodes that end at different steps in different envs, by termination and by
truncation; and the tensor envs' episode log hands each episode to the run once, at its step."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import load_script

vector_envs = load_script("vector_envs")


def pair(env_id, num_envs):
    """gymnasium's vector env and vector_envs.py's, on the same envs, seeded alike."""
    thunks = [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))] * num_envs
    mode = gym.vector.AutoresetMode.SAME_STEP
    envs = (
        gym.vector.SyncVectorEnv(thunks, autoreset_mode=mode),
        vector_envs.SyncVectorEnv(thunks, mode),
    )
    for e in envs:
        e.reset(seed=7)
        e.action_space.seed(7)
    return envs


def assert_same(a, b, where):
    """Equal values and dtypes, dicts key by key; an episode's wall time `t` left out."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a.keys() - {"t"}:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, np.ndarray) and a.dtype == object:  # final_obs: an array per env, or None
        assert b.dtype == object and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert (x is None) == (y is None), f"{where}[{i}]"
            if x is not None:
                assert_same(x, y, f"{where}[{i}]")
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and np.array_equal(a, b), where


@pytest.mark.parametrize(
    "env_id, steps, key",
    [
        ("CartPole-v1", 600, "final_obs"),
        ("Pendulum-v1", 450, "final_obs"),
        ("HalfCheetah-v4", 50, "x_position"),
    ],
)
def test_the_written_out_step_is_gymnasiums(env_id, steps, key):
    """CartPole's episodes terminate, Pendulum's are truncated at 200 steps (twice here), and
    HalfCheetah's steps carry infos of their own: `key` is among the infos the run saw."""
    reference, ours = pair(env_id, num_envs=3)
    seen = set()
    for step in range(steps):
        actions = reference.action_space.sample()
        expected, got = reference.step(actions), ours.step(actions)
        for k, (a, b) in enumerate(zip(expected, got)):
            assert_same(a, b, f"step {step}, output {k}")
        seen |= expected[4].keys()
    assert key in seen


def test_what_it_does_not_write_out_is_gymnasiums():
    """Actions given as a list take gymnasium's own step."""
    reference, ours = pair("CartPole-v1", num_envs=2)
    for a, b in zip(reference.step([0, 1]), ours.step([0, 1])):
        assert_same(a, b, "list actions")


class Logged:
    """A stand-in run: the (step, returns, lengths) it is handed."""

    def __init__(self):
        self.episodes = []

    def log_episodes(self, step, returns):
        self.episodes.append((step, list(returns), returns.lengths))


def test_the_episode_log_hands_each_episode_to_the_run_once_at_its_step():
    """`EpisodeLog` over 4 rows of 3 envs: a log of the rows so far, then of the rest, hands each
    episode over once, at its step, several on one step together; a state dict taken between the
    two logs (as a stopped run's checkpoint holds it) restores a log that goes on as the first
    does, without handing over again what was handed over before."""
    log = vector_envs.EpisodeLog(4, 3, "cpu")
    ends = torch.tensor([[0, 1, 0], [1, 0, 1], [0, 0, 0], [0, 1, 0]], dtype=torch.bool)
    for row, ended in enumerate(ends):
        episode = dict(r=torch.arange(3.0) + 10 * row, l=torch.full((3,), row + 1))
        infos = {"_final_obs": ended, "final_info": {"episode": episode}}
        log.record(torch.tensor([row]), infos)
        if row == 1:  # as a run stopped here: log, then checkpoint
            first = Logged()
            log.log(first, 100, 3, 2)
            saved = log.state_dict()
    second = Logged()
    log.log(second, 100, 3, 4)
    assert first.episodes == [(100, [1.0], [1]), (103, [10.0, 12.0], [2, 2])]
    assert second.episodes == [(109, [31.0], [4])] and log.first == 0
    restored = vector_envs.EpisodeLog(4, 3, "cpu")
    restored.load_state_dict(saved)
    for row in (2, 3):
        restored.ended[row], restored.returns[row] = ends[row], log.returns[row]
        restored.lengths[row] = log.lengths[row]
    again = Logged()
    restored.log(again, 100, 3, 4)
    assert again.episodes == second.episodes
