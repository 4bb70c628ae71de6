"""The inference benchmark on a tiny budget: it runs and writes its outputs, its statistics are
right, and its checks catch a policy that keeps acting with stale weights."""

import dataclasses
import json

import pytest
import torch

from benchmarks.policies import SPECS
from benchmarks.scripts import SCRIPTS, load_script
from benchmarks.studies import inference

TINY = ["--rounds", "2", "--block-ms", "1"]


CPU = torch.device("cpu")


def built_policy(spec, device=CPU):
    """`spec`'s policy built from its twin, with the CPU script's numpy policy on a CPU; returns the
    twin's module, the CPU script's (or None) and the Built."""
    script = load_script(spec.script)
    cpu = inference.cpu_script(spec, SCRIPTS, device)
    return script, cpu, spec.build(script, device, cpu)


def stale_copy(spec, script, cpu, built):
    """The same policy built on a separate copy of `built`'s weights: equal now, stale after an
    update."""
    stale = spec.build(script, CPU, cpu)
    stale.source.load_state_dict(built.source.state_dict())
    return stale


def test_quick_run_writes_json_table_and_plot(tmp_path):
    argv = "--policies dqn --batch-sizes 1 8 --modes default --device cpu --backend aot_eager"
    argv = [*argv.split(), *TINY, "--out", str(tmp_path)]
    assert inference.main(argv) == 0
    paths = [sorted(tmp_path.glob(f"*.{ext}")) for ext in ("json", "md", "png")]
    (json_path,), (md_path,), (png_path,) = paths
    result = json.loads(json_path.read_text())
    rows = result["rows"]
    # numpy: the twin's CPU policy
    expected = [(b, v) for b in (1, 8) for v in ("eager", "compile:default", "numpy")]
    assert [(r["batch"], r["variant"]) for r in rows] == expected
    for r in rows:
        assert r["check_equal"]["ok"] and r["check_after_update"]["ok"]
        assert r["check_after_update"]["changed"]
        assert r["calls"] >= 6 and r["p10_us"] <= r["median_us"] <= r["p90_us"]
        assert r["samples_per_s"] == pytest.approx(r["calls_per_s"] * r["batch"])
        assert r["threads"] == 1  # the DQN twin's single intra-op thread on a CPU
    assert [r["speedup_pct"] for r in rows if r["variant"] == "eager"] == [0.0, 0.0]
    assert rows[1]["setup_s"] > 0 and result["settings"]["modes"] == ["default"]
    reasons = {s["reason"] for s in result["skipped"]}
    assert reasons == {"cudagraphs needs a CUDA device", "compile+cudagraphs needs a CUDA device"}
    table = md_path.read_text()
    assert "| policy | batch | variant | median µs |" in table
    assert "| dqn | 8 | compile:default |" in table
    eager_8, compiled_8, numpy_8 = rows[3:]
    median, p10, p90 = (eager_8[k] for k in ("median_us", "p10_us", "p90_us"))
    summary_line = f"| dqn | 8 | {median:.0f} ({p10:.0f}-{p90:.0f}) | "
    summary_line += f"{compiled_8['speedup_pct']:+.0f}% | {numpy_8['speedup_pct']:+.0f}% |"
    assert summary_line in table.splitlines()
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", list(SPECS))
def test_compiled_policy_follows_weights_and_stale_copy_fails(name):
    spec = SPECS[name]
    script, cpu, built = built_policy(spec)
    assert (cpu is None) == (spec.cpu_script is None)
    stale = stale_copy(spec, script, cpu, built)
    variants = [
        inference.Variant("eager", built.act, 1),
        inference.Variant("compiled", torch.compile(built.act, backend="aot_eager"), 2),
        inference.Variant("stale", stale.act, 1),
        inference.Variant("stale compiled", torch.compile(stale.act, backend="aot_eager"), 2),
    ]
    if built.host is not None:  # the CPU script's numpy policy, on views of the same weights
        variants += [inference.Variant("numpy", inference.numpy_policy(built.host), 1)]
        variants += [inference.Variant("stale numpy", inference.numpy_policy(stale.host), 1)]
    obs = spec.observe(2, torch.device("cpu"), torch.Generator().manual_seed(0))
    with torch.no_grad():
        for variant in variants:
            inference.warm_up(variant, obs, cuda=False)
        before = inference.check_equal(spec, variants, obs, rtol=1e-3, atol=1e-4)
        after = inference.check_after_update(
            spec, built.source, variants, obs, before, rtol=1e-3, atol=1e-4
        )
    # equal weights: every variant agrees with eager
    assert all(check["ok"] for check in before.values())
    assert after["eager"]["changed"] and after["compiled"]["ok"]
    if name == "ppo_atari":
        assert built.host is None  # no CPU script: the CNN acts with torch on every device
    else:
        assert after["numpy"]["ok"] and after["numpy"]["changed"]
    for stale_name in [v.name for v in variants if v.name.startswith("stale")]:
        assert not after[stale_name]["ok"], (
            f"{name}: a policy acting on a copy of the weights passed the check"
        )
        assert not after[stale_name]["changed"]


