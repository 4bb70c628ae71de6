"""`--bf16` on the CPU scripts: refused in one line on a CPU without native bfloat16; where it runs,
the compiled updates under bf16 autocast take the float32 updates' steps within bfloat16's
precision, keep the weights and Adam's moments in float32, and never recompile. (Its returns beside
float32's over 10 seeds: docs/notes/bf16.md.)"""

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

threads = load_script("threads")


@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_bf16_is_refused_on_a_cpu_without_it(script, train, capsys, monkeypatch):
    monkeypatch.setattr(threads, "bf16_native", lambda: False)
    assert train(script, "--bf16") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--bf16" in lines[0] and "AVX-512 BF16" in lines[0], lines


def main_compile(update):
    return torch.compile(update, fullgraph=True, options={"cpp_wrapper": True})


def learner_steps(script, bf16, compile=main_compile):
    """`script`'s learner from seed 0, its update compiled by `compile`, by default as `main`
    compiles it: `step(k)` takes the k-th step on batches of seed k (its losses, stacked), and the
    learner's Adams."""
    module = load_script(script)
    args = module.Args(bf16=bf16)
    torch.manual_seed(0)
    if script == "dqn_cpu":
        learner = module.make_learner(args, 4, 2)
        update = compile(learner.update)
        return lambda k: torch.stack(update(dqn_batch(seed=k))), [learner.optimizer]
    if script == "pqn_cpu":
        learner = module.make_learner(args, 4, 2)
        update = compile(learner.update)
        return lambda k: torch.stack(update(dict(pqn_minibatch(k).items()))), [learner.optimizer]
    if script == "ppo_continuous_action_cpu":
        learner = module.make_learner(args, 3, 2, torch.device("cpu"))
        update = compile(learner.update)
        return lambda k: update(make_minibatch(k)), [learner.optimizer]
    # SAC and TD3: a policy step (the critic, the actor, the targets), as `main` compiles it
    td3 = script == "td3_continuous_action_cpu"
    n_act, make_batch = (2, td3_batch) if td3 else (1, sac_batch)
    bounds = -2 * np.ones(n_act), 2 * np.ones(n_act)
    learner = module.make_learner(args, 3, n_act, *bounds, *[torch.device("cpu")] * td3)
    update = compile(learner.update)
    policy_step = (True,) if td3 else (True, True)  # SAC's: and a target step
    adams = [learner.q_optimizer, learner.actor_optimizer]
    adams += [] if td3 else [learner.alpha_optimizer]
    return lambda k: torch.stack(list(update(make_batch(k), *policy_step).values())), adams


def state(adams, part="params"):
    """The Adams' parameters (or moments, `exp_avg`), flat, in one copy."""
    return torch.cat([t.detach().flatten() for adam in adams for t in getattr(adam, part).values()])


@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_autocast_enters_the_update_graph_only_under_bf16(script):
    """Without `--bf16` the update's graph holds no autocast context: AOTAutograd's cache refuses a
    graph that enters one, and each warm start would trace the update again (2.5 s of pqn_cpu's)."""
    entered = {}
    for bf16 in (False, True):

        def record(graph, example_inputs, bf16=bf16):
            targets = {getattr(node.target, "__name__", "") for node in graph.graph.nodes}
            entered[bf16] = entered.get(bf16, False) or "_enter_autocast" in targets
            return graph.forward

        step, _ = learner_steps(script, bf16, lambda f: torch.compile(f, backend=record))
        step(0)
    assert entered == {False: False, True: True}


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
