"""PPO on Atari with envpool's async mode. On benchmarks/standin.py's stand-in pool (frames that
say which env, episode and step they are), `collect_rollout` stores what the twin's synchronous loop
stores for the same env steps, each env's steps in order, every finished game counted once, in
whatever order the envs come back. The script trains (compiled), its model loads in the twin, one
batch of all envs plays the twin's games, and bad flags exit 2."""

import os

import numpy as np
import pytest
import torch
from conftest import load_script, requires_cuda, run_script, summary
from tensordict import TensorDict
from test_ppo_atari_envpool import SMOKE, TWIN, twin_smoke_run

from benchmarks.standin import StandInEnvs, decode

ASYNC = "ppo_atari_envpool_async"
# 8 stand-in envs, 16-step rollouts, 4 of them: games of 2 lives of 8-24 steps, cut off at 32 steps,
# so each env ends several episodes and games in a run, some by truncation
NUM_ENVS, NUM_STEPS, ITERATIONS, N_ACTIONS = 8, 16, 4, 5
KEYS = ("obs", "actions", "logprobs", "values", "rewards", "terminations", "truncations")


def policy(obs):
    """A deterministic policy of the stand-in's frames: each output a function of (env, episode,
    step), so two runs that store the same frames store the same steps."""
    env, episode, step = (torch.as_tensor(column) for column in decode(obs.numpy()))
    action = (env + 2 * episode + step) % N_ACTIONS
    value = (env * 10_000 + episode * 100 + step).float()
    return action, -value / 1e5, torch.zeros_like(value), value.unsqueeze(-1)


def get_value(obs):
    return policy(obs)[3]


def stand_in(seed=0, batch_size=None):
    return StandInEnvs(NUM_ENVS, batch_size=batch_size, seed=seed, n_actions=N_ACTIONS)


class ShuffledPool:
    """envpool's async API over a synchronous stand-in: `recv` steps `batch_size` envs in flight,
    in send order plus a seeded lag of up to 2 batches (batches mix envs ahead and behind); it
    fails the test without a whole batch in flight (envpool's would wait forever)."""

    def __init__(self, pool, batch_size, seed):
        self.pool, self.batch_size, self.rng = pool, batch_size, np.random.default_rng(seed)
        # env -> (its place in the finishing order, its action; None: a reset)
        self.in_flight, self.sent = {}, 0

    def async_reset(self):
        self.send([None] * self.pool.num_envs, np.arange(self.pool.num_envs))

    def send(self, actions, env_id):
        for action, env in zip(list(actions), env_id.tolist()):
            assert env not in self.in_flight, f"env {env} sent twice before a recv"
            self.in_flight[env] = (self.sent + self.rng.uniform(0, 2 * self.batch_size), action)
            self.sent += 1

    def recv(self):
        assert len(self.in_flight) >= self.batch_size, f"{len(self.in_flight)} in flight: a hang"
        envs = sorted(self.in_flight, key=lambda env: self.in_flight[env][0])[: self.batch_size]
        actions = {env: self.in_flight.pop(env)[1] for env in envs}
        resets = np.array([env for env in envs if actions[env] is None], dtype=np.int64)
        steps = np.array([env for env in envs if actions[env] is not None], dtype=np.int64)
        parts = []
        if len(resets):
            obs, info = self.pool.reset(resets)
            no_end = np.zeros(len(resets), dtype=bool)
            parts.append((obs, np.zeros(len(resets), dtype=np.float32), no_end, no_end, info))
        if len(steps):
            parts.append(self.pool.step(np.array([int(actions[env]) for env in steps]), steps))
        obs, rewards, terminations, truncations = (
            np.concatenate([part[i] for part in parts]) for i in range(4)
        )
        info = {key: np.concatenate([part[4][key] for part in parts]) for key in parts[0][4]}
        return obs, rewards, terminations, truncations, info

    def close(self):
        self.pool.close()


class StarvingPool(ShuffledPool):
    """ShuffledPool's order, but env 0 comes back last of the envs in flight: the slowest env."""

    def send(self, actions, env_id):
        super().send(actions, env_id)
        if 0 in env_id.tolist():
            self.in_flight[0] = (float("inf"), self.in_flight[0][1])


def async_rollouts(envs):
    """ITERATIONS rollouts of `collect_rollout`: each rollout and bootstrap value, the furthest row
    an env reached at each rollout's end, and the scores logged."""
    module = load_script(ASYNC)
    storage = module.make_storage(NUM_STEPS, NUM_ENVS, (4, 84, 84), torch.device("cpu"))
    state = module.RolloutState(NUM_ENVS)
    scores, rollouts, rows = [], [], []
    envs.async_reset()
    for _ in range(ITERATIONS):
        module.collect_rollout(
            envs, policy, get_value, storage, state, NUM_STEPS, lambda step, s: scores.extend(s)
        )
        rollouts.append((storage[:NUM_STEPS].clone(), storage["values"][NUM_STEPS].clone()))
        rows.append(int(state.step.max()))
    envs.close()
    return rollouts, rows, scores


