"""The scripts with `--tensor-envs`: each trains and logs its episodes, a stopped run resumes bit
for bit (the envs' state, reset draws and observation statistics travel in the checkpoint), a
recurrent model trained on them plays gymnasium's env, a value they cannot serve is
refused before training, and the rollout steps on the device (PQN's; SAC's, TD3's and PPO
continuous's) compile whole without a host sync; at one env the device loops of SAC, TD3 and PPO
take their host loops' steps."""

import itertools
import json

import numpy as np
import pytest
import torch
from conftest import (
    ALL_SCRIPTS,
    assert_no_host_sync,
    assert_same_state,
    checkpoint,
    load_script,
    long_learning,
    no_host_sync,
    run_script,
    slow_unless,
    summary,
)

tensor_envs = load_script("tensor_envs")
DQN = ("--total-timesteps", 600, "--learning-starts", 200, "--batch-size", 32)
DQN += ("--buffer-size", 1000, "--target-network-frequency", 50)
PQN = ("--total-timesteps", 256, "--num-envs", 2, "--num-steps", 32)
PQN += ("--num-minibatches", 2, "--update-epochs", 2)
OFF_POLICY = ("--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 32)
RECURRENT = ("--total-timesteps", 256, "--num-envs", 2, "--num-steps", 32, "--update-epochs", 2)
PENDULUM = ("--env-id", "Pendulum-v1")
PPO = (*PENDULUM, "--total-timesteps", 512, "--num-envs", 2, "--num-steps", 32)
PPO += ("--update-epochs", 2)
SMOKE = {
    "dqn": DQN,
    "dqn_torchcompile": DQN,
    "dqn_cpu": (*DQN, "--no-compile", "--threads", 1),
    "dqn_seeds": (*DQN, "--num-seeds", 2, "--no-compile", "--threads", 1),
    "pqn": PQN,
    "pqn_torchcompile": PQN,
    "pqn_cpu": (*PQN, "--no-compile", "--threads", 1),
    "sac_continuous_action": ("--env-id", "Pendulum-v1", *OFF_POLICY),
    "sac_continuous_action_torchcompile": ("--env-id", "Pendulum-v1", *OFF_POLICY),
    "sac_continuous_action_cpu": ("--env-id", "Pendulum-v1", *OFF_POLICY, "--no-compile"),
    "td3_continuous_action": ("--env-id", "Pendulum-v1", *OFF_POLICY),
    "td3_continuous_action_torchcompile": ("--env-id", "Pendulum-v1", *OFF_POLICY),
    "td3_continuous_action_cpu": ("--env-id", "Pendulum-v1", *OFF_POLICY, "--no-compile"),
    "ppo_lstm": RECURRENT,
    "ppo_lstm_torchcompile": RECURRENT,
    "ppo_mingru": (*RECURRENT, "--no-memory"),
    "ppo_mingru_torchcompile": RECURRENT,
    "ppo_continuous_action": PPO,
    "ppo_continuous_action_torchcompile": PPO,
    "ppo_continuous_action_cpu": (*PPO, "--no-compile", "--threads", 1),
}


# a script whose resume, evaluation or device loop test trains it the same way: slow (that test
# runs quick)
GUARDED = {"dqn", "pqn", "pqn_torchcompile", "ppo_lstm"}
GUARDED |= {"ppo_continuous_action", "ppo_continuous_action_cpu"}
GUARDED |= {f"{algo}_torchcompile" for algo in ("sac_continuous_action", "td3_continuous_action")}
GUARDED |= {"ppo_continuous_action_torchcompile"}


@pytest.mark.parametrize("script", slow_unless(lambda s: s not in GUARDED, list(SMOKE)))
def test_a_script_trains_on_the_tensor_envs(script, train, tmp_path):
    assert train(script, *SMOKE[script], "--tensor-envs", "--run-name", "t") == 0
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    curves = summary.get("curves", [summary.get("curve")])  # a seeds script: one per member
    assert summary["episodes"] == sum(len(curve) for curve in curves)
    assert all(len(curve) > 0 for curve in curves)
    assert summary["return_mean"] is not None and abs(summary["return_mean"]) < 1e5


# script -> the vector step at which the stopped run gets its SIGTERM (the off-policy twins' in
# the middle of their episode log's 100 steps, PPO's in its 4th rollout of 8)
RESUMED = {"dqn": 355, "pqn": 64, "pqn_torchcompile": 64, "ppo_lstm": 48}
RESUMED |= {"ppo_continuous_action_cpu": 48, "ppo_continuous_action_torchcompile": 112}
RESUMED |= {"sac_continuous_action_torchcompile": 355, "td3_continuous_action_torchcompile": 355}
# and on a MuJoCo task of MuJoCo Warp (Ant: its resets run the engine's kinematics)
MUJOCO = ("--env-id", "Ant-v5", "--total-timesteps", 256, "--num-envs", 2, "--num-steps", 32)
RESUMED_RUNS = [
    (script, (*SMOKE[script], "--tensor-envs"), step) for script, step in RESUMED.items()
]
RESUMED_RUNS.append(("ppo_continuous_action_cpu", (*MUJOCO, "--no-compile", "--tensor-envs"), 48))


@pytest.mark.parametrize(
    "script, flags, stop_at", RESUMED_RUNS, ids=[*RESUMED, "ppo_continuous_action_cpu-Ant-v5"]
)
def test_a_resumed_run_on_tensor_envs_ends_as_one_that_went_through(
    script, flags, stop_at, train, tmp_path
):
    assert train(script, *flags, "--run-name", "through") == 0
    step = (tensor_envs.TensorEnv, "step")
    stopped = train(script, *flags, "--run-name", "stopped", stop_at=stop_at, counted=step)
    assert stopped == 143
    resume = ("--resume", tmp_path / "runs" / "stopped")
    assert train(script, *flags, *resume) == 0
    through, resumed = checkpoint(tmp_path / "runs" / "through"), checkpoint(resume[1])
    assert resumed["resumes"][0]["fresh_episodes"] is False
    assert_same_state(through["state"], resumed["state"])
    assert_same_state(through["ranks"][0][1], resumed["ranks"][0][1], "envs")  # the tensor envs'
    curves = [[(s, r) for s, _, r in saved["curves"][0]] for saved in (through, resumed)]
    assert curves[0] == curves[1]


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--env-id", "LunarLander-v3"), ("--tensor-envs", "LunarLander-v3", "CartPole-v1")),
        (("--capture-video",), ("--tensor-envs", "videos")),
    ],
)
def test_what_the_tensor_envs_cannot_serve_is_refused(flags, words, refused):
    refused("dqn", ("--tensor-envs", *flags), words)


