"""vector_envs.py's vector env: its step, written out for Box observations and array actions,
returns what gymnasium's SyncVectorEnv returns (same-step autoreset), array for array and info for
info, over episodes that end at different steps in different envs, by termination and by
truncation."""

import gymnasium as gym
import numpy as np
import pytest
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
