"""The MuJoCo tasks on MuJoCo Warp (leanrl/mujoco_envs.py) against gymnasium's own envs on MuJoCo's
C engine: gymnasium's state injected and one step of both compared, float32 against float64, within
stated tolerances; terminations the same away from the healthy bounds; a random policy's episodes
drawn from the same distribution as gymnasium's; resets from gymnasium's noise; the step compiled
whole and free of host syncs; the state through a checkpoint; the step in a CUDA graph with torch's
work. MuJoCo Warp's kernels compile once (about a minute cold, all five tasks), then load from
Warp's cache (~/.cache/warp) in about a second."""

import json

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch
from conftest import assert_no_host_sync, load_script, requires_cuda, slow_unless
from scipy import stats

mujoco_envs = load_script("mujoco_envs")
ENV_IDS = list(mujoco_envs.MUJOCO_ENVS)
STEPS, NUM_ENVS = 1600, 16  # steps compared per task, in this many envs at once
# what a step reads beside qpos and qvel: the solver's warm start, and the bodies' positions of
# the frame's last physics step, which the reward measures progress from
INJECTED = ("qpos", "qvel", "qacc_warmstart", "xpos", "xipos")
# the largest difference of an observation's entries, relative (floor 1), in 99% of the steps
# and in all: float32 against float64, through contacts, whose solver stops at a tolerance
TOLERANCES = {
    "HalfCheetah-v5": (1e-3, 1e-2),
    "Hopper-v5": (1e-4, 1e-4),
    "Walker2d-v5": (1e-4, 1e-3),
    "Ant-v5": (1e-4, 1e-3),  # without contacts: see `test_one_step_agrees_with_gymnasiums...`
    "Humanoid-v5": (1e-3, 1e-2),
}
REWARD_TOLERANCE = 1e-3
# the qpos entries gymnasium's healthy checks bound, and their bounds
BOUNDS = {
    "Hopper-v5": {1: (0.7,), 2: (-0.2, 0.2)},
    "Walker2d-v5": {1: (0.8, 2.0), 2: (-1.0, 1.0)},
    "Ant-v5": {2: (0.2, 1.0)},
    "Humanoid-v5": {2: (1.0, 2.0)},
}


def random_actions(space, rng, n):
    return rng.uniform(space.low, space.high, (n, *space.shape)).astype(np.float32)


def without_contacts(env_class):
    """`env_class` with contacts disabled in its model."""

    class WithoutContacts(env_class):
        def load_model(self):
            model = super().load_model()
            model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
            return model

    return WithoutContacts


