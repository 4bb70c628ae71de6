"""The stand-in env pool (benchmarks/standin.py) keeps envpool's contract: every env's frames in
order, episodes that end by life, by game and by truncation with envpool's next-step reset,
outputs that depend on the actions alone, an async recv that returns the first envs done while
the others step in threads; and `python -m benchmarks.studies.overlap --quick` writes its table,
plot and JSON with bounds that follow from the costs it measured. Nothing here is timed."""

import inspect
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, SCRIPTS, script_env
from tensordict import TensorDict

from benchmarks.standin import StandInEnvs, decode, life_length
from benchmarks.studies import overlap


def play(envs, actions):
    """Step `envs` (sync) once per row of `actions`; returns the decoded frames and the other
    outputs per step."""
    steps = []
    for row in actions:
        obs, rewards, terminations, truncations, info = envs.step(row)
        steps.append((decode(obs), rewards, terminations, truncations, info))
    return steps


def test_one_env_plays_lives_games_and_truncation_with_next_step_resets():
    """Lives of 3 steps, 2 lives a game, games cut off at 5 steps: the first life ends at its step
    3 (a termination, the game goes on), the second life is cut off at the game's step 5 (a
    truncation, the game over), the next game starts with 2 lives; after every end the next step
    ignores its action and returns the next episode's first frame with reward 0."""
    envs = StandInEnvs(1, seed=3, lives=2, episode_length=(3, 3), max_episode_steps=5)
    obs, info = envs.reset()
    assert [a.tolist() for a in decode(obs)] == [[0], [0], [0]]
    assert (info["lives"].tolist(), info["elapsed_step"].tolist()) == ([2], [0])
    got = [
        (int(e), int(s), float(r), bool(te), bool(tr), int(i["terminated"][0]), int(i["lives"][0]))
        for (_, (e,), (s,)), (r,), (te,), (tr,), i in play(envs, np.full((10, 1), 3))
    ]
    envs.close()
    # (episode, step, reward, termination, truncation, game over, lives)
    assert got == [
        (0, 1, 1.0, False, False, 0, 2),
        (0, 2, 1.0, False, False, 0, 2),
        (0, 3, 1.0, True, False, 0, 1),  # a life lost: the learner's episode ends, not the game
        (1, 0, 0.0, False, False, 0, 1),  # next-step reset: the action is ignored
        (1, 1, 1.0, False, False, 0, 1),
        (1, 2, 1.0, False, True, 0, 1),  # the game's 5th step: cut off
        (2, 0, 0.0, False, False, 0, 2),  # a new game
        (2, 1, 1.0, False, False, 0, 2),
        (2, 2, 1.0, False, False, 0, 2),
        (2, 3, 1.0, True, False, 0, 1),
    ]
    assert envs.trace[0][:5] == [(0, 0, None), (0, 1, 3), (0, 2, 3), (0, 3, 3), (1, 0, None)]


def test_sync_steps_return_every_env_in_order_with_seeded_lives_games_and_unclipped_rewards():
    num_envs, seed = 4, 5
    envs = StandInEnvs(num_envs, seed=seed, lives=2, episode_length=(4, 12), max_episode_steps=20)
    envs.reset()
    actions = np.random.default_rng(0).integers(0, 4, (120, num_envs))
    steps = play(envs, actions)
    envs.close()
    step, episode = np.zeros(num_envs, dtype=int), np.zeros(num_envs, dtype=int)
    ended = np.zeros(num_envs, dtype=bool)
    counts = {"terminations": 0, "truncations": 0, "game overs": 0}
    for t, ((env, episode_byte, got_step), rewards, terminations, truncations, info) in enumerate(
        steps
    ):
        assert env.tolist() == list(range(num_envs)) == info["env_id"].tolist()
        step = np.where(ended, 0, step + 1)
        episode += ended
        assert got_step.tolist() == step.tolist()
        assert episode_byte.tolist() == (episode % 256).tolist()
        # the step after an end is a reset: reward 0 and no flag; every other step scores its
        # action, clipped
        np.testing.assert_array_equal(info["reward"], np.where(ended, 0, actions[t]))
        np.testing.assert_array_equal(rewards, np.sign(info["reward"]))
        lengths = [life_length(seed, e, episode[e], (4, 12)) for e in range(num_envs)]
        np.testing.assert_array_equal(terminations, step == np.array(lengths))
        assert not (terminations & truncations).any()
        np.testing.assert_array_equal(truncations, ~terminations & (info["elapsed_step"] == 20))
        np.testing.assert_array_equal(info["terminated"], terminations & (info["lives"] == 0))
        ended = terminations | truncations
        counts["terminations"] += terminations.sum()
        counts["truncations"] += truncations.sum()
        counts["game overs"] += info["terminated"].sum()
    assert all(count > 0 for count in counts.values()), counts


