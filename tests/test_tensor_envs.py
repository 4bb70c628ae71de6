"""The tensor envs against gymnasium's own: gymnasium's state injected, both stepped with the same
random actions, compared step by step; their resets against gymnasium's bounds and distribution;
their step compiled whole and free of host syncs; their state through a checkpoint."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import assert_no_host_sync, load_script

tensor_envs = load_script("tensor_envs")
ENV_IDS = list(tensor_envs.TENSOR_ENVS)
STEPS, NUM_ENVS = 10_000, 8  # transitions compared per env id, in this many envs at once


def ulps(a, b):
    """How many representable numbers lie between `a` and `b` (float arrays of one dtype)."""
    kind = {np.dtype(np.float64): np.int64, np.dtype(np.float32): np.int32}[a.dtype]
    ai, bi = a.view(kind).astype(np.int64), b.view(kind).astype(np.int64)
    ai = np.where(ai < 0, np.iinfo(kind).min - ai, ai)  # sign-magnitude to a monotone order
    bi = np.where(bi < 0, np.iinfo(kind).min - bi, bi)
    return np.abs(ai - bi)


def gym_state(env):
    return np.asarray(env.unwrapped.state, dtype=np.float64)


def random_actions(space, rng, num_envs):
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.n, size=num_envs)
    actions = rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32)
    # Pendulum squares its float32 torque with numpy's float32 power, which on AVX-512 CPUs
    # (SVML) is not correctly rounded; on a grid of 1/1024 the square is exact everywhere
    return np.round(actions * 1024) / 1024


def lockstep(env_id, dtype, inject_every_step):
    """gymnasium's envs and the tensor env stepped side by side: yields, per step, gymnasium's
    (obs, reward, terminated, truncated, state) and the tensor env's, as arrays."""
    rng = np.random.default_rng(0)
    envs = [gym.make(env_id) for _ in range(NUM_ENVS)]
    tensor = tensor_envs.make_tensor_envs(env_id, NUM_ENVS, dtype=dtype)
    for i, env in enumerate(envs):
        env.reset(seed=i)
    tensor.reset(seed=0)
    tensor.state.copy_(torch.tensor(np.stack([gym_state(e) for e in envs])))
    for _ in range(STEPS // NUM_ENVS):
        if inject_every_step:
            tensor.state.copy_(torch.tensor(np.stack([gym_state(e) for e in envs])))
        actions = random_actions(tensor.single_action_space, rng, NUM_ENVS)
        obs, reward, terminated, truncated, infos = tensor.step(torch.as_tensor(actions))
        final_state = torch.where(infos["_final_obs"][:, None], 0, tensor.state).numpy()
        ours = (infos["final_obs"].numpy(), reward.numpy(), terminated.numpy(), truncated.numpy())
        theirs = [env.step(a) for env, a in zip(envs, actions)]
        theirs = [np.stack(x) for x in list(zip(*theirs))[:4]]
        states = np.stack([gym_state(e) for e in envs])
        yield theirs + [states], list(ours) + [final_state], terminated | truncated
        for i in np.flatnonzero((terminated | truncated).numpy()):
            envs[i].reset(seed=int(rng.integers(2**31)))
            tensor.state[i] = torch.tensor(gym_state(envs[i]))
            states[i] = 0


def worst_ulps(env_id, inject_every_step):
    """The largest distance, over 10,000 float64 transitions, of the observations (float32, as
    gymnasium returns them) and rewards from gymnasium's in ulps, and of the state in units of
    float64's epsilon (angles and speeds near 0 count many ulps of a tiny number); the terminations
    and truncations must be the same at every step."""
    ends = worst_obs = worst_reward = worst_state = 0
    for theirs, ours, done in lockstep(env_id, torch.float64, inject_every_step):
        (obs, reward, terminated, truncated, state), (o, r, te, tr, s) = theirs, ours
        assert (terminated == te).all() and (truncated == tr).all()
        worst_obs = max(worst_obs, ulps(obs, o.astype(np.float32)).max())
        worst_reward = max(worst_reward, ulps(np.float64(reward), r).max())
        alive = ~done.numpy()
        error = np.abs(state[alive] - s[alive]) / np.finfo(np.float64).eps
        worst_state = max(worst_state, error.max(initial=0))
        ends += int(done.sum())
    assert ends > 0, "no episode ended: the resets went untested"
    return worst_obs, worst_reward, worst_state


def libm(function):
    """The C library's `function` elementwise (as gymnasium's `math` and numpy scalars compute),
    for a float64 tensor on the CPU; other dtypes as torch computes them."""
    torch_function = getattr(torch.Tensor, function)

    def on_tensor(x, *args):
        if x.dtype != torch.float64:
            return torch_function(x, *args)
        values = [getattr(math, function.strip("_"))(v, *args) for v in x.reshape(-1).tolist()]
        return torch.tensor(values, dtype=x.dtype).reshape(x.shape)

    return on_tensor


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_float64_steps_are_gymnasiums_bit_for_bit(env_id, monkeypatch):
    """With the C library's sin, cos and pow, 10,000 float64 transitions from gymnasium's states
    under random actions are gymnasium's bit for bit: every other operation is gymnasium's, in its
    order and precision. On a CPU torch's sin and cos round 1 ulp away from the C library's in
    about 0.13% of values, 8 or 16 at a time (AMD EPYC, Zen 4), and torch squares exactly where the
    C library's pow(x, 2), which gymnasium's `x**2` calls in Acrobot and Pendulum, is 1 ulp off in
    0.08%: the next test takes torch's own."""
    monkeypatch.setattr(torch, "cos", libm("cos"))
    monkeypatch.setattr(torch, "sin", libm("sin"))
    monkeypatch.setattr(torch.Tensor, "__pow__", libm("__pow__"))
    assert worst_ulps(env_id, inject_every_step=False) == (0, 0, 0)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_float64_steps_within_4_ulps(env_id):
    """With torch's own sin, cos and squares, each of 10,000 float64 steps from gymnasium's state
    ends with the same terminations and truncations, observations and rewards within 4 ulps of
    gymnasium's and the state within 64 epsilons (Acrobot's four RK4 stages carry a 1-ulp cosine
    into its speeds). Over whole episodes these differences grow where the dynamics are chaotic, as
    in Acrobot's: the test above shows that nothing else differs."""
    obs, reward, state = worst_ulps(env_id, inject_every_step=True)
    assert obs <= 4 and reward <= 4 and state <= 64


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_float32_steps_within_tolerance(env_id):
    """In float32, one step from each of gymnasium's states: the observations within 1e-5 of
    gymnasium's (relative, with an absolute floor of 1e-5), the rewards within 1e-5 relative, the
    ends the same but where the state lies within float32's rounding of a threshold."""
    mismatched = 0
    for theirs, ours, _ in lockstep(env_id, torch.float32, inject_every_step=True):
        (obs, reward, terminated, truncated, _), (o, r, te, tr, _) = theirs, ours
        np.testing.assert_allclose(o, obs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r, reward, rtol=1e-5, atol=1e-5)
        mismatched += int((terminated != te).sum() + (truncated != tr).sum())
    assert mismatched <= 2


def assert_resets_like_gymnasiums(env_class, env_id):
    """10,000 reset states of `env_class` lie within the range of 2,000 of gymnasium's `env_id`
    resets, and each coordinate passes a two-sample Kolmogorov-Smirnov test against them."""
    ours = env_class(10_000, dtype=torch.float64, seed=3).state.numpy()
    env = gym.make(env_id)
    theirs = np.stack([gym_state(env) for seed in range(2000) if env.reset(seed=seed)])
    low, high = theirs.min(0), theirs.max(0)
    spread = np.maximum(high - low, 1e-12)
    assert (ours.min(0) >= low - 0.01 * spread).all()
    assert (ours.max(0) <= high + 0.01 * spread).all()
    for column in range(ours.shape[1]):
        a, b = np.sort(ours[:, column]), np.sort(theirs[:, column])
        grid = np.concatenate([a, b])
        distance = np.abs(
            np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)
        ).max()
        assert distance < 0.05, f"coordinate {column}: KS distance {distance:.3f}"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_resets_follow_gymnasiums_distribution(env_id):
    assert_resets_like_gymnasiums(tensor_envs.TENSOR_ENVS[env_id], env_id)