def test_a_rollout_larger_than_the_device_is_refused(refused):
    """PQN's twin at 2**22 envs x 2**12 steps would need 2.3 TiB: refused before training."""
    flags = ("--tensor-envs", "--num-envs", 2**22, "--num-steps", 2**12, "--total-timesteps", 2**34)
    refused("pqn_torchcompile", flags, ("--num-envs", "--num-steps", "GiB"))


# the scripts that train on gymnasium's or envpool's envs only
WITHOUT = {"ppo_continuous_action_distributed", "ppo_continuous_action_ray"}
WITHOUT |= {f"{algo}_seeds" for algo in ("sac_continuous_action", "td3_continuous_action")}
WITHOUT |= {"ppo_continuous_action_seeds"} | {s for s in ALL_SCRIPTS if "envpool" in s}


def test_only_the_scripts_that_train_on_them_have_the_flag(capsys):
    """`--tensor-envs` is a flag of the scripts that honour it (`TensorEnvFlags`), and of no other:
    there it is not in `--help`, and tyro refuses it (exit status 2)."""
    import tyro

    has_flag = {s for s in ALL_SCRIPTS if "tensor_envs" in vars(load_script(s).Args())}
    assert has_flag == set(ALL_SCRIPTS) - WITHOUT and set(SMOKE) <= has_flag
    Args = load_script("ppo_continuous_action_seeds").Args
    with pytest.raises(SystemExit) as stop:
        tyro.cli(Args, args=["--help"])
    assert stop.value.code == 0 and "--tensor-envs" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        tyro.cli(Args, args=["--tensor-envs"])
    assert stop.value.code == 2


@pytest.mark.parametrize(
    "script, flags, env, entries",
    [("ppo_lstm", RECURRENT, (), 2), ("ppo_continuous_action", PPO, PENDULUM, 3)],
)
def test_a_normalizing_model_trained_on_them_plays_gymnasiums_env(
    script, flags, env, entries, tmp_path
):
    """The batch's normalization statistics travel with the model; its evaluation runs on
    gymnasium's env through the script's own wrappers, frozen at those statistics."""
    trained = summary(run_script(script, *flags, "--tensor-envs", "--save-model", cwd=tmp_path))
    obs_rms = torch.load(trained["model_file"], weights_only=True)["model"]["obs_rms"]
    assert obs_rms["mean"].shape == (entries,) and obs_rms["count"] > 256
    assert obs_rms["var"].min() > 0 and obs_rms["mean"].abs().max() > 0
    flags = (*env, "--eval-model", trained["model_file"], "--eval-episodes", "2")
    played = summary(run_script(script, *flags, cwd=tmp_path))
    assert len(played["eval_returns"]) == 2 and played["episodes"] == 0