def sync_rollouts(seed):
    """The twin's loop on a synchronous stand-in: per rollout, what it stores and the bootstrap."""
    envs = stand_in(seed)
    next_obs, _ = envs.reset()
    next_obs, rollouts = torch.from_numpy(next_obs), []
    for _ in range(ITERATIONS):
        steps = []
        for _ in range(NUM_STEPS):
            action, logprob, _, value = policy(next_obs)
            obs, reward, terminations, truncations, _ = envs.step(action.numpy())
            outcome = [
                torch.as_tensor(x, dtype=torch.float) for x in (reward, terminations, truncations)
            ]
            steps.append(dict(zip(KEYS, [next_obs, action, logprob, value.flatten(), *outcome])))
            next_obs = torch.from_numpy(obs)
        rollout = TensorDict(
            {key: torch.stack([step[key] for step in steps]) for key in KEYS}, [NUM_STEPS, NUM_ENVS]
        )
        rollouts.append((rollout, get_value(next_obs).flatten()))
    envs.close()
    return rollouts


def shuffled(seed=0, batch_size=4):
    return ShuffledPool(stand_in(seed), batch_size, seed)


def assert_rollouts_equal(rollouts, expected):
    for iteration, ((rollout, next_value), (want, want_next)) in enumerate(zip(rollouts, expected)):
        for key in KEYS:
            assert torch.equal(rollout[key], want[key]), (iteration, key)
        assert torch.equal(next_value, want_next), iteration


@pytest.mark.parametrize(
    "make_envs",
    [shuffled, lambda: stand_in(batch_size=4), lambda: ShuffledPool(stand_in(), NUM_ENVS, 0)],
    ids=["shuffled-batches-of-4", "threaded-batches-of-4", "one-batch-of-8"],
)
def test_rollout_by_env_is_the_synchronous_rollout(make_envs):
    """Every rollout, bootstrap included, equals the twin's for the same env steps, whatever order
    the envs come back in (the shuffled order also carries rows to the next rollout)."""
    envs = make_envs()
    rollouts, rows, _ = async_rollouts(envs)
    expected = sync_rollouts(seed=0)
    assert_rollouts_equal(rollouts, expected)
    assert sum(want["terminations"].sum() + want["truncations"].sum() for want, _ in expected) > 20
    if isinstance(envs, ShuffledPool) and envs.batch_size < NUM_ENVS:
        assert max(rows) > NUM_STEPS, "no env ran past its steps: the carry went untested"
    if isinstance(envs, ShuffledPool) and envs.batch_size == NUM_ENVS:
        assert rows == [NUM_STEPS] * ITERATIONS, "one batch of all envs is held whole at the end"


def test_no_env_runs_past_the_storage():
    """Against the slowest env, the others run ahead by NUM_STEPS + 1 steps at most (the storage's
    last row), and the rollouts are still the synchronous ones."""
    rollouts, rows, _ = async_rollouts(StarvingPool(stand_in(), 4, seed=0))
    assert_rollouts_equal(rollouts, sync_rollouts(seed=0))
    storage = load_script(ASYNC).make_storage(NUM_STEPS, NUM_ENVS, (4, 84, 84), torch.device("cpu"))
    assert max(rows) == 2 * NUM_STEPS + 1 == len(storage) - 1, rows


def test_every_env_steps_in_order():
    """Each env's column, rollout after rollout, is the stand-in's record of its steps (frames and
    actions), none skipped or repeated."""
    envs = shuffled(seed=1)
    rollouts, _, _ = async_rollouts(envs)
    for env in range(NUM_ENVS):
        column = torch.cat([rollout["obs"][:, env] for rollout, _ in rollouts]).numpy()
        actions = torch.cat([rollout["actions"][:, env] for rollout, _ in rollouts]).tolist()
        trace = envs.pool.trace[env]
        _, episode, step = decode(column)
        assert list(zip(episode, step)) == [(e % 256, s) for e, s, _ in trace[: len(column)]], env
        # a step after an episode's end resets the env and ignores its action (None in the record)
        taken = [(action, rec[2]) for action, rec in zip(actions, trace[1:]) if rec[2] is not None]
        assert all(action == took for action, took in taken) and len(taken) > len(actions) // 2, env


