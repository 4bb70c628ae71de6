"""`--bf16` on the CPU scripts: refused in one line on a CPU without native bfloat16; where it runs,
the compiled updates under bf16 autocast take the float32 updates' steps within bfloat16's
precision, keep the weights and Adam's moments in float32, and never recompile. And the study that
sets bf16's returns beside float32's (benchmarks.studies.bf16), tiny."""

import json

import numpy as np
import pytest
import torch
from conftest import load_script
from test_contract import CPU_SCRIPTS
from test_dqn import make_batch as dqn_batch
from test_ppo_continuous_action import make_minibatch
from test_pqn import make_minibatch as pqn_minibatch
from test_sac_continuous_action import make_batch as sac_batch
from test_td3_continuous_action import make_batch as td3_batch

from benchmarks.studies import bf16 as bf16_study

threads = load_script("threads")


@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_bf16_is_refused_on_a_cpu_without_it(script, train, capsys, monkeypatch):
    monkeypatch.setattr(threads, "bf16_native", lambda: False)
    assert train(script, "--bf16") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--bf16" in lines[0] and "AVX-512 BF16" in lines[0], lines


def learner_steps(script, bf16):
    """`script`'s learner from seed 0, its updates compiled as `main` compiles them: `step(k)` takes
    the k-th step on batches of seed k (its losses, stacked), and the learner's Adams."""
    module = load_script(script)
    args = module.Args(bf16=bf16)
    torch.manual_seed(0)
    if script == "dqn_cpu":
        learner = module.make_learner(args, 4, 2)
        update = torch.compile(learner.update, fullgraph=True, options={"cpp_wrapper": True})
        return lambda k: torch.stack(update(dqn_batch(seed=k))), [learner.optimizer]
    if script == "pqn_cpu":
        learner = module.make_learner(args, 4, 2)
        update = torch.compile(learner.update, fullgraph=True, options={"cpp_wrapper": True})
        return lambda k: torch.stack(update(dict(pqn_minibatch(k).items()))), [learner.optimizer]
    if script == "ppo_continuous_action_cpu":
        learner = module.make_learner(args, 3, 2, torch.device("cpu"))
        update = torch.compile(learner.update, fullgraph=True, options={"cpp_wrapper": True})
        return lambda k: update(make_minibatch(k)), [learner.optimizer]
    # SAC and TD3: a policy step (the critic, the actor, the targets), as `main` compiles it
    td3 = script == "td3_continuous_action_cpu"
    n_act, make_batch = (2, td3_batch) if td3 else (1, sac_batch)
    bounds = -2 * np.ones(n_act), 2 * np.ones(n_act)
    learner = module.make_learner(args, 3, n_act, *bounds, *[torch.device("cpu")] * td3)
    update = torch.compile(learner.update, fullgraph=True, options={"cpp_wrapper": True})
    policy_step = (True,) if td3 else (True, True)  # SAC's: and a target step
    adams = [learner.q_optimizer, learner.actor_optimizer]
    adams += [] if td3 else [learner.alpha_optimizer]
    return lambda k: torch.stack(list(update(make_batch(k), *policy_step).values())), adams


def state(adams, part="params"):
    """The Adams' parameters (or moments, `exp_avg`), flat, in one copy."""
    return torch.cat([t.detach().flatten() for adam in adams for t in getattr(adam, part).values()])


@pytest.mark.skipif(not threads.bf16_native(), reason="this CPU computes no bfloat16 natively")
@pytest.mark.slow  # compiles each script's update in both dtypes (8-29 s each here)
@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_a_bf16_update_takes_the_float32_steps_and_never_recompiles(script, monkeypatch):
    """Five steps from the same weights on the same batches, compiled, with and without `--bf16`
    (the noise drawn from torch's generator in both). bfloat16 keeps 8 significant bits: each
    matmul's inputs round by up to 2**-9 (0.2%) and sum in float32, so the losses agree to 2%
    (measured on an AMD EPYC with AVX-512 BF16: at most 0.8%), yet differ (autocast ran). Adam
    moves each weight by about lr times its gradient's sign, which bfloat16 flips only for a
    gradient within its rounding of zero: the five steps' moves point the same way, cosine above
    0.99 (measured: 0.997 and more); wrong gradients would point elsewhere. The weights and
    Adam's moments stay float32; after two warm-up steps nothing recompiles."""
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    losses, moves = [], []
    for bf16 in (False, True):
        step, adams = learner_steps(script, bf16)
        before, run_losses = state(adams), []
        for k in range(5):
            torch.manual_seed(100 + k)
            with torch.compiler.set_stance("fail_on_recompile" if k >= 2 else "default"):
                run_losses.append(step(k))
        losses.append(torch.stack(run_losses))
        moves.append(state(adams) - before)
    for part in ("params", "exp_avg", "exp_avg_sq"):
        assert {t.dtype for adam in adams for t in getattr(adam, part).values()} == {torch.float32}
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=1e-3)
    assert not torch.equal(losses[1], losses[0]), "bf16 changed nothing: autocast did not run"
    assert torch.nn.functional.cosine_similarity(*moves, dim=0) > 0.99