def test_the_same_actions_give_the_same_outputs_and_another_seed_other_episodes():
    actions = np.random.default_rng(1).integers(0, 4, (60, 3))
    runs = []
    for seed in (7, 7, 8):
        envs = StandInEnvs(3, num_threads=3, step_seconds=1e-4, seed=seed)
        envs.reset()
        runs.append(play(envs, actions))
        envs.close()

    def flat(run):
        return [
            np.concatenate([*decoded, r, te, tr, *info.values()])
            for decoded, r, te, tr, info in run
        ]

    for a, b in zip(flat(runs[0]), flat(runs[1]), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(flat(runs[0]), flat(runs[2])))


def test_async_recv_returns_the_first_batch_of_envs_done_and_only_envs_that_were_sent():
    envs = StandInEnvs(4, batch_size=2, num_threads=4)
    assert envs.is_async and envs.single_action_space.n == 4
    envs.async_reset()
    first = envs.recv()
    second = envs.recv()
    for obs, rewards, _, _, info in (first, second):
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8 and rewards.shape == (2,)
        assert info["env_id"].dtype == np.int32
        assert decode(obs)[0].tolist() == info["env_id"].tolist() and decode(obs)[2].tolist() == [
            0,
            0,
        ]
    assert sorted([*first[4]["env_id"], *second[4]["env_id"]]) == [0, 1, 2, 3]
    envs.send(np.array([1, 2]), first[4]["env_id"])
    with pytest.raises(RuntimeError, match="sent twice"):
        envs.send(np.array([1]), first[4]["env_id"][:1])
    third = envs.recv()
    # the only envs stepping were the first batch's: recv returns them, at their step 1, having
    # scored their actions
    assert sorted(third[4]["env_id"]) == sorted(first[4]["env_id"])
    assert decode(third[0])[2].tolist() == [1, 1]
    by_env = dict(zip(first[4]["env_id"].tolist(), [1.0, 2.0]))
    assert third[4]["reward"].tolist() == [by_env[e] for e in third[4]["env_id"].tolist()]
    envs.close()


def test_envs_step_in_worker_threads_while_the_caller_does_something_else():
    """After `send`, the envs' steps finish with no call into the pool: they run in its threads, as
    envpool's."""
    envs = StandInEnvs(4, batch_size=2, num_threads=4, step_seconds=1e-3)
    envs.async_reset()
    deadline = time.monotonic() + 30
    while envs.done.qsize() < 4 and time.monotonic() < deadline:
        time.sleep(1e-3)
    assert envs.done.qsize() == 4, "the reset steps did not finish in the pool's threads"
    envs.close()


def async_traces(num_envs, batch, recvs, act):
    """Run the async loop for `recvs` batches; returns each env's trace and the frames each env was
    given, in order."""
    envs = StandInEnvs(num_envs, batch_size=batch, num_threads=num_envs, step_seconds=2e-4, seed=4)
    seen = [[] for _ in range(num_envs)]
    envs.async_reset()
    for _ in range(recvs):
        obs, _, _, _, info = envs.recv()
        for env, episode, step in zip(*decode(obs)):
            seen[env].append((int(episode), int(step)))
        envs.send(act(obs), info["env_id"])
    envs.close()
    return envs.trace, seen


def test_each_env_plays_the_same_game_async_as_sync_whatever_the_order_of_the_batches():
    def act(obs):  # a deterministic policy: the action depends on the frame
        env, episode, step = decode(obs)
        return (env + 3 * step + episode) % 4

    trace, seen = async_traces(4, 2, 80, act)
    envs = StandInEnvs(4, seed=4)
    obs, _ = envs.reset()
    for _ in range(80):
        obs = envs.step(act(obs))[0]
    envs.close()
    for env in range(4):
        played = trace[env]
        assert len(played) >= 20 and played == envs.trace[env][: len(played)]
        # the frames the policy saw are the env's own steps, in order
        assert seen[env] == [(episode % 256, step) for episode, step, _ in played[: len(seen[env])]]