def pqn_rollout(num_envs, num_steps, seed=1):
    """pqn_torchcompile's rollout storage, learner, tensor envs and rollout step, as `main` makes
    them."""
    pqn = load_script("pqn_torchcompile")
    args = pqn.Args(tensor_envs=True, num_envs=num_envs, num_steps=num_steps)
    torch.manual_seed(seed)
    learner = pqn.make_learner(args, 4, 2, torch.device("cpu"))
    envs = tensor_envs.make_tensor_envs("CartPole-v1", num_envs, seed=seed)
    shape = (num_steps, num_envs)
    rollout = {key: torch.zeros(shape) for key in ("values", "rewards", "final_values")}
    rollout |= {key: torch.zeros(shape) for key in ("terminations", "truncations")}
    rollout |= dict(obs=torch.zeros(*shape, 4), actions=torch.zeros(shape, dtype=torch.long))
    rollout |= dict(ended=torch.zeros(shape, dtype=torch.bool), episode_returns=torch.zeros(shape))
    rollout["episode_lengths"] = torch.zeros(shape, dtype=torch.long)
    step = pqn.make_rollout_step(envs, learner.policy, learner.get_value, rollout)
    return learner, envs, rollout, step


def test_pqns_rollout_compiled_takes_the_eager_steps_without_host_sync(monkeypatch):
    """The rollout step compiled whole, as `--compile` runs it, against the same step eagerly, a
    step at a time: over 64 steps of 64 envs the same actions, episode ends and returns, and values
    within 1e-5 (inductor's `fallback_random` draws the exploration with torch's generator, as the
    eager step does). Then the compiled step runs on without a host sync or a recompilation."""
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    rollouts = []
    for compile in (False, True):
        learner, envs, rollout, step = pqn_rollout(64, 64)
        step = torch.compile(step, fullgraph=True) if compile else step
        obs, _ = envs.reset()
        torch.manual_seed(3)
        with torch.no_grad():
            for index in torch.arange(64).split(1):
                obs = step(obs, index)
        rollouts.append(rollout)
    eager, compiled = rollouts
    for key in ("actions", "terminations", "truncations", "ended", "episode_returns"):
        assert torch.equal(eager[key], compiled[key]), key
    assert eager["ended"].sum() > 0
    for key in ("obs", "values", "final_values"):
        torch.testing.assert_close(compiled[key], eager[key], rtol=1e-5, atol=1e-5)
    index = torch.tensor([2])
    with torch.no_grad():
        next_obs = assert_no_host_sync(step, lambda: (obs, index), compiled=True)
    assert torch.equal(rollout["obs"][2], obs) and next_obs.shape == obs.shape
    # acting advanced the step counter on the device: 64 steps, then 6 calls, of 64 envs
    assert learner.global_step.item() == (64 + 6) * 64


@long_learning  # 30 s; in the suite, test_pqn's 256-env check learns on the tensor envs
def test_pqn_learns_cartpole_on_the_tensor_envs():
    """pqn_cpu.py with `--tensor-envs`, at its learning test's budget and bar (seed 1, 122,880
    steps, the last 20 episodes' mean above 50). Seeds 1-10 on a 2-core AMD EPYC (Zen 4): 61.0 to
    107.8, 84.0 +- 12.0, against 62.4 to 129.8, 90.2 +- 21.1 on gymnasium's envs (Mann-Whitney
    p = 0.80; python -m benchmarks.tensor_envs_learning)."""
    s = summary(run_script("pqn_cpu", "--seed", 1, "--total-timesteps", 122_880, "--tensor-envs"))
    assert s["return_mean"] > 50, s


def test_the_learning_comparison_tests_with_scipys_mann_whitney():
    """benchmarks.report's U and two-sided p-value: exact in a small sample without ties (two
    against two with no overlap: 2 of the 6 splits as extreme), U counting a tie as a half."""
    from benchmarks import report

    assert report.mann_whitney([1, 2], [3, 4]) == pytest.approx((0.0, 2 / 6))
    assert report.mann_whitney([4, 3], [1, 2]) == pytest.approx((4.0, 2 / 6))
    assert report.mann_whitney([1, 2], [2, 3])[0] == 0.5


