"""PPO on Atari with envpool's async mode (leanrl/ppo_atari_envpool_async.py). Driven by the
stand-in env pool of benchmarks/standin.py (frames that say which env, episode and step they
are, a deterministic policy of them), `collect_rollout` stores what the twin's synchronous loop
stores for the same env steps, each env's steps in order, and counts every finished game once,
whatever order the envs come back in. The script trains (compiled), its model loads in the twin,
with `--async-batch-size` equal to `--num-envs` it plays the twin's games, and a bad
`--async-batch-size` (or `--cudagraphs` without CUDA) exits 2."""

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
    """A deterministic policy of the stand-in's frames [B, 4, 84, 84]: action, log-probability and
    value are each a function of (env, episode, step), so any two runs that store the same frames
    store the same steps."""
    env, episode, step = (torch.as_tensor(column) for column in decode(obs.numpy()))
    action = (env + 2 * episode + step) % N_ACTIONS
    value = (env * 10_000 + episode * 100 + step).float()
    return action, -value / 1e5, torch.zeros_like(value), value.unsqueeze(-1)


def get_value(obs):
    return policy(obs)[3]


def stand_in(seed=0, batch_size=None):
    return StandInEnvs(NUM_ENVS, batch_size=batch_size, seed=seed, n_actions=N_ACTIONS)


class ShuffledPool:
    """envpool's async API over a synchronous stand-in, in a seeded order: `recv` steps
    `batch_size` of the envs in flight and returns them, taking them by the order they were sent
    in plus a random lag of up to 2 batches, so that batches mix envs ahead and behind (as
    envpool's threads do), the same on every run. The stand-in's `trace` then holds exactly the
    steps that `recv` returned. Like envpool's, `recv` needs a whole batch in flight (envpool's
    would wait forever): it fails the test if there is none."""

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
        assert len(self.in_flight) >= self.batch_size, (
            f"{len(self.in_flight)} envs in flight: recv would never return"
        )
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
    """ShuffledPool's order, but env 0 comes back last of the envs in flight: the slowest env there
    can be, which lets the others run as far ahead as `collect_rollout` lets any env."""

    def send(self, actions, env_id):
        super().send(actions, env_id)
        if 0 in env_id.tolist():
            self.in_flight[0] = (float("inf"), self.in_flight[0][1])


def async_rollouts(envs):
    """`collect_rollout` for ITERATIONS rollouts: each rollout (rows 0..NUM_STEPS-1) and bootstrap
    value, the largest step row an env had reached at each rollout's end, and the scores logged;
    `envs` is closed after."""
    module = load_script(ASYNC)
    storage, state = (
        module.make_storage(NUM_STEPS, NUM_ENVS, (4, 84, 84), torch.device("cpu")),
        module.RolloutState(NUM_ENVS),
    )
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
    """The twin's loop on a synchronous stand-in: per rollout, what it stores [NUM_STEPS, NUM_ENVS]
    and the bootstrap value."""
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
    for iteration, ((rollout, next_value), (want, want_next_value)) in enumerate(
        zip(rollouts, expected)
    ):
        for key in KEYS:
            assert torch.equal(rollout[key], want[key]), (iteration, key)
        assert torch.equal(next_value, want_next_value), iteration


@pytest.mark.parametrize(
    "make_envs",
    [shuffled, lambda: stand_in(batch_size=4), lambda: ShuffledPool(stand_in(), NUM_ENVS, 0)],
    ids=["shuffled-batches-of-4", "threaded-batches-of-4", "one-batch-of-8"],
)
def test_rollout_by_env_is_the_synchronous_rollout(make_envs):
    """Every rollout, bootstrap value included, equals the twin's for the same env steps: the
    stand-in's games depend only on each env's actions and the policy only on the frame, so the
    order envs come back in must not show. The shuffled order sends envs past their NUM_STEPS steps
    (rows beyond it, carried to the next rollout)."""
    envs = make_envs()
    rollouts, rows, _ = async_rollouts(envs)
    expected = sync_rollouts(seed=0)
    assert_rollouts_equal(rollouts, expected)
    assert sum(want["terminations"].sum() + want["truncations"].sum() for want, _ in expected) > 20
    if isinstance(envs, ShuffledPool) and envs.batch_size < NUM_ENVS:
        assert max(rows) > NUM_STEPS, (
            "no env ran past its steps: the carry to the next rollout went untested"
        )
    if isinstance(envs, ShuffledPool) and envs.batch_size == NUM_ENVS:
        assert rows == [NUM_STEPS] * ITERATIONS, (
            "one batch of all envs is held whole at each rollout's end"
        )