def test_bounds_follow_from_the_measured_costs():
    # E = 100 µs per env step (10,000 env steps/s alone); the policy takes 100 µs per frame at any
    # batch
    sync = overlap.bounds("sync", 8, 8, env_sps=10_000, acting_sps=10_000)
    assert sync["bound_sps"] == pytest.approx(5000) and sync["pipeline_bound_sps"] is None
    assert sync["acting_ms"] == pytest.approx(0.8)
    async_4 = overlap.bounds("async 4", 8, 4, env_sps=10_000, acting_sps=10_000)
    assert (async_4["bound_sps"], async_4["acting_ms"]) == pytest.approx((10_000, 0.4))
    # two batches: each steps for 8 x 100 µs, then waits 4 x 100 µs for its actions: 1.2 ms per 8
    # steps
    assert async_4["pipeline_bound_sps"] == pytest.approx(8 / 1.2e-3)
    # policy-bound: 300 µs a step
    async_1 = overlap.bounds("async 1", 8, 1, env_sps=10_000, acting_sps=1e6 / 300)
    assert async_1["bound_sps"] == pytest.approx(1e6 / 300) == async_1["pipeline_bound_sps"]


def test_design_rows_take_medians_of_the_alternated_blocks_and_compare_with_sync():
    rates = {
        "rollout sync": [90.0, 100.0, 400.0],
        "env-only sync": [200.0, 250.0, 1.0],
        "acting 2": [300.0, 1e9, 1e9],
        "rollout async 1": [150.0, 120.0, 130.0],
        "env-only async 1": [250.0, 250.0, 250.0],
        "acting 1": [500.0, 500.0, 1.0],
    }
    sync, async_1 = overlap.design_rows("case", [("sync", 2), ("async 1", 1)], 2, rates)
    medians = (sync["sps_median"], sync["sps_min"], sync["sps_max"], sync["vs_sync"])
    assert medians == (100.0, 90.0, 400.0, 1.0)
    assert (sync["env_only_sps"], sync["acting_sps"]) == (200.0, 1e9)
    assert sync["bound_sps"] == pytest.approx(1 / (1 / 200 + 1 / 1e9))
    assert async_1["bound_sps"] == pytest.approx(250.0) and async_1["vs_sync"] == pytest.approx(1.3)
    assert async_1["ratio_to_bound"] == pytest.approx(130 / 250)
    no_pipeline = overlap.design_rows("case", [("sync", 2), ("async 1", 1)], 2, rates, False)[1]
    assert no_pipeline["pipeline_bound_sps"] is no_pipeline["ratio_to_pipeline_bound"] is None


def test_the_twin_rollout_stores_each_env_step_in_its_slot():
    """The benchmark's copy of the twin's rollout loop, on the stand-in: slot [t, e] holds env e's
    frame at its step t and what the policy and the env said about it."""
    num_steps, num_envs = 6, 3
    envs = StandInEnvs(num_envs, seed=2, episode_length=(2, 3), max_episode_steps=4)
    shape = (num_steps, num_envs)
    keys = ("logprobs", "values", "rewards", "terminations", "truncations")
    rollout = TensorDict({key: torch.zeros(shape) for key in keys}, batch_size=shape)
    rollout["obs"] = torch.zeros(*shape, 4, 84, 84, dtype=torch.uint8)
    rollout["actions"] = torch.zeros(shape, dtype=torch.long)

    def policy(obs):
        env, _, step = decode(obs.numpy())
        action = torch.as_tensor((env + step) % 4)
        return action, -action.float(), None, torch.as_tensor(10.0 * env + step)

    game_returns = np.zeros(num_envs)
    next_obs = torch.from_numpy(envs.reset()[0])
    finished = lambda *_: []  # noqa: E731
    next_obs = overlap.twin_rollout(envs, policy, rollout, next_obs, game_returns, finished, "cpu")
    envs.close()
    decoded = decode(rollout["obs"].flatten(0, 1).numpy())
    env, _, step = (torch.as_tensor(a).view(shape) for a in decoded)
    assert env.tolist() == [list(range(num_envs))] * num_steps
    torch.testing.assert_close(rollout["values"], 10.0 * env + step, check_dtype=False)
    torch.testing.assert_close(rollout["actions"], (env + step) % 4)
    assert decode(next_obs.numpy())[0].tolist() == list(range(num_envs))
    # a reset step (the one after an end) scores 0; others score the sign of their action
    ends = (rollout["terminations"] + rollout["truncations"]).bool()
    assert ends.any()
    reset_next = torch.cat([torch.zeros(1, num_envs, dtype=torch.bool), ends[:-1]])
    expected = torch.where(reset_next, 0.0, torch.sign(rollout["actions"].float()))
    torch.testing.assert_close(rollout["rewards"], expected)