def test_benchmark_exits_1_and_marks_stale_when_the_update_does_not_reach_the_policy(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(
        SPECS, "dqn", dataclasses.replace(SPECS["dqn"], perturb=lambda source: None)
    )
    argv = [*"--policies dqn --batch-sizes 2 --modes default --backend aot_eager".split(), *TINY]
    assert inference.main([*argv, "--out", str(tmp_path)]) == 1
    rows = json.loads(next(tmp_path.glob("*.json")).read_text())["rows"]
    assert [r["check_after_update"]["changed"] for r in rows] == [False, False, False]
    assert "| STALE |" in next(tmp_path.glob("*.md")).read_text()


def test_difference_uses_the_stated_tolerances():
    ref = {"value": torch.tensor([1.0, -2.0]), "action": torch.arange(200)}
    close = {
        "value": ref["value"] + torch.tensor([1e-4 + 0.9e-3, 0.0]),
        "action": ref["action"].clone(),
    }
    assert inference.difference(close, ref, rtol=1e-3, atol=1e-4) == (
        True,
        pytest.approx(1e-3, rel=1e-3),
    )
    far = {"value": ref["value"] + 3e-3, "action": ref["action"].clone()}
    assert not inference.difference(far, ref, rtol=1e-3, atol=1e-4)[0]
    flipped = {"value": ref["value"], "action": ref["action"].clone()}
    # 1% of the integer actions may differ (argmax near-ties), 1.5% may not
    flipped["action"][:2] += 1
    assert inference.difference(flipped, ref, rtol=1e-3, atol=1e-4) == (True, 0.01)
    flipped["action"][2] += 1
    assert inference.difference(flipped, ref, rtol=1e-3, atol=1e-4) == (False, 0.015)


def test_latency_statistics_and_speedup():
    stats = inference.latency_stats([i * 1e-6 for i in range(1, 12)], batch=8)  # 1..11 µs
    assert stats["median_us"] == pytest.approx(6.0) and stats["p10_us"] == pytest.approx(2.0)
    assert stats["p90_us"] == pytest.approx(10.0) and stats["calls"] == 11
    assert stats["calls_per_s"] == pytest.approx(11 / 66e-6) and stats[
        "samples_per_s"
    ] == pytest.approx(8 * 11 / 66e-6)
    assert inference.speedup_pct(100.0, 50.0) == pytest.approx(100.0)
    assert inference.speedup_pct(100.0, 200.0) == pytest.approx(-50.0)
    assert inference.calls_per_block(1e-3, 0.04) == 40 and inference.calls_per_block(1.0, 0.04) == 2


def test_rounds_alternate_and_rotate():
    order = []
    variants = [
        inference.Variant(name, lambda obs, name=name: order.append(name), 1) for name in "abc"
    ]
    latencies = inference.timed_rounds(variants, None, rounds=3, calls=2, cuda=False, offset=1)
    assert order == list("bbccaaccaabbaabbcc")
    assert {name: len(times) for name, times in latencies.items()} == {"a": 6, "b": 6, "c": 6}


def test_missing_script_is_skipped_with_a_note(tmp_path):
    (tmp_path / "dqn_torchcompile.py").write_text("")
    ready, skipped = inference.available(["dqn", "sac"], tmp_path)
    assert [spec.name for spec in ready] == ["dqn"]
    assert skipped == [
        {
            "policy": "sac",
            "reason": f"{tmp_path / 'sac_continuous_action_torchcompile.py'} does not exist",
        }
    ]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--batch-sizes", "0"], "--batch-sizes"),
        (["--policies", "ppo"], "--policies"),
        (["--rounds", "1"], "--rounds"),
        (["--modes", "fast"], "--modes"),
        (["--block-ms", "-1"], "--block-ms"),
        (["--backend", "aot_eager", "--modes", "reduce-overhead"], "--modes"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        inference.parse_args(argv)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err.splitlines()[-1]