def test_a_wrong_reset_bound_fails():
    """The check above can fail: CartPole drawing its start from [-0.1, 0.1) is caught."""

    class Wider(tensor_envs.CartPole):
        reset_bounds = (-0.1,) * 4, (0.1,) * 4

    with pytest.raises(AssertionError):
        assert_resets_like_gymnasiums(Wider, "CartPole-v1")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_step_autoreset_and_episode_statistics(env_id):
    """An episode that ends is reset in the same step: the step returns the next episode's first
    observation, its true last one in `final_obs`, and its return and length in `final_info`,
    where `vector_envs.finished_episodes` reads them."""
    vector_envs = load_script("vector_envs")
    envs = tensor_envs.make_tensor_envs(env_id, 4, seed=1)
    envs.reset()
    totals, lengths, returns = torch.zeros(4, dtype=torch.float64), torch.zeros(4), []
    rng = np.random.default_rng(1)
    while len(returns) < 4:
        actions = random_actions(envs.single_action_space, rng, 4)
        obs, reward, terminated, truncated, infos = envs.step(actions)
        totals += reward
        lengths += 1
        done = terminated | truncated
        assert (infos["_final_obs"] == done).all()
        assert torch.equal(obs[done], envs.observe(envs.state)[done])
        episode = infos["final_info"]["episode"]
        np.testing.assert_allclose(episode["r"][done], totals[done], rtol=1e-5)
        assert torch.equal(episode["l"][done], lengths[done].long())
        returns += vector_envs.finished_episodes(infos)
        totals[done], lengths[done] = 0, 0
    assert (envs.elapsed < envs.max_episode_steps).all()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_compiles_whole_without_host_sync(env_id):
    """The step compiles with `fullgraph=True`, recompiles for nothing, makes no host sync, and
    steps as the eager one does."""
    eager = tensor_envs.make_tensor_envs(env_id, 8, seed=2)
    compiled = tensor_envs.make_tensor_envs(env_id, 8, seed=2)
    step = torch.compile(compiled.step, fullgraph=True)
    rng = np.random.default_rng(2)
    actions = [torch.as_tensor(random_actions(eager.single_action_space, rng, 8)) for _ in range(6)]
    queue = iter(actions)
    assert_no_host_sync(step, lambda: (next(queue),), compiled=True)
    for a in actions:
        expected = eager.step(a)
    torch.testing.assert_close(compiled.state, eager.state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(expected[0], compiled.observe(compiled.state), rtol=1e-5, atol=1e-5)


def test_eager_step_makes_no_host_sync():
    envs = tensor_envs.make_tensor_envs("Acrobot-v1", 8, seed=2)
    actions = torch.ones(8, dtype=torch.long)
    assert_no_host_sync(envs.step, lambda: (actions,), compiled=False)


def test_state_dict_resumes_exactly():
    """`state_dict()` holds the whole env, its reset draws included: loaded into a fresh env, the
    next steps are the same as the original's, resets and all."""
    a = tensor_envs.make_tensor_envs("CartPole-v1", 16, seed=5)
    for _ in range(30):
        a.step(torch.ones(16, dtype=torch.long))
    b = tensor_envs.make_tensor_envs("CartPole-v1", 16, seed=99)
    b.load_state_dict(a.state_dict())
    for _ in range(30):
        actions = torch.zeros(16, dtype=torch.long)
        out_a, out_b = a.step(actions), b.step(actions)
        assert torch.equal(out_a[0], out_b[0]) and torch.equal(out_a[2], out_b[2])


def test_seeds_give_each_env_its_own_stream():
    """Env i draws from seed + i (or seed[i]): the same seed gives the same starts, envs and seeds
    differ from each other."""
    one = tensor_envs.make_tensor_envs("CartPole-v1", 8, seed=1).state
    again = tensor_envs.make_tensor_envs("CartPole-v1", 8, seed=1).state
    listed = tensor_envs.make_tensor_envs("CartPole-v1", 8, seed=list(range(1, 9))).state
    other = tensor_envs.make_tensor_envs("CartPole-v1", 8, seed=2).state
    assert torch.equal(one, again) and torch.equal(one, listed)
    assert torch.equal(one[1:], other[:-1]) and not torch.equal(one, other)
    assert len(set(one[:, 0].tolist())) == 8


def test_the_reset_hash_multiplies_modulo_2_to_the_32_exactly():
    """`mul32` is (x * c) mod 2**32 for every 32-bit `x` and the hash's constants, the edges
    included, eager and compiled: no int64 overflow, and the reset draws stay the same stream."""
    rng = np.random.default_rng(0)
    xs = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, *rng.integers(0, 2**32, 1000).tolist()]
    x = torch.tensor(xs)
    compiled = torch.compile(tensor_envs.mul32, fullgraph=True)
    for c in (0x7FEB352D, 0x846CA68B, 1, 2**31, 2**32 - 1):
        expected = torch.tensor([v * c % 2**32 for v in xs])
        assert torch.equal(tensor_envs.mul32(x, c), expected), hex(c)
        assert torch.equal(compiled(x, c), expected), hex(c)


