"""What every script promises alike (CONTRIBUTING.md), proved once per script by calling the
script's own functions or running it: the true final observation of an ended episode is the one
stored, every finished episode is counted, an off-policy replay buffer wraps around, `--env-id`
takes what `gym.make` takes (gymnasium's `module:EnvId` form too) and refuses an unknown id with
one line and exit status 2, bad flag values exit 2 with one line, `--cudagraphs` without CUDA is
a user error, and a CPU script has no CUDA flag. Every smoke run's SUMMARY `curve` (one point
per counted episode, steps in order) is checked by `conftest.summary`."""

import inspect

import numpy as np
import pytest
import torch
import tyro
from conftest import SCRIPTS as SCRIPTS_DIR
from conftest import assert_user_error, load_script, requires_cuda, run_script, summary

from benchmarks.scripts import script_envs

ALGOS = ("sac_continuous_action", "td3_continuous_action", "dqn", "ppo_continuous_action")
FAMILIES = {algo: [algo, f"{algo}_torchcompile", f"{algo}_cpu"] for algo in (*ALGOS, "pqn")}
# the scripts that scale a twin out keep its contract: plainly run, they are one process of it
SCALED_OUT = ["ppo_continuous_action_distributed", "ppo_continuous_action_ray"]
SCRIPTS = [name for family in FAMILIES.values() for name in family] + SCALED_OUT
CPU_SCRIPTS = [f"{algo}_cpu" for algo in FAMILIES]
OFF_POLICY_CONTINUOUS = FAMILIES["sac_continuous_action"] + FAMILIES["td3_continuous_action"]
# every script whose envs are gymnasium's (the Atari pair makes envpool's; the Ray script checks the
# id on the driver with the `make_envs` its runners use)
GYMNASIUM = SCRIPTS + ["ppo_lstm", "ppo_lstm_torchcompile", "ppo_mingru", "ppo_mingru_torchcompile"]
# a classic-control env each script can train on, named in gymnasium's `module:EnvId` form
MODULE_ENV_IDS = dict.fromkeys(
    ["dqn", "pqn", "ppo_lstm", "ppo_mingru"], "gymnasium.envs.classic_control:CartPole-v1"
)
# 3 Pendulum episodes of 200 steps; 100 gradient steps after the random phase
PENDULUM_SMOKE = "--env-id Pendulum-v1 --total-timesteps 600 --learning-starts 500 --batch-size 32"
PENDULUM_SMOKE = tuple(PENDULUM_SMOKE.split())


def family_of(script):
    return next((algo for algo in MODULE_ENV_IDS if script.startswith(algo)), None)


def test_the_families_are_on_disk():
    """A script missing from disk would make every parametrized test below error, not skip: say it
    at once."""
    missing = [name for name in GYMNASIUM if not (SCRIPTS_DIR / f"{name}.py").exists()]
    assert missing == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_true_final_observation_replaces_the_reset_one(script):
    module = load_script(script)
    next_obs = np.array([[1.0, 1.0], [2.0, 2.0]], dtype=np.float32)  # env 1 has already been reset
    final_obs = np.array([None, np.array([9.0, 9.0], dtype=np.float32)], dtype=object)
    infos = {"final_obs": final_obs, "_final_obs": np.array([False, True])}
    np.testing.assert_array_equal(module.true_next_obs(next_obs, infos), [[1.0, 1.0], [9.0, 9.0]])
    # the reset obs is kept for acting
    np.testing.assert_array_equal(next_obs, [[1.0, 1.0], [2.0, 2.0]])
    assert module.true_next_obs(next_obs, {}) is not next_obs


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_finished_episode_is_counted(script):
    module = load_script(script)
    episode = {"r": np.array([-5.0, 0.0, -7.0]), "l": np.array([200, 0, 200])}
    infos = {"final_info": {"episode": episode, "_episode": np.array([True, False, True])}}
    assert module.finished_episodes(infos) == [-5.0, -7.0]
    assert module.finished_episodes(infos).lengths == [200, 200]  # TensorBoard's episodic_length
    assert module.finished_episodes({}) == []


@pytest.mark.parametrize("script", OFF_POLICY_CONTINUOUS)
def test_replay_buffer_wraps_around_and_samples_what_was_added(script):
    """The eager scripts add tensors, the twins and the CPU scripts the env's numpy arrays (the CPU
    scripts write them through numpy views of the buffer's tensors)."""
    module = load_script(script)
    options = (
        {"device": "cpu"} if "device" in inspect.signature(module.ReplayBuffer).parameters else {}
    )
    rb = module.ReplayBuffer(buffer_size=5, n_obs=1, n_act=1, **options)
    for step in range(7):  # 14 transitions through a buffer of 5
        values = np.array([2.0 * step, 2.0 * step + 1])
        transition = {
            "obs": values[:, None],
            "next_obs": values[:, None] + 0.5,
            "actions": -values[:, None],
            "rewards": values,
            "terminations": np.zeros(2),
        }
        if script in ALGOS:
            transition = {k: torch.as_tensor(v, dtype=torch.float) for k, v in transition.items()}
        rb.add(transition)
    assert (rb.size, rb.cursor) == (5, 4)
    batch = rb.sample(200)
    assert set(batch["rewards"].tolist()) == {9.0, 10.0, 11.0, 12.0, 13.0}
    torch.testing.assert_close(batch["obs"][:, 0], batch["rewards"])
    torch.testing.assert_close(batch["next_obs"][:, 0], batch["rewards"] + 0.5)
    torch.testing.assert_close(batch["actions"][:, 0], -batch["rewards"])