def test_the_twin_rollout_is_the_twins_loop_line_for_line():
    """Every statement of the benchmark's copy of the loop is a line of the twin (its comments
    aside), but the loop's header and the episode logging, which the copy drops."""
    twin = (SCRIPTS / f"{overlap.TWIN}.py").read_text().splitlines()
    twin = [line.split("  #")[0].strip() for line in twin]
    copy = inspect.getsource(overlap.twin_rollout).split('"""')[2].splitlines()
    statements = [line.strip() for line in copy if line.strip()]
    statements = [line for line in statements if not line.startswith(("for ", "return"))]
    missing = [s for s in statements if s not in twin and not s.startswith("finished_games(")]
    assert len(statements) == 12 and not missing, missing


def written(out):
    """The JSON result and the table a run wrote into `out`, beside its plot."""
    files = sorted(out.iterdir())
    assert [f.suffix for f in files if f.stat().st_size > 0] == [".json", ".md", ".png"]
    return json.loads(files[0].read_text()), files[1].read_text()


def assert_rows_and_bounds(rows, cases):
    """Each case's designs, sync then async 4 of 8 envs, their sps and bounds from their costs."""
    assert {r["case"] for r in rows} == cases
    for case in cases:
        designs = [(r["design"], r["batch"]) for r in rows if r["case"] == case]
        assert designs == [("sync", 8), ("async 4", 4)]
    for r in rows:
        assert r["sps_min"] <= r["sps_median"] <= r["sps_max"] and r["ratio_to_bound"] > 0
        # stepping and acting one after the other
        serial = 1e6 / (r["env_us_per_step"] + r["acting_us_per_step"])
        if r["design"] == "sync":
            assert r["bound_sps"] == pytest.approx(serial)
        # overlapped: the larger cost alone, at least as fast as the two in turn; the pipeline in
        # between
        else:
            larger = max(r["env_us_per_step"], r["acting_us_per_step"])
            assert r["bound_sps"] == pytest.approx(1e6 / larger)
            assert r["bound_sps"] >= serial
            if r["pipeline_bound_sps"] is not None:
                assert serial <= r["pipeline_bound_sps"] <= r["bound_sps"]
        assert r["ratio_to_bound"] == pytest.approx(r["sps_median"] / r["bound_sps"])


STANDIN_CASES = {f"stand-in d={d} ms" for d in (0.1, 1, 10)}


def test_quick_standin_benchmark_writes_table_plot_and_json_with_consistent_bounds(tmp_path):
    """The stand-in part in this process (the Atari part and its script runs: the next test)."""
    assert overlap.main(["--quick", "--skip-atari", "--out", str(tmp_path)]) == 0
    result, table = written(tmp_path)
    assert result["machine"]["cores"] >= 1 and result["device"] == "cpu"
    assert result["atari"] is None and result["standin"]["policy_rounds"] >= 1
    assert_rows_and_bounds(result["standin"]["rows"], STANDIN_CASES)
    assert "| stand-in d=10 ms | async 4 |" in table


@pytest.mark.slow  # PPO Atari's rollouts and two script runs on envpool (40 s here)
def test_quick_benchmark_writes_table_plot_and_json_with_consistent_bounds(tmp_path):
    command = [
        sys.executable,
        "-m",
        "benchmarks.studies.overlap",
        "--quick",
        "--out",
        str(tmp_path),
    ]
    kwargs = dict(capture_output=True, text=True, timeout=600, cwd=ROOT, env=script_env())
    proc = subprocess.run(command, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result, table = written(tmp_path)
    rows = result["standin"]["rows"] + result["atari"]["rows"]
    assert_rows_and_bounds(rows, STANDIN_CASES | {"Breakout-v5, 8 envs"})
    whole = result["atari"]["whole_iteration"]
    assert [w["script"] for w in whole] == [overlap.TWIN, overlap.ASYNC]
    assert all(w["sps"] > 0 for w in whole) and whole[1]["async_batch_size"] == 4
    # the twin takes its 512 steps; the async script counts the steps it sent, a few more when envs
    # run ahead
    assert whole[0]["total_timesteps"] == 512 <= whole[1]["total_timesteps"] < 512 + 128
    assert "| Breakout-v5, 8 envs | async 4 |" in table


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--async-batch-sizes", "3"], "--async-batch-sizes 3"),
        (["--async-batch-sizes", "8"], "--async-batch-sizes 8"),
    ],
    ids=["not-a-divisor", "not-smaller"],
)
def test_an_async_batch_that_does_not_divide_the_envs_below_their_number_exits_2(
    flags, words, capsys
):
    with pytest.raises(SystemExit) as stop:
        overlap.parse_args(["--quick", *flags])
    assert stop.value.code == 2 and words in capsys.readouterr().err
    assert overlap.parse_args(["--quick"]).async_batch_sizes == [4]
    assert overlap.parse_args([]).async_batch_sizes == [4, 2]