def test_gymnasium_makes_them():
    """`gym.make_vec("tensor/<id>", ...)` makes the tensor env, with its device and seed."""
    envs = gym.make_vec("tensor/Pendulum-v1", num_envs=3, device="cpu", seed=4)
    assert isinstance(envs, tensor_envs.Pendulum) and envs.num_envs == 3
    same = tensor_envs.make_tensor_envs("Pendulum-v1", 3, seed=4)
    assert torch.equal(envs.reset()[0], same.reset()[0])


def test_normalized_observations_follow_gymnasiums_running_statistics():
    """`normalized(keep)`: the kept entries, normalized by gymnasium's RunningMeanStd updated with
    every batch a step returns, clipped to 10; the true final observations by the same statistics,
    uncounted; no host sync; frozen at a trained agent's statistics."""
    envs = tensor_envs.make_tensor_envs("CartPole-v1", 16, seed=3, dtype=torch.float64)
    normalized = tensor_envs.make_tensor_envs("CartPole-v1", 16, seed=3).normalized((0, 2))
    rms = gym.wrappers.utils.RunningMeanStd(shape=(2,))

    def expected(obs, update):
        obs = obs[:, [0, 2]].numpy()
        if update:
            rms.update(obs)
        return np.clip((obs - rms.mean) / np.sqrt(rms.var + 1e-8), -10, 10)

    close = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(normalized.reset()[0], expected(envs.reset()[0], True), **close)
    ends = 0
    for _ in range(40):
        actions = torch.ones(16, dtype=torch.long)
        obs, *_, infos = envs.step(actions)
        ours, *_, our_infos = normalized.step(actions)
        np.testing.assert_allclose(ours, expected(obs, True), **close)
        final, done = expected(infos["final_obs"], False), infos["_final_obs"]
        np.testing.assert_allclose(our_infos["final_obs"][done], final[done.numpy()], **close)
        ends += int(done.sum())
    assert ends > 16 and normalized.obs_rms["count"] == rms.count
    assert_no_host_sync(normalized.step, lambda: (actions,), compiled=False)
    frozen = tensor_envs.make_tensor_envs("CartPole-v1", 16, seed=3).normalized(
        (0, 2), normalized.obs_rms
    )
    frozen.step(actions)
    torch.testing.assert_close(frozen.obs_rms, normalized.obs_rms)