@pytest.mark.parametrize("script", GYMNASIUM)
def test_env_id_takes_the_module_form_and_refuses_an_unknown_id(script, capsys):
    """`--env-id package.module:EnvId` imports the module that registers the env, as `gym.make`
    does; an id that names no env, or a module that does not exist, exits 2 with one line naming
    the flag and the id."""
    module = load_script(script)
    env_id = MODULE_ENV_IDS.get(family_of(script), "gymnasium.envs.classic_control:Pendulum-v1")
    _, envs = script_envs(module, ["--env-id", env_id])
    obs, _ = envs.reset(seed=0)
    assert obs.shape[0] == envs.num_envs and np.isfinite(obs).all()
    envs.close()
    for bad in ("NoSuchEnv-v0", "no_such_module:Pendulum-v1"):
        with pytest.raises(SystemExit) as stop:
            script_envs(module, ["--env-id", bad])
        assert stop.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--env-id" in lines[0] and bad in lines[0], lines


@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_a_cpu_script_has_no_cuda_flags(script, capsys):
    """The CPU scripts train on the CPU whatever the machine has: `--cuda` and `--cudagraphs` are
    not theirs, and tyro refuses them (exit 2) rather than ignoring them."""
    module = load_script(script)
    assert not {"cuda", "cudagraphs"} & set(vars(module.Args()))
    for flag in ("--cuda", "--cudagraphs"):
        with pytest.raises(SystemExit) as stop:
            tyro.cli(module.Args, args=[flag])
        assert stop.value.code == 2
        assert flag in capsys.readouterr().err


@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_a_cpu_script_refuses_threads_below_one(script, train, capsys):
    """`--threads` (by default the script's rule, in its docstring) must be positive: 0 or -1 exits
    2 in one line."""
    for value in ("0", "-1"):
        assert train(script, "--threads", value) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--threads" in lines[0] and value in lines[0], lines


# `refused` hides the GPUs, so this holds on a GPU machine too
@pytest.mark.parametrize(
    "script",
    [f"{algo}_torchcompile" for algo in FAMILIES]
    + SCALED_OUT
    + ["ppo_atari_envpool_torchcompile", "pqn_atari_envpool_torchcompile"],
)
def test_cudagraphs_without_cuda_exits_2(script, refused):
    refused(script, ("--cudagraphs",), ("--cudagraphs", "CUDA"))


# bad flag values of the off-policy continuous scripts and the words their one line must hold
BAD_FLAGS = [
    (("--env-id", "CartPole-v1"), ("--env-id", "Discrete")),
    (("--batch-size", "0"), ("--batch-size",)),
    (("--batch-size", "512", "--buffer-size", "256"), ("--batch-size", "--buffer-size")),
]


@pytest.mark.parametrize("script", OFF_POLICY_CONTINUOUS)
def test_off_policy_bad_input_exits_2(script, refused):
    """Each bad value is refused by the script's own checks, in process, before training; one of
    them through a whole run too, which shows `main` checks before it makes a run folder."""
    for flags, words in BAD_FLAGS:
        refused(script, flags, words)
    assert_user_error(run_script(script, *BAD_FLAGS[2][0], timeout=120), *BAD_FLAGS[2][1])


@pytest.mark.parametrize(
    "script", [name for name in OFF_POLICY_CONTINUOUS if not name.endswith("_cpu")]
)
def test_updates_per_step_and_envs_past_the_buffer_exit_2(script, refused):
    """`--num-updates` (the eager scripts and twins of SAC and TD3) must be positive; more envs than
    the buffer holds would write one vector step's rows over each other: refused."""
    refused(script, ("--num-updates", "0"), ("--num-updates",))
    if script.endswith("_torchcompile"):  # the eager scripts check the batch alone, as CleanRL
        refused(
            script, ("--num-envs", "8", "--buffer-size", "4", "--batch-size", "4"), ("--num-envs",)
        )


@requires_cuda
@pytest.mark.parametrize(
    "script", [name for name in OFF_POLICY_CONTINUOUS if name.endswith("_torchcompile")]
)
@pytest.mark.parametrize(
    "flags",
    [("--cudagraphs",), ("--compile", "--cudagraphs")],
    ids=["cudagraphs", "compile-cudagraphs"],
)
def test_off_policy_cudagraphs_smoke(script, flags):
    result = summary(run_script(script, *PENDULUM_SMOKE, "--measure-burnin", "5", *flags))
    assert (result["device"], result["cudagraphs"], result["episodes"]) == ("cuda", True, 3)
    assert -2000 < result["return_mean"] < 0