def injected_steps(env_id, contacts=True):
    """gymnasium's envs and the batched env stepped side by side, gymnasium's state injected into
    the batch before each step: per step, arrays of (their obs, reward, terminated, next qpos),
    then ours (obs, reward, terminated). Without `contacts`, both engines make none."""
    rng = np.random.default_rng(0)
    env_class = mujoco_envs.MUJOCO_ENVS[env_id]
    ours = (env_class if contacts else without_contacts(env_class))(NUM_ENVS, seed=1)
    envs = [gym.make(env_id).unwrapped for _ in range(NUM_ENVS)]
    for i, env in enumerate(envs):
        env.model.opt.disableflags |= 0 if contacts else mujoco.mjtDisableBit.mjDSBL_CONTACT
        env.reset(seed=i)
    for t in range(STEPS // NUM_ENVS):
        for name in INJECTED:
            state = np.stack([getattr(env.data, name) for env in envs])
            getattr(ours, name).copy_(torch.as_tensor(state))
        ours.elapsed.zero_()
        actions = random_actions(ours.single_action_space, rng, NUM_ENVS)
        _, reward, terminated, _, infos = ours.step(torch.as_tensor(actions))
        theirs = [np.stack(x) for x in list(zip(*[e.step(a) for e, a in zip(envs, actions)]))[:3]]
        qpos = np.stack([env.data.qpos for env in envs])
        mine = infos["final_obs"].numpy(), reward.numpy(), terminated.numpy()
        yield (*theirs, qpos), mine
        for i, env in enumerate(envs):
            if theirs[2][i]:
                env.reset(seed=NUM_ENVS * (t + 1) + i)


@pytest.mark.parametrize("env_id", slow_unless(lambda e: e == "Hopper-v5", ENV_IDS))
def test_one_step_agrees_with_gymnasiums_from_its_state(env_id):
    """Observations and rewards within the task's tolerances, terminations the same unless the
    state lies within 1e-3 of a healthy bound. Ant is compared without contacts: MuJoCo Warp aligns
    a capsule's contact frame with its axis only where the axis lies at least half along the floor,
    MuJoCo's C engine wherever it can, and a pyramidal friction cone turns with its frame, so a
    sliding foot's friction differs (Ant's random episodes still follow gymnasium's:
    `test_random_policy_episodes_follow_gymnasiums`)."""
    gaps, reward_gaps, mismatched = [], [], 0
    for (obs, reward, terminated, qpos), (our_obs, our_reward, our_terminated) in injected_steps(
        env_id, contacts=env_id != "Ant-v5"
    ):
        gaps += list((np.abs(our_obs - obs) / np.maximum(np.abs(obs), 1.0)).max(1))
        reward_gaps += list(np.abs(our_reward - reward))
        near = np.zeros_like(terminated)
        for entry, bounds in BOUNDS.get(env_id, {}).items():
            for bound in bounds:
                near |= np.abs(qpos[:, entry] - bound) < 1e-3
        mismatched += int(((our_terminated != terminated) & ~near).sum())
    usual, worst = TOLERANCES[env_id]
    print(f"{env_id}: observations' gap in 99% of steps {np.quantile(gaps, 0.99):.1e}, in all")
    print(f"{max(gaps):.1e}; rewards' gap {max(reward_gaps):.1e}")
    assert np.quantile(gaps, 0.99) <= usual and max(gaps) <= worst
    assert max(reward_gaps) <= REWARD_TOLERANCE
    assert mismatched == 0


# shorter time limits than gymnasium's 1,000 steps, on both sides, for the suite's budget
TIME_LIMITS = {"HalfCheetah-v5": 50, "Ant-v5": 50}


def first_episodes(envs, seed):
    """The returns and lengths of the first episode of each of the batched `envs`, random actions:
    each episode whole, so that short ones are not favoured."""
    n, rng = envs.num_envs, np.random.default_rng(seed)
    returns, lengths, ended = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
    while not ended.all():
        actions = torch.as_tensor(random_actions(envs.single_action_space, rng, n))
        _, _, _, _, infos = envs.step(actions)
        done, episode = infos["_final_obs"].numpy() & ~ended, infos["final_info"]["episode"]
        returns[done], lengths[done] = episode["r"].numpy()[done], episode["l"].numpy()[done]
        ended |= done
    return returns, lengths


def gymnasiums_episodes(env_id, n, seed):
    env = gym.make(env_id, max_episode_steps=TIME_LIMITS.get(env_id))
    rng, episodes = np.random.default_rng(seed), []
    for i in range(n):
        env.reset(seed=seed + i)
        total, length, done = 0.0, 0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(
                random_actions(env.action_space, rng, 1)[0]
            )
            total, length, done = total + reward, length + 1, terminated or truncated
        episodes.append((total, length))
    return np.array(episodes).T


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_policy_episodes_follow_gymnasiums(env_id):
    """200 episodes of random actions on each side: their returns and (where they vary) lengths
    pass a two-sample Mann-Whitney test at 0.1% (on another CPU the engine's roundings, and so the
    chaotic episodes, may differ: nine tests at 1% would fail one run in ten by chance); the
    p-values print."""
    limit = TIME_LIMITS.get(env_id)
    envs = mujoco_envs.make_mujoco_envs(env_id, 200, seed=1, max_episode_steps=limit)
    ours, theirs = first_episodes(envs, seed=1), gymnasiums_episodes(env_id, 200, seed=1)
    for name, a, b in zip(("returns", "lengths"), ours, theirs):
        if np.ptp(a) == np.ptp(b) == 0:
            assert a[0] == b[0], name
            continue
        p = stats.mannwhitneyu(a, b).pvalue
        print(f"{env_id} {name}: ours {np.mean(a):.2f}, gymnasium's {np.mean(b):.2f}, p = {p:.3f}")
        assert p >= 0.001, f"{name}: p = {p:.4f}"


def test_a_wrong_reward_fails_the_episode_test():
    """The test above can fail: Hopper rewarding 1.5 a healthy step is caught."""

    class Eager(mujoco_envs.Hopper):
        healthy_reward = 1.5

    ours = first_episodes(Eager(200, seed=1), seed=1)[0]
    theirs = gymnasiums_episodes("Hopper-v5", 200, seed=1)[0]
    assert stats.mannwhitneyu(ours, theirs).pvalue < 0.001


@pytest.mark.parametrize("env_id", slow_unless(lambda e: e == "Ant-v5", ENV_IDS))
def test_resets_follow_gymnasiums_noise(env_id):
    assert_resets_like_gymnasiums(mujoco_envs.MUJOCO_ENVS[env_id], env_id)


def test_a_wrong_reset_noise_fails():
    """The check above can fail: HalfCheetah's noise twice as wide is caught."""

    class Wider(mujoco_envs.HalfCheetah):
        reset_noise_scale = 0.2

    with pytest.raises(AssertionError):
        assert_resets_like_gymnasiums(Wider, "HalfCheetah-v5")


def assert_resets_like_gymnasiums(env_class, env_id):
    """2,000 reset states on each side: every qpos and qvel entry passes a two-sample
    Kolmogorov-Smirnov test at 0.1% against gymnasium's resets."""
    envs = env_class(200, seed=0)
    ours = []
    for seed in range(10):
        envs.reset(seed=200 * seed)
        ours.append(torch.cat([envs.qpos, envs.qvel], dim=1).numpy())
    ours = np.concatenate(ours).astype(np.float64)
    env = gym.make(env_id).unwrapped
    theirs = np.stack([env.state_vector() for seed in range(2000) if env.reset(seed=seed)])
    for column in range(ours.shape[1]):
        if np.ptp(theirs[:, column]) > 0:
            p = stats.ks_2samp(ours[:, column], theirs[:, column]).pvalue
            assert p >= 0.001, f"state entry {column}: p = {p:.4f}"


def test_same_step_autoreset_and_episode_statistics():
    """An episode that ends is reset in the same step: the step returns the next episode's first
    observation, its true last one in `final_obs`, and its return and length in `final_info`."""
    envs = mujoco_envs.make_mujoco_envs("Hopper-v5", 8, seed=1)
    obs, _ = envs.reset()
    totals, lengths, ended, rng = torch.zeros(8), torch.zeros(8), 0, np.random.default_rng(1)
    while ended < 8:
        actions = torch.as_tensor(random_actions(envs.single_action_space, rng, 8))
        obs, reward, terminated, truncated, infos = envs.step(actions)
        totals, lengths = totals + reward, lengths + 1
        done = terminated | truncated
        assert torch.equal(infos["_final_obs"], done)
        assert torch.equal(obs[done], envs.observe(started=True)[done])
        assert (envs.elapsed[done] == 0).all()
        episode = infos["final_info"]["episode"]
        torch.testing.assert_close(episode["r"][done], totals[done])
        assert torch.equal(episode["l"][done], lengths[done].long())
        totals[done], lengths[done], ended = 0, 0, ended + int(done.sum())


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Ant-v5"])
def test_state_dict_resumes_exactly(env_id):
    """`state_dict()` holds the whole env: loaded into a fresh env, the next steps are the ones
    the original takes, resets and all, bit for bit."""
    a = mujoco_envs.make_mujoco_envs(env_id, 8, seed=5, max_episode_steps=6)
    rng = np.random.default_rng(5)
    actions = [torch.as_tensor(random_actions(a.single_action_space, rng, 8)) for _ in range(16)]
    for x in actions[:8]:
        a.step(x)
    b = mujoco_envs.make_mujoco_envs(env_id, 8, seed=99, max_episode_steps=6)
    b.load_state_dict(a.state_dict())
    for x in actions[8:]:
        for ours, theirs in zip(a.step(x)[:4], b.step(x)[:4]):
            assert torch.equal(ours, theirs)


def test_step_compiles_whole_without_host_sync():
    """The step compiles with `fullgraph=True` (the engine is a custom op), recompiles for
    nothing, makes no host sync, and steps bit for bit as the eager one."""
    eager = mujoco_envs.make_mujoco_envs("Ant-v5", 8, seed=2, max_episode_steps=4)
    compiled = mujoco_envs.make_mujoco_envs("Ant-v5", 8, seed=2, max_episode_steps=4)
    step = torch.compile(compiled.step, fullgraph=True)
    rng = np.random.default_rng(2)
    actions = [torch.as_tensor(random_actions(eager.single_action_space, rng, 8)) for _ in range(6)]
    queue = iter(actions)
    last = assert_no_host_sync(step, lambda: (next(queue),), compiled=True)
    for x in actions:
        expected = eager.step(x)
    for ours, theirs in zip(expected[:4], last[:4]):
        assert torch.equal(ours, theirs)


def test_eager_step_makes_no_host_sync():
    envs = mujoco_envs.make_mujoco_envs("Humanoid-v5", 4, seed=2, max_episode_steps=2)
    actions = torch.zeros(4, 17)
    assert_no_host_sync(envs.step, lambda: (actions,), compiled=False)


def test_gymnasium_makes_them():
    """`gym.make_vec("tensor/<id>", ...)` makes the batched env, with its device and seed."""
    envs = gym.make_vec("tensor/Walker2d-v5", num_envs=3, device="cpu", seed=4)
    assert isinstance(envs, mujoco_envs.Walker2d) and envs.num_envs == 3
    assert envs.observation_space.shape == (3, 17) and envs.action_space.shape == (3, 6)
    same = mujoco_envs.make_mujoco_envs("Walker2d-v5", 3, seed=4)
    assert torch.equal(envs.reset()[0], same.reset()[0])


def test_refused_without_mujoco_warp_or_in_float64(monkeypatch, capsys):
    """Asked for a MuJoCo task without MuJoCo Warp installed, make_envs stops with one line naming
    the requirements file; float64, which the engine cannot compute in, is refused."""
    vector_envs = load_script("vector_envs")
    monkeypatch.setattr(mujoco_envs, "installed", lambda: False)
    with pytest.raises(SystemExit) as exit:
        vector_envs.make_envs("Hopper-v5", 2, 1, tensor=True)
    assert exit.value.code == 2
    assert "requirements/requirements-mujoco-warp.txt" in capsys.readouterr().err
    with pytest.raises(ValueError, match="float32"):
        mujoco_envs.Hopper(2, dtype=torch.float64)


def test_the_speed_benchmark_times_the_mujoco_tasks(tmp_path):
    """`python -m benchmarks.tensor_envs --env-ids mujoco`: gymnasium's envs and the batched ones,
    every task, in rounds."""
    from benchmarks import tensor_envs as benchmark

    flags = ["--env-ids", "mujoco", "--sizes", "2", "--seconds", "0.01", "--rounds", "2"]
    benchmark.main([*flags, "--no-compile", "--out", str(tmp_path / "out.json")])
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [(row["env_id"], row["kind"]) for row in rows] == [
        (env_id, kind) for env_id in ENV_IDS for kind in ("sync", "tensor")
    ]
    assert all(len(row["rounds"]) == 2 and row["sps"] > 0 for row in rows)


@requires_cuda
def test_a_cuda_graph_records_the_step_with_torchs_work():
    """Acting, the engine's step and a use of its outputs, compiled whole and recorded as one CUDA
    graph (tensordict's CudaGraphModule): its replays step as the same function run eagerly on a
    twin batch."""
    from tensordict.nn import CudaGraphModule

    graphed_envs = mujoco_envs.make_mujoco_envs("Ant-v5", 64, device="cuda", seed=3)
    eager_envs = mujoco_envs.make_mujoco_envs("Ant-v5", 64, device="cuda", seed=3)

    def rollout_step(envs, obs):
        actions = torch.tanh(obs[:, :8])
        obs, reward, terminated, truncated, infos = envs.step(actions)
        return obs, reward * 2, terminated | truncated

    step = CudaGraphModule(
        torch.compile(lambda obs: rollout_step(graphed_envs, obs), fullgraph=True), warmup=3
    )
    obs_graphed, obs_eager = graphed_envs.reset()[0], eager_envs.reset()[0]
    for _ in range(12):
        graphed, eager = step(obs_graphed), rollout_step(eager_envs, obs_eager)
        torch.testing.assert_close(graphed[0], eager[0], rtol=1e-4, atol=1e-4)
        assert torch.equal(graphed[2], eager[2])
        obs_graphed, obs_eager = graphed[0].clone(), eager[0]