def test_mann_whitney_is_exact_and_counts_ties_at_mid_ranks(monkeypatch):
    """U and its exact two-sided p-value: scipy's where there are no ties; two against two with no
    overlap, 2 of the 6 splits as extreme; ties at mid-ranks; random splits beyond EXACT_SPLITS."""
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, 10), rng.normal(1, 1, 10)
    expected = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="exact")
    assert bf16_study.mann_whitney(a, b) == pytest.approx((expected.statistic, expected.pvalue))
    assert bf16_study.mann_whitney([1, 2], [3, 4]) == pytest.approx((0.0, 2 / 6))
    assert bf16_study.mann_whitney([1, 1], [1, 1]) == (2.0, 1.0)
    monkeypatch.setattr(bf16_study, "EXACT_SPLITS", 50_000)  # below C(20, 10)
    assert bf16_study.mann_whitney(a, b)[1] == pytest.approx(expected.pvalue, abs=0.01)


def test_bf16_study_rows_and_table():
    def runs(returns, sps):
        return [dict(seed=k, return_mean=r, sps=sps) for k, r in enumerate(returns, 1)]

    results = {"sac": {"fp32": runs([-150, -300, -500], 100), "bf16": runs([-160, -200], 250)}}
    (row,) = bf16_study.rows(results, {"sac": -400})
    assert (row["fp32"]["mean"], row["fp32"]["min"], row["bf16"]["max"]) == (-950 / 3, -500, -160)
    assert (row["fp32"]["above_bar"], row["bf16"]["above_bar"], row["speedup"]) == (2 / 3, 1, 2.5)
    assert (row["u"], row["p"]) == (4.0, pytest.approx(0.8))  # 8 of C(5, 2) = 10 splits as far
    machine = dict(cpu="a CPU", cores=2, gpu=None, versions={"torch": "2.13.0"})
    settings = dict(budget="quick", seeds=[1, 2, 3], threads=1, jobs=1)
    md = bf16_study.markdown(dict(machine=machine, settings=settings, rows=[row]))
    assert "| sac | -316.7 ± 143.4 (-500.0 to -150.0) | -180.0 ± 20.0 (-200.0 to -160.0) |" in md
    assert "| > -400: 67%, 100% | 4.0, 0.80 | 100 | 250 | 2.50x |" in md


def test_bf16_study_refuses_a_cpu_without_bf16(monkeypatch, capsys):
    monkeypatch.setattr(threads, "bf16_native", lambda: False)
    with pytest.raises(SystemExit) as stop:
        bf16_study.main(["--quick"])
    assert stop.value.code == 2 and "bfloat16" in capsys.readouterr().err


@pytest.mark.skipif(not threads.bf16_native(), reason="this CPU computes no bfloat16 natively")
@pytest.mark.slow  # trains each seed both ways (21 s here)
def test_bf16_study_runs_each_seed_both_ways(tmp_path):
    """Two seeds of SAC, tiny and eager: each seed float32 and bf16, a row with the test."""
    bf16_study.main(["--algos", "sac", "--seeds", "2", "--quick", "--out-dir", str(tmp_path)])
    result = json.loads(next(tmp_path.glob("bf16-*.json")).read_text())
    arms = result["results"]["sac"]
    assert [run["seed"] for run in arms["fp32"]] == [run["seed"] for run in arms["bf16"]] == [1, 2]
    (row,) = result["rows"]
    assert row["seeds"] == 2 and 0 < row["p"] <= 1 and row["speedup"] > 0