# the twins whose loop runs on the device with --tensor-envs -> a short run at one env: 200 random
# steps, then 200 of learning (SAC, TD3); 4 rollouts of 64 steps (PPO)
DEVICE_LOOPS = {
    "sac_continuous_action_torchcompile": (*PENDULUM, *OFF_POLICY),
    "td3_continuous_action_torchcompile": (*PENDULUM, *OFF_POLICY),
    "ppo_continuous_action_torchcompile": (*PENDULUM, "--total-timesteps", 256, "--num-steps", 64),
}


@pytest.mark.parametrize("script", DEVICE_LOOPS)
def test_the_device_loop_at_one_env_takes_the_host_loops_steps(
    script, train, tmp_path, monkeypatch
):
    """At one env, on the same seed and the same tensor envs, the twin's loop on the device (one
    function acts, steps the envs and stores the step) takes the actions and stores the transitions
    of its host loop (acting, handing the actions to the envs, storing), bit for bit, eagerly: the
    same replay buffer (every transition, its actions too), learner, envs and episodes. The host
    loop draws its random phase from the action space's numpy generator; here it draws as the
    device loop does, uniform in the bounds from torch's generator."""
    vector_envs = load_script("vector_envs")
    make_envs = vector_envs.make_envs

    def host_envs(*args, **kwargs):  # the tensor envs, stepped by the host loop
        envs = make_envs(*args, **kwargs | dict(tensor=True))
        space = envs.single_action_space
        high, low = (torch.as_tensor(x, dtype=torch.float32) for x in (space.high, space.low))
        scale, bias = (high - low) / 2.0, (high + low) / 2.0
        draw = lambda: bias + scale * (2 * torch.rand(envs.num_envs, len(high)) - 1)  # noqa: E731
        envs.action_space.sample = draw
        return envs

    flags = DEVICE_LOOPS[script]
    assert train(script, *flags, "--tensor-envs", "--run-name", "device") == 0
    monkeypatch.setattr(vector_envs, "make_envs", host_envs)
    assert train(script, *flags, "--run-name", "host") == 0
    device, host = (checkpoint(tmp_path / "runs" / name) for name in ("device", "host"))
    assert device["state"].keys() - host["state"].keys() <= {"episode_log"}
    assert_same_state({k: device["state"][k] for k in host["state"]}, host["state"])
    (device_curve,), (host_curve,) = device["curves"], host["curves"]
    assert [(s, r) for s, _, r in device_curve] == [(s, r) for s, _, r in host_curve]
    assert len(host_curve) >= 1


def rollout_step_of(script, num_envs, seed=1):
    """`script`'s rollout step on `num_envs` tensor Pendulums, as `main` builds it with
    `--tensor-envs`; the envs' first observation, the step's storage (the replay buffer's columns,
    or the rollout) and its episode log."""
    module = load_script(script)
    args = module.Args(tensor_envs=True, num_envs=num_envs)
    torch.manual_seed(seed)
    envs = tensor_envs.make_tensor_envs("Pendulum-v1", num_envs, seed=seed)
    log, cpu = load_script("vector_envs").EpisodeLog(300, num_envs, "cpu"), torch.device("cpu")
    if script.startswith("ppo"):
        envs = envs.normalized(gamma=args.gamma)
        # the normalization's 0-d float64 statistics as 1-element views: on a CPU (not a GPU)
        # dynamo guards such a tensor's value with `.item()` before each call, which the sync
        # check would refuse
        for wrapper, name in itertools.product((envs, envs.env), ("mean", "var", "count")):
            statistic = getattr(wrapper, name)
            setattr(wrapper, name, statistic.view(-1) if statistic.dim() == 0 else statistic)
        learner = module.make_learner(args, 3, 1, cpu)
        scalars = ("logprobs", "values", "rewards", "terminations", "truncations", "final_values")
        storage = {key: torch.zeros(300, num_envs) for key in scalars}
        storage |= dict(obs=torch.zeros(300, num_envs, 3), actions=torch.zeros(300, num_envs, 1))
        step = module.make_rollout_step(envs, learner.policy, learner.get_value, storage, log)
    else:
        learner = module.make_learner(args, 3, 1, -2 * np.ones(1), 2 * np.ones(1), cpu)
        rb = module.ReplayBuffer(1000, 3, 1, cpu)
        sac = script.startswith("sac")
        act = (lambda obs: learner.policy(obs)[0]) if sac else learner.policy  # noqa: E731
        step, storage = module.make_rollout_step(envs, act, rb, log), rb.columns
    return step, envs.reset()[0], storage, log