def test_no_env_runs_past_the_storage():
    """Against the slowest env there can be (env 0 returns only when no other env is left to return,
    its reset included), envs with their steps wait, then as few as keep a batch stepping run ahead,
    by NUM_STEPS + 1 steps at most: the furthest row reached is the storage's last, and the rollouts
    are still the synchronous ones."""
    rollouts, rows, _ = async_rollouts(StarvingPool(stand_in(), 4, seed=0))
    assert_rollouts_equal(rollouts, sync_rollouts(seed=0))
    storage = load_script(ASYNC).make_storage(NUM_STEPS, NUM_ENVS, (4, 84, 84), torch.device("cpu"))
    assert max(rows) == 2 * NUM_STEPS + 1 == len(storage) - 1, rows


def test_every_env_steps_in_order():
    """Each env's column, rollout after rollout, is the stand-in's own record of that env's steps
    (the frame it acted on, and the action its next step took), none skipped or repeated, though
    batches mix envs that are ahead and behind."""
    envs = shuffled(seed=1)
    rollouts, _, _ = async_rollouts(envs)
    for env in range(NUM_ENVS):
        column = torch.cat([rollout["obs"][:, env] for rollout, _ in rollouts]).numpy()
        actions = torch.cat([rollout["actions"][:, env] for rollout, _ in rollouts]).tolist()
        trace = envs.pool.trace[env]
        _, episode, step = decode(column)
        assert list(zip(episode, step)) == [(e % 256, s) for e, s, _ in trace[: len(column)]], env
        # a step after an episode's end resets the env and ignores its action (None in the record)
        taken = [
            (action, record[2])
            for action, record in zip(actions, trace[1:])
            if record[2] is not None
        ]
        assert all(action == took for action, took in taken) and len(taken) > len(actions) // 2, env


def test_every_finished_game_is_counted_once():
    """The scores logged equal those of the games ending in the steps `recv` returned, replayed env
    by env on a fresh stand-in (same seed) and counted by the twin's `finished_games`: none lost
    at a rollout's end, none counted twice when a batch is held or an env runs ahead."""
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
    """`finished_batch_games` on a batch of envs 5 and 2 (envpool's async order) adds to their own
    scores only."""
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
    """Breakout, 8 envs acting 4 at a time (the default), compiled: whole games counted, scores of
    random play, a few env steps past the budget (envs that ran ahead at the last rollout's end);
    the saved model evaluates in the twin (load_model reads `_async` as the same algorithm)."""
    result = summary(run_script(ASYNC, *SMOKE, "--compile", "--save-model", cwd=tmp_path))
    assert (
        result["script"],
        result["compile"],
        result["async_batch_size"],
        result["num_envs"],
    ) == (ASYNC, True, 4, 8)
    # the default leaves the policy a core
    assert result["env_threads"] == max(1, len(os.sched_getaffinity(0)) - 1)
    assert 2048 <= result["total_timesteps"] < 2048 + 32 * 8
    assert result["episodes"] >= 4 and 0 <= result["return_mean"] < 10
    assert all(point[2] == int(point[2]) for point in result["curve"])
    evaluated = summary(
        run_script(TWIN, "--eval-model", result["model_file"], "--eval-episodes", "1", cwd=tmp_path)
    )
    assert len(evaluated["eval_returns"]) == 1 and evaluated["total_timesteps"] == 0


@pytest.mark.slow  # plays the twin's games both ways (21 s here; the twin's run may be shared)
def test_one_batch_of_all_envs_plays_the_twins_games():
    """With --async-batch-size 8 (= --num-envs) envpool returns all envs in env order, every batch
    is held at a rollout's end and acts after the update, so the script takes the twin's env
    steps with the twin's policy calls in the twin's order (same random numbers): the same
    games, ended at the same steps, with the same scores. One env thread against the twin's
    envpool default: the threads that step the games do not change them."""
    twin = twin_smoke_run()  # test_ppo_atari_envpool.py's smoke run, shared
    same = summary(run_script(ASYNC, *SMOKE, "--async-batch-size", "8", "--env-threads", "1"))
    assert (
        same["async_batch_size"] == 8 and same["total_timesteps"] == twin["total_timesteps"] == 2048
    )
    assert twin["episodes"] >= 4
    assert [point[::2] for point in same["curve"]] == [point[::2] for point in twin["curve"]]


@requires_cuda
def test_cudagraphs_smoke():
    """Acting on batches of 4 recorded as a CUDA graph (one shape: every batch has
    --async-batch-size envs)."""
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