def test_every_finished_game_is_counted_once():
    """The scores logged are the twin's `finished_games` of the steps `recv` returned, replayed env
    by env: none lost at a rollout's end, none counted twice."""
    finished_games = load_script(TWIN).finished_games
    envs = shuffled(seed=2)
    _, _, scores = async_rollouts(envs)
    replay, expected = stand_in(seed=2), []
    for env, trace in enumerate(envs.pool.trace):
        replay.reset(np.array([env]))
        game_return = np.zeros(1)
        for _, _, action in trace[1:]:
            _, _, _, truncations, infos = replay.step(np.array([action or 0]), np.array([env]))
            expected += finished_games(game_return, infos, truncations)
    replay.close()
    assert len(expected) >= NUM_ENVS  # games end: the comparison has teeth
    assert sorted(scores) == sorted(expected)


def test_a_batch_adds_to_its_own_envs_games():
    """`finished_batch_games` on a batch of envs 5 and 2 adds to their own scores only."""
    finished_games = load_script(ASYNC).finished_batch_games
    game_returns = np.zeros(8)
    infos = {
        "env_id": np.array([5, 2], dtype=np.int32),
        "reward": np.array([4.0, 1.0], dtype=np.float32),
    }
    infos["terminated"] = np.array([0, 0], dtype=np.int32)
    assert finished_games(game_returns, infos, np.array([False, False])) == []
    infos |= {
        "reward": np.array([7.0, 2.0], dtype=np.float32),
        "terminated": np.array([1, 0], dtype=np.int32),
    }
    # in the batch's order
    assert finished_games(game_returns, infos, np.array([False, True])) == [11.0, 3.0]
    assert not game_returns.any()
    infos |= {
        "env_id": np.array([0, 2], dtype=np.int32),
        "terminated": np.array([0, 1], dtype=np.int32),
    }
    assert finished_games(game_returns, infos, np.array([False, False])) == [2.0]
    assert game_returns.tolist() == [7.0] + [0.0] * 7


def test_smoke_compiled_and_the_twin_loads_its_model(tmp_path):
    """Breakout, 8 envs acting 4 at a time, compiled: whole games, random play's scores, a few steps
    past the budget (envs that ran ahead); the saved model evaluates in the twin."""
    result = summary(run_script(ASYNC, *SMOKE, "--compile", "--save-model", cwd=tmp_path))
    got = (result["script"], result["compile"], result["async_batch_size"], result["num_envs"])
    assert got == (ASYNC, True, 4, 8)
    # the default leaves the policy a core
    assert result["env_threads"] == max(1, len(os.sched_getaffinity(0)) - 1)
    assert 2048 <= result["total_timesteps"] < 2048 + 32 * 8
    assert result["episodes"] >= 4 and 0 <= result["return_mean"] < 10
    assert all(point[2] == int(point[2]) for point in result["curve"])
    flags = ("--eval-model", result["model_file"], "--eval-episodes", "1")
    evaluated = summary(run_script(TWIN, *flags, cwd=tmp_path))
    assert len(evaluated["eval_returns"]) == 1 and evaluated["total_timesteps"] == 0


@pytest.mark.slow  # plays the twin's games both ways (21 s here; the twin's run may be shared)
def test_one_batch_of_all_envs_plays_the_twins_games():
    """With --async-batch-size 8 (= --num-envs) the script takes the twin's env steps and policy
    calls in the twin's order: the same games and scores (on one env thread: threads do not
    change the games)."""
    twin = twin_smoke_run()  # test_ppo_atari_envpool.py's smoke run, shared
    same = summary(run_script(ASYNC, *SMOKE, "--async-batch-size", "8", "--env-threads", "1"))
    assert (
        same["async_batch_size"] == 8 and same["total_timesteps"] == twin["total_timesteps"] == 2048
    )
    assert twin["episodes"] >= 4
    assert [point[::2] for point in same["curve"]] == [point[::2] for point in twin["curve"]]


@requires_cuda
def test_cudagraphs_smoke():
    """Acting on batches of 4 recorded as a CUDA graph (every batch has one shape)."""
    result = summary(run_script(ASYNC, *SMOKE, "--compile", "--cudagraphs"))
    assert result["cudagraphs"] is True and result["device"].startswith("cuda")
    assert result["episodes"] >= 4 and 0 <= result["return_mean"] < 10


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--async-batch-size", "3"), ("--async-batch-size", "divide --num-envs")),
        (("--async-batch-size", "0"), ("--async-batch-size", "divide --num-envs")),
        # the default: 3
        (("--num-envs", "7"), ("--async-batch-size", "default", "divide --num-envs")),
        (("--env-threads", "0"), ("--env-threads", "positive")),
        (("--cudagraphs",), ("--cudagraphs", "CUDA")),  # `refused` hides the GPUs
    ],
    ids=["not-a-divisor", "zero", "default-on-7-envs", "no-env-threads", "cudagraphs-without-cuda"],
)
def test_bad_input_exits_2(flags, words, refused):
    refused(ASYNC, flags, words)