@pytest.mark.slow  # compiles three rollout steps (about 20 s each here)
@pytest.mark.parametrize("script", DEVICE_LOOPS)
def test_a_rollout_step_compiled_takes_the_eager_steps_without_host_sync(script, monkeypatch):
    """The rollout step compiled whole, as `--compile` runs it, against the same step eagerly: over
    250 steps of 4 Pendulums (truncated at step 200) the same episodes, and observations, actions,
    rewards and values within 1e-4 (inductor's `fallback_random` draws the noise with torch's
    generator, as the eager step does, but the compiled networks round otherwise, by about 1e-7,
    and 250 steps of the pendulum grow that to 5e-5 in TD3's observations). Then it runs on
    without a host sync, eagerly and compiled, and without recompiling."""
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    runs = []
    for compile in (False, True):
        step, obs, storage, log = rollout_step_of(script, 4)
        step = torch.compile(step, fullgraph=True) if compile else step
        torch.manual_seed(3)
        with torch.no_grad():
            for row in torch.arange(250).split(1):
                obs = step(obs, row)
        runs.append(({k: v.clone() for k, v in storage.items()}, log.state_dict()["columns"]))
        with torch.no_grad():
            assert_no_host_sync(step, lambda o=obs: (o, torch.tensor([260])), compiled=compile)
    (eager, eager_log), (compiled, compiled_log) = runs
    for key in eager:
        torch.testing.assert_close(compiled[key], eager[key], rtol=1e-4, atol=1e-4, msg=key)
    for a, b in zip(eager_log, compiled_log):
        torch.testing.assert_close(a[:250], b[:250], rtol=1e-4, atol=1e-4)
    assert eager_log[0][:250].sum() == 4 and eager_log[0][199].all()


@pytest.mark.parametrize("script", list(DEVICE_LOOPS)[:2])
def test_a_truncated_step_stores_the_true_last_observation(script):
    """SAC's and TD3's rollout step at Pendulum's time limit: the transition of the 200th step of
    each env holds the observation the dynamics reached, not the next episode's first, and is not
    terminal; recomputed here from the stored observation and action by another tensor Pendulum."""
    step, obs, rb, _ = rollout_step_of(script, 2)
    with torch.no_grad():
        for row in torch.arange(201).split(1):
            obs = step(obs, row)
    cut = slice(2 * 199, 2 * 200)  # the buffer's rows of the 200th vector step
    probe = tensor_envs.make_tensor_envs("Pendulum-v1", 2)
    cos, sin, speed = rb["obs"][cut].unbind(1)
    probe.state.copy_(torch.stack([torch.atan2(sin, cos), speed], dim=1))
    reached = probe.step(rb["actions"][cut])[4]["final_obs"]
    torch.testing.assert_close(rb["next_obs"][cut], reached, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(rb["next_obs"][cut], rb["obs"][2 * 200 : 2 * 201], atol=1e-3)
    # elsewhere an env's next observation is its next step's
    assert torch.equal(rb["next_obs"][: 2 * 199], rb["obs"][2 : 2 * 200])
    assert not rb["terminations"][: 2 * 201].any()


@pytest.mark.parametrize("script", list(DEVICE_LOOPS)[:2])
def test_the_replay_buffer_writes_and_samples_on_the_device_without_host_sync(script):
    """SAC's and TD3's buffer, its cursor and size tensors: 7 writes of 3 rows into 16 wrap around
    (the 6th overwrites the first write's rows 0 and 1, the 7th its row 2 and the second's 3 and
    4), each write and sample without a host sync; samples come from the filled rows only, from all
    of them, also when only one write has filled 3 rows."""
    module = load_script(script)
    rb = module.ReplayBuffer(16, 1, 1, torch.device("cpu"))
    with no_host_sync():
        for k in range(7):
            obs = torch.full((3, 1), float(k))
            rb.add(
                dict(obs=obs, next_obs=obs, actions=obs, rewards=obs[:, 0], terminations=obs[:, 0])
            )
            batch = rb.sample(64)
    assert (int(rb.cursor), int(rb.size)) == (5, 16)
    assert rb.columns["obs"][:, 0].tolist() == [5.0] * 2 + [6.0] * 3 + [
        k // 3 for k in range(5, 16)
    ]
    assert set(rb.sample(4096)["obs"][:, 0].tolist()) == set(range(1, 7)) and batch.batch_size == (
        64,
    )
    empty = module.ReplayBuffer(16, 1, 1, torch.device("cpu"))
    with no_host_sync():
        empty.add(
            dict(obs=obs, next_obs=obs, actions=obs, rewards=obs[:, 0], terminations=obs[:, 0])
        )
        sampled = empty.sample(256)["obs"][:, 0]
    assert set(sampled.tolist()) == {6.0} and int(empty.size) == 3