def test_normalized_rewards_follow_gymnasiums_running_statistics():
    """`normalized(gamma=...)`: actions clipped to the action space before the env (gymnasium's
    ClipAction: MountainCarContinuous charges the clipped action), rewards divided by the running
    standard deviation of gymnasium's NormalizeReward sum (a termination cuts it, a truncation
    does not) over the batch, clipped to 10; its state resumes; no host sync."""
    gamma, n, env_id = 0.99, 16, "MountainCarContinuous-v0"
    envs = tensor_envs.make_tensor_envs(env_id, n, seed=5)
    scaled = tensor_envs.make_tensor_envs(env_id, n, seed=5).normalized(gamma=gamma)
    rms, discounted = gym.wrappers.utils.RunningMeanStd(shape=()), np.zeros(n)
    envs.reset(), scaled.reset()
    generator, ends, resumed = torch.Generator().manual_seed(0), [0, 0], None
    for t in range(1100):  # past the 999-step time limit
        # half the cars pushed along their velocity reach the flag, the others are cut off
        push = torch.where(envs.state[:, 1:] >= 0, 1.5, -1.5) * (torch.arange(n)[:, None] < 8)
        actions = push + torch.randn(n, 1, generator=generator)
        _, reward, terminated, truncated, _ = envs.step(actions.clamp(-1, 1))
        _, ours, *_ = scaled.step(actions)
        discounted = discounted * gamma * (1 - terminated.numpy()) + reward.double().numpy()
        rms.update(discounted)
        expected = np.clip(reward.double().numpy() / np.sqrt(rms.var + 1e-8), -10, 10)
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-7)
        ends[0], ends[1] = ends[0] + int(terminated.sum()), ends[1] + int(truncated.sum())
        if resumed is not None:
            torch.testing.assert_close(resumed.step(actions)[1], ours, rtol=0, atol=0)
        if t == 500:
            resumed = tensor_envs.make_tensor_envs(env_id, n).normalized(gamma=gamma)
            resumed.load_state_dict(scaled.state_dict())
    assert ends[0] > 0 and ends[1] > 0
    assert (abs(expected) == 10).any() or rms.var > 1
    assert_no_host_sync(scaled.step, lambda: (actions,), compiled=False)


def test_the_speed_benchmark_times_every_kind_in_rounds(tmp_path, capsys):
    """`python -m benchmarks.tensor_envs`: a row per kind, each the median of its rounds."""
    from benchmarks import tensor_envs as benchmark

    flags = ["--env-ids", "CartPole-v1", "--sizes", "4", "--seconds", "0.01", "--rounds", "3"]
    benchmark.main([*flags, "--no-compile", "--out", str(tmp_path / "out.json")])
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [row["kind"] for row in rows] == ["sync", "numpy", "tensor"]
    assert all(len(row["rounds"]) == 3 and row["sps"] == np.median(row["rounds"]) for row in rows)
