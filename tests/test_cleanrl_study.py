"""benchmarks.studies.cleanrl: CleanRL's sps read from its printed `SPS:` lines, the compatibility
edits of its scripts, the rows and their ratios. A CleanRL checkout is not part of the project: the
tests that run its scripts need one named by LEANRL_CLEANRL (e.g. a checkout at fe8d8a0), and skip
without it."""

import json
import os
from pathlib import Path

import gymnasium as gym
import pytest

from benchmarks.run import BenchmarkError
from benchmarks.studies import cleanrl

CHECKOUT = os.environ.get("LEANRL_CLEANRL")
needs_checkout = pytest.mark.skipif(
    not CHECKOUT, reason="needs a CleanRL checkout: LEANRL_CLEANRL=<its folder>"
)
SAC = dict(env_id="HalfCheetah-v4", total_timesteps=8000, learning_starts=5000)
PPO = dict(env_id="HalfCheetah-v4", total_timesteps=20480, num_steps=2048)


def printed(budget, seconds):
    """What CleanRL's script prints at the steps of `budget`, the elapsed time at step s being
    `seconds(s)`: `SPS: int(s / elapsed)`, between other lines."""
    lines = ["global_step=1, episodic_return=[-3.]"]
    for step in cleanrl.print_steps(budget):
        lines += [f"SPS: {int(step / seconds(step))}", f"global_step={step}, episodic_return=[1.]"]
    return "\n".join(lines) + "\n"


def test_cleanrl_sps_is_read_from_its_prints():
    """SAC: random steps at 2,000 sps for 5,000 steps, then 3,000 steps at 135 sps: the prints
    every 100 steps after learning starts give the phase's 135 sps to within 0.5 / 135 (the print
    truncates), and the whole run's sps is the last print's. PPO's phase starts after its
    third iteration; prints that do not match the budget give None."""
    assert list(cleanrl.print_steps(SAC)) == list(range(5100, 8000, 100))
    seconds = lambda step: min(step, 5000) / 2000 + max(step - 5000, 0) / 135  # noqa: E731
    phase, whole = cleanrl.cleanrl_sps(printed(SAC, seconds), SAC)
    assert phase == pytest.approx(135, rel=0.5 / 135)
    assert whole == int(7900 / seconds(7900)) + 0.5
    # PPO: 400 sps in the first 3 iterations (compile-free, but slower), then 2,000
    assert list(cleanrl.print_steps(PPO)) == [2048 * k for k in range(1, 11)]
    seconds = lambda step: min(step, 6144) / 400 + max(step - 6144, 0) / 2000  # noqa: E731
    # the last elapsed (22.5 s, at 909 sps) within 0.5 / 909 of itself, the phase 7.2 s of it
    assert cleanrl.cleanrl_sps(printed(PPO, seconds), PPO)[0] == pytest.approx(2000, rel=2e-3)
    # PQN prints after each iteration of 4 envs x 128 steps
    pqn = next(algo for algo in cleanrl.ALGOS if algo.name == "pqn").full
    assert list(cleanrl.print_steps(pqn)) == [512 * k for k in range(1, 101)]
    one_less = printed(SAC, seconds).replace("SPS: ", "sps: ", 1)
    assert cleanrl.cleanrl_sps(one_less, SAC) is None
    assert cleanrl.cleanrl_sps("SPS: 0\n" * 29, SAC) is None


def test_the_patches_apply_once_each_and_refuse_another_checkout():
    source = "\n".join(old for files, old, _ in cleanrl.PATCHES if files is None) + "\n"
    source += 'x = infos["final_observation"]\n'
    patched = cleanrl.patched("dqn", source)
    assert "autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, env_fns=" in patched
    assert "for info in final_infos(infos):" in patched and 'infos["final_obs"]' in patched
    assert "tensorboard" not in patched.replace("tensorboard left out", "")
    with pytest.raises(BenchmarkError, match="fe8d8a0"):
        cleanrl.patched("ppo_continuous_action", source)  # no TransformObservation line
    with pytest.raises(BenchmarkError, match="2 of"):
        cleanrl.patched("dqn", source + 'y = infos["final_observation"]\n')


def test_final_infos_reads_gymnasium_1s_vector_info():
    """The patched scripts' `final_infos` turns the vector info of an episode's last step (same-step
    autoreset) into one info per env: the ended env's episode, None for the other."""
    namespace = {}
    exec(cleanrl.COMPAT, namespace)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))] * 2,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs.reset(seed=[0, 1])
    infos = {}
    while "final_info" not in infos:
        _, _, terminations, truncations, infos = envs.step(envs.action_space.sample())
    ended = terminations | truncations
    infos_per_env = namespace["final_infos"](infos)
    assert [info is not None for info in infos_per_env] == list(ended)
    first = next(info for info in infos_per_env if info)
    assert first["episode"]["r"] == first["episode"]["l"] > 0  # CartPole: 1 per step
    namespace["SummaryWriter"]("runs/x").add_scalar("charts/SPS", 1, 2)  # does nothing


def test_rows_are_medians_and_their_ratios_to_cleanrl():
    runs = lambda *sps: [dict(sps=s, sps_run=s / 2, threads=t) for s, t in sps]  # noqa: E731
    results = {"sac": {"cleanrl": runs((100, None), (140, None)), "cpu": runs((150, 1), (210, 2))}}
    table = cleanrl.rows(results)
    assert [(r["variant"], r["sps"], r["min"], r["max"]) for r in table] == [
        ("cleanrl", 120, 100, 140),
        ("cpu", 180, 150, 210),
    ]
    assert [r["vs_cleanrl"] for r in table] == [1.0, 1.5]
    assert [r["run_vs_cleanrl"] for r in table] == [1.0, 1.5] and table[1]["threads"] == [1, 2]
    machine = dict(cpu="a CPU", cores=2, gpu=None, versions={"torch": "2.13.0"})
    settings = dict(rounds=2, budget="full", cleanrl_commit="fe8d8a0")
    md = cleanrl.markdown(dict(machine=machine, settings=settings, rows=table))
    assert "CleanRL fe8d8a0; 2 alternating round(s)" in md
    assert "| sac | cpu | 180 | 150-210 | 1.50x | 1.50x | 1 2 |" in md
    assert "| sac | cleanrl | 120 | 100-140 | 1.00x | 1.00x | torch's default |" in md


def test_bad_arguments_exit_2(tmp_path, capsys):
    for argv in (
        ["--cleanrl", str(tmp_path)],  # not a checkout
        ["--cleanrl", str(tmp_path), "--algos", "a2c"],
        ["--cleanrl", str(tmp_path), "--variants", "cpu"],  # nothing to compare with
    ):
        with pytest.raises(SystemExit) as stop:
            cleanrl.main(argv)
        assert stop.value.code == 2 and capsys.readouterr().err.startswith("error: ")


@needs_checkout
def test_the_patches_apply_to_cleanrls_scripts(tmp_path):
    """Every edit matches CleanRL's four scripts exactly once; the edited files compile."""
    names = [algo.cleanrl for algo in cleanrl.ALGOS]
    cleanrl.cleanrl_copy(CHECKOUT, names, tmp_path)
    for name in names:
        source = (tmp_path / "cleanrl" / f"{name}.py").read_text()
        compile(source, name, "exec")
        assert "final_infos(infos)" in source and "AutoresetMode.SAME_STEP" in source
    assert (tmp_path / "cleanrl_utils" / "buffers.py").exists()


@needs_checkout
def test_the_study_runs_every_algorithm_beside_cleanrl(tmp_path):
    """Tiny budgets, one round, CleanRL's scripts and our `_cpu` scripts: a row for each, CleanRL's
    sps read from its prints, ours from the SUMMARY, and the machine and the commit written."""
    argv = ["--cleanrl", CHECKOUT, "--quick", "--rounds", "1", "--variants", "cleanrl", "cpu"]
    cleanrl.main([*argv, "--out-dir", str(tmp_path)])
    result = json.loads(next(Path(tmp_path).glob("cleanrl-*.json")).read_text())
    table = {(r["algo"], r["variant"]): r for r in result["rows"]}
    expected = [(algo, v) for algo in cleanrl.ALGOS for v in ("cleanrl", "cpu")]
    assert set(table) == {(a.name, v) for a, v in expected if cleanrl.has_script(a, v)}
    assert all(r["sps"] > 0 and r["run_vs_cleanrl"] > 0 for r in table.values())
    assert result["settings"]["budgets"]["sac"] == cleanrl.ALGOS[0].quick
    assert result["machine"]["cores"] == os.cpu_count()


@pytest.mark.parametrize("native", [True, False])
def test_bf16_variants_run_for_sac_and_td3_only_where_the_cpu_computes_bfloat16(
    native, monkeypatch, capsys
):
    threads = cleanrl.load_script("threads")
    monkeypatch.setattr(threads, "bf16_native", lambda: native)
    algos = [algo for algo in cleanrl.ALGOS if algo.name in ("sac", "ppo")]
    variants = ["cleanrl", "cpu --bf16", "cpu --bf16 --threads 2"]
    planned = [(algo.name, variant) for algo, variant in cleanrl.plan(algos, variants)]
    bf16 = [("sac", "cpu --bf16"), ("sac", "cpu --bf16 --threads 2")] if native else []
    assert planned == [("sac", "cleanrl"), *bf16, ("ppo", "cleanrl")]
    skipped = capsys.readouterr().err.count("computes no bfloat16 natively")
    assert skipped == (0 if native else 2)


def test_budget_flags_change_every_algorithms_budget_and_bad_ones_exit_2(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "cleanrl").mkdir()  # a checkout's folder: measure, faked, reads no script
    seen = {}

    def measure(algos, variants, rounds, budgets, checkout, timeout):
        seen.update(budgets)
        run = dict(sps=100.0, sps_run=90.0, threads=None)
        return {algo.name: {variant: [run] for variant in variants} for algo in algos}

    monkeypatch.setattr(cleanrl, "measure", measure)
    argv = ["--cleanrl", str(tmp_path), "--algos", "sac", "ppo", "--variants", "cleanrl"]
    cleanrl.main([*argv, "--out-dir", str(tmp_path), "--budget", "env_id=Hopper-v5", "num_envs=4"])
    full = {algo.name: algo.full for algo in cleanrl.ALGOS}
    assert seen == {
        "sac": full["sac"] | dict(env_id="Hopper-v5", num_envs=4),
        "ppo": full["ppo"] | dict(env_id="Hopper-v5", num_envs=4),
    }
    with pytest.raises(SystemExit) as exit:
        cleanrl.main([*argv, "--budget", "env_id"])
    assert exit.value.code == 2 and "FLAG=VALUE" in capsys.readouterr().err
