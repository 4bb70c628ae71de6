"""`python -m benchmarks.gpu_check` on a CPU: what it plans, the CUDA tests it runs, the env-only
checks it measures, its parts' time shares and deadlines, the report it writes from synthetic
results, and its refusal without a CUDA device. Its GPU parts run on a GPU only; the noise
statistics it relies on are tested on compiled CPU functions in test_fresh_noise.py."""

import itertools
import json
import subprocess
import sys

import pytest
from conftest import ROOT, assert_user_error, script_env
from test_fresh_noise import SAMPLING

from benchmarks import gpu_check, registry
from benchmarks.gpu_check import ENV_ONLY, PARTS, SEEDS_MEMBERS, TIMED
from benchmarks.studies import seeds

# the scripts that need envpool: installed here, as docs/cuda.md has a GPU machine install it
ENVPOOL_SCRIPTS = ("ppo_atari_envpool_torchcompile", "ppo_atari_envpool_async")
ENVPOOL_SEEDS = "ppo_continuous_action_seeds"


def test_without_cuda_it_exits_2_in_one_line():
    cmd = [sys.executable, "-m", "benchmarks.gpu_check"]
    options = dict(capture_output=True, text=True, cwd=ROOT, env=script_env(), timeout=120)
    proc = subprocess.run(cmd, **options)
    assert "CUDA" in assert_user_error(proc)


def by_part(checks):
    return {part: [c for c in checks if c.part == part] for part in PARTS}


def test_the_plan_covers_every_graphed_script_and_every_part():
    """Every script whose sampling functions test_fresh_noise.py checks has a fresh-noise test run
    and a smoke run, the envpool scripts named; every algorithm three timed runs, every seeds
    script one at each N, each row after an env-only check of its own env; one learning run each.
    The timed seeds runs are the smoke runs' commands, so they find their kernels compiled."""
    parts = by_part(gpu_check.plan(PARTS))
    names = {part: [c.name for c in checks] for part, checks in parts.items()}
    assert set(gpu_check.graphed_runs()) == set(SAMPLING)
    assert {f"fresh noise: {stem}" for stem in SAMPLING} <= set(names["tests"])
    assert {name.split(" N=")[0] for name in names["smoke"]} == set(SAMPLING)
    assert {"test_ppo_atari_envpool.py", "test_ppo_atari_envpool_async.py"} <= set(names["tests"])
    assert set(ENVPOOL_SCRIPTS) <= set(names["smoke"])
    assert {f"{ENVPOOL_SEEDS} N={n}" for n in SEEDS_MEMBERS} <= set(names["smoke"])
    algos = [a.name for a in registry.ALGOS]
    assert {"ppo_lstm", "ppo_mingru", "ppo_atari_envpool"} <= set(algos)
    sps = [(c.algo, c.variant) for c in parts["sps"]]
    assert sps == list(itertools.product(algos, (ENV_ONLY, *TIMED)))
    timed = [(c.algo, c.members, c.variant) for c in parts["seeds"]]
    product = itertools.product([a.name for a in seeds.ALGOS], SEEDS_MEMBERS)
    assert timed == [(a, n, v) for a, n in product for v in (ENV_ONLY, TIMED[-1])]
    assert "ppo_continuous_action" in {a for a, _, _ in timed}
    assert len(names["learning"]) == len(gpu_check.LEARNING)
    for check in parts["smoke"] + parts["learning"] + parts["seeds"]:
        if check.variant != ENV_ONLY:
            assert "--cudagraphs" in check.cmd and "--compile" in check.cmd, check.cmd
    seeds_runs = [c.cmd for c in parts["seeds"] if c.variant != ENV_ONLY]
    assert seeds_runs == [c.cmd for c in parts["smoke"] if c.members]


def test_each_env_only_check_times_its_rows_env_under_the_rows_budget():
    """An env-only check comes first in its row and steps the env of the script that follows it
    (the eager script, or the seeds script at the same N) under the same budget flags."""
    checks = gpu_check.plan(["sps", "seeds"])
    rows = [(c.part, c.algo, c.members) for c in checks]
    assert [c.variant == ENV_ONLY for c in checks] == [
        i == rows.index(r) for i, r in enumerate(rows)
    ]
    for env, run in zip(checks, checks[1:]):
        if env.variant == ENV_ONLY:
            assert env.cmd[1:5] == ["-m", "benchmarks.env_limit", "--seconds", "2.0"]
            assert env.cmd[5] == run.cmd[1] and run.variant in ("eager", "compile+cudagraphs")
            assert env.cmd[6:] == [f for f in run.cmd[2:] if f not in ("--compile", "--cudagraphs")]


def test_the_algos_option_keeps_those_algorithms_checks_only():
    checks = gpu_check.plan(PARTS, ["ppo_lstm", "ppo_continuous_action"])
    assert {c.algo for c in checks} == {"ppo_lstm", "ppo_continuous_action"}
    names = {c.name for c in checks}
    assert {"test_ppo_lstm.py", "fresh noise: ppo_continuous_action_seeds"} <= names
    assert {"ppo_lstm compile+cudagraphs", "ppo_continuous_action N=64"} <= names
    assert "test_contract.py" not in names and "ppo_mingru eager" not in names
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--algos", "ppo_lsmt"])


def test_the_two_calls_of_a_lease_cover_every_part_of_every_algorithm_once():
    """`--call 1` and `--call 2` split the parts between them, each within 8.5 minutes, and
    together plan every check of the whole run."""
    first, second = (gpu_check.parse_args(["--call", str(call)]) for call in (1, 2))
    assert set(first.only).isdisjoint(second.only) and {*first.only, *second.only} == set(PARTS)
    assert first.minutes == second.minutes == 8.5 and first.algos is None
    planned = gpu_check.plan(first.only) + gpu_check.plan(second.only)
    assert sorted(c.name for c in planned) == sorted(c.name for c in gpu_check.plan(PARTS))


def selects(cmd, node_id):
    """Whether pytest `cmd` (a file, then `-k` terms joined by `and`) selects test `node_id`."""
    path = next(arg for arg in cmd if arg.endswith(".py"))
    terms = cmd[cmd.index("-k") + 1].split(" and ") if "-k" in cmd else []
    file, _, test = node_id.partition("::")
    return ROOT / file == ROOT / path and all(term in test for term in terms)


def test_the_tests_part_runs_every_cuda_test_and_each_of_its_checks_selects_some():
    """A renamed test would leave the GPU a check that selects nothing (pytest's exit 5), a new
    CUDA test one that no check runs: both fail here."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda"]
    cmd += ["-p", "no:cacheprovider", "tests"]
    options = dict(capture_output=True, text=True, cwd=ROOT, env=script_env(), timeout=600)
    proc = subprocess.run(cmd, **options)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    run = set()
    for check in gpu_check.plan(["tests"]):
        selected = {node for node in ids if selects(check.cmd, node)}
        assert selected, f"{check.name} selects no CUDA test"
        run |= selected
    assert run == set(ids)


@pytest.mark.parametrize(
    "name, envs",
    [
        ("ppo_atari_envpool env only", "8 x Breakout-v5"),
        ("ppo_continuous_action N=8 env only", "8 x HalfCheetah-v4"),
        ("dqn N=8 env only", "8 x CartPole-v1"),
    ],
)
def test_an_env_only_check_measures_its_env_on_this_cpu(name, envs, tmp_path):
    """The envpool Atari row's and two seeds rows' (every member's envs) env-only checks, run as
    the GPU check runs them."""
    (check,) = [c for c in gpu_check.plan(["sps", "seeds"]) if c.name == name]
    gpu_check.execute(check, float("inf"), tmp_path, {"OMP_NUM_THREADS": "1"})
    assert (check.status, check.detail) == ("passed", envs), check.detail
    assert check.value > 0


def test_each_part_ends_by_its_share_and_the_next_keeps_its_own():
    """The parallel parts end together, each later part a share later, the last at `minutes`; a
    part left out gives its share to the others."""
    every = gpu_check.deadlines(PARTS, 10)
    assert every["tests"] == every["smoke"] == every["learning"] < every["sps"] < every["seeds"]
    total = sum(gpu_check.SHARES.values())
    assert every["sps"] - every["tests"] == pytest.approx(600 * gpu_check.SHARES["sps"] / total)
    assert every["seeds"] == pytest.approx(600)
    timed = gpu_check.deadlines(["sps", "seeds"], 10)
    share = gpu_check.SHARES["sps"] / (gpu_check.SHARES["sps"] + gpu_check.SHARES["seeds"])
    assert (timed["sps"], timed["seeds"]) == (pytest.approx(600 * share), pytest.approx(600))
    assert gpu_check.deadlines(["seeds"], 10) == {"seeds": pytest.approx(600)}


@pytest.mark.slow  # waits for a part to pass its share (12 s here)
def test_a_part_past_its_share_is_stopped_and_the_next_part_still_runs(tmp_path, monkeypatch):
    """A timed check that would overrun its part is stopped at the part's end, the part's next
    check is not run, and the part after it runs in its own share; a check cut by its own cap
    fails."""
    monkeypatch.setattr(gpu_check, "MIN_START_S", 1)
    python = [sys.executable, "-c"]
    line = 'print(\'ENV_ONLY {"sps": 5.0, "num_envs": 1, "env_id": "x"}\')'
    checks = [
        gpu_check.Check("tests", "quick", [*python, "pass"], 60),
        gpu_check.Check("sps", "long", [*python, "import time; time.sleep(60)"], 60),
        gpu_check.Check("sps", "next", [*python, "pass"], 60),
        gpu_check.Check("seeds", "env", [*python, line], 60, "dqn", ENV_ONLY, 1),
    ]
    gpu_check.run_checks(checks, 0.25, 1, tmp_path)  # 15 s: sps ends at 10.7 s
    assert [c.status for c in checks] == ["passed", "stopped", "not run", "passed"]
    assert "share" in checks[1].detail and "share" in checks[2].detail
    capped = gpu_check.Check("sps", "x", [*python, "import time; time.sleep(60)"], 1)
    assert gpu_check.execute(capped, float("inf"), tmp_path).status == "failed"


def planned(name):
    (check,) = [c for c in gpu_check.plan(PARTS) if c.name == name]
    return check


@pytest.mark.parametrize(
    "name, device, graphed, value, status",
    [
        ("sac > -400", "cuda", True, -150.0, "passed"),
        ("sac > -400", "cuda", True, -500.0, "failed"),
        ("sac > -400", "cpu", True, -150.0, "failed"),
        ("sac compile+cudagraphs", "cuda:0", True, 800.0, "passed"),
        ("sac compile+cudagraphs", "cuda:0", False, 800.0, "failed"),
        ("sac eager", "cuda:0", False, 100.0, "passed"),
        ("dqn N=64", "cuda", True, 50000.0, "passed"),
        ("dqn N=64", "cpu", True, 50000.0, "failed"),
    ],
)
def test_a_run_passes_on_cuda_under_its_flags_and_above_its_bar(
    name, device, graphed, value, status, tmp_path
):
    """The judgement of a finished run from its summary: on CUDA, `cudagraphs` as its flags ask, and
    a learning run's return above its test's bar; its value is the return or the sps."""
    check = planned(name)
    learning = check.part == "learning"
    summary = {"device": device, "cudagraphs": graphed, "curve": []}
    summary |= (
        {"return_mean": value, "sps": 1.0} if learning else {"return_mean": 0.0, "sps": value}
    )
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    stdout = "SUMMARY " + json.dumps({"summary_file": str(path)})
    gpu_check.judge(check, subprocess.CompletedProcess(check.cmd, 0, stdout, ""))
    assert (check.status, check.value) == (status, value)


def test_an_env_only_check_reads_its_line_and_a_failed_one_keeps_its_error():
    check = planned("ppo_lstm env only")
    line = {"sps": 5000.0, "num_envs": 8, "env_id": "CartPole-v1", "env_steps": 1, "seconds": 1}
    proc = subprocess.CompletedProcess(check.cmd, 0, "ENV_ONLY " + json.dumps(line), "")
    gpu_check.judge(check, proc)
    assert (check.status, check.value, check.detail) == ("passed", 5000.0, "8 x CartPole-v1")
    check = planned("ppo_atari_envpool env only")
    error = "ModuleNotFoundError: No module named 'envpool'"
    gpu_check.judge(check, subprocess.CompletedProcess(check.cmd, 1, "", error))
    assert (check.status, check.value) == ("failed", None) and error in check.detail


def synthetic_checks():
    """A passed, a failed, a stopped and a not-run check of each kind, with the values a GPU would
    fill in (the Atari figures of docs/cuda.md's H200 run)."""
    checks = {(c.part, c.name): c for c in gpu_check.plan(PARTS)}
    values = {("sps", f"sac {v}"): sps for v, sps in zip((ENV_ONLY, *TIMED), (1e4, 1e3, 2e3, 5e3))}
    values |= {
        ("sps", "ppo_atari_envpool env only"): 4467.0,
        ("sps", "ppo_atari_envpool eager"): 1952.0,
    }
    values |= {("seeds", "dqn N=1 env only"): 3000.0, ("seeds", "dqn N=1"): 300.0}
    values |= {("seeds", "dqn N=64"): 9000.0, ("learning", "sac > -400"): -150.0}
    for key, value in values.items():
        checks[key].status, checks[key].value, checks[key].seconds = "passed", value, 12.3
    failed = checks[("tests", "fresh noise: sac_continuous_action_torchcompile")]
    failed.status, failed.detail = "failed", "1 failed | 3 passed"
    checks[("sps", "dqn eager")].status = "stopped"
    return list(checks.values())


def test_the_report_from_synthetic_results(tmp_path):
    checks = synthetic_checks()
    machine = {"cpu": "a CPU", "cores": 16, "gpu": "NVIDIA H100", "versions": {"torch": "2.13.0"}}
    settings = {"minutes": 8.0, "jobs": 8, "parts": list(PARTS), "algos": None}
    result = gpu_check.report(checks, machine, "2026-01-01T00:00:00", 123.0, settings)
    folder = gpu_check.write(result, tmp_path / "gpu_check-x")
    document = json.loads((folder / "gpu_check.json").read_text())
    assert document["passed"] == 10 and len(document["checks"]) == len(checks)
    speed = {r["algo"]: r for r in document["speed"]}
    assert list(speed) == [a.name for a in registry.ALGOS]  # a row for each, run or not
    sac, atari, dqn = speed["sac"], speed["ppo_atari_envpool"], speed["dqn"]
    ratios = ("env_only_sps", "compile_vs_eager", "graphs_vs_eager", "graphs_vs_env_only")
    assert [sac[key] for key in ratios] == [10000.0, 2.0, 5.0, 0.5]
    assert sac["leanrl_h100"] == 5.7
    assert (atari["env_only_sps"], atari["sps"]["eager"], atari["sps"]["compile"]) == (
        4467,
        1952,
        None,
    )
    assert atari["status"]["compile"] == "not run" and dqn["status"]["eager"] == "stopped"
    seeds_rows = {(r["algo"], r["members"]): r for r in document["seeds"]}
    assert len(seeds_rows) == len(seeds.ALGOS) * len(SEEDS_MEMBERS)
    dqn_1 = seeds_rows[("dqn", 1)]
    assert (dqn_1["env_only_sps"], dqn_1["vs_env_only"]) == (3000.0, 0.1)
    assert seeds_rows[("dqn", 64)]["status"] == {ENV_ONLY: "not run", TIMED[-1]: "passed"}
    parts = {r["part"]: r for r in document["parts"]}
    assert (parts["sps"]["share"], parts["sps"]["ends_s"]) == (0.25, pytest.approx(384))
    sps_checks = sum(c.part == "sps" for c in checks)  # the rest of every algorithm's are not run
    counts = (parts["sps"]["passed"], parts["sps"]["stopped"], parts["sps"]["not run"])
    assert counts == (6, 1, sps_checks - 7)
    assert sum(r["checks"] for r in document["parts"]) == len(checks)
    md = (folder / "gpu_check.md").read_text()
    assert "GPU: NVIDIA H100" in md and "10 of" in md
    assert (
        "`--minutes 8 --jobs 8`; parts: tests, smoke, learning, sps, seeds; algorithms: all." in md
    )
    assert f"| sps | 25% | 384 | {sps_checks} | 6 | 0 | 1 | {sps_checks - 7} |" in md
    assert f"sps {sps_checks - 6} of {sps_checks}, seeds 21 of 24 checks." in md
    assert "| sac | 10000 | 1000 | 2000 | 5000 | 2.00x | 5.00x | 0.50x | 5.7x |" in md
    atari_row = "| ppo_atari_envpool | 4467 | 1952 | not run | not run | n/a | n/a | n/a | 6.8x |"
    assert atari_row in md
    assert "| dqn | not run | stopped | not run | not run |" in md
    assert "| dqn | 1 | 300 | 3000 | 0.10x |" in md and "| dqn | 64 | 9000 | not run | n/a |" in md
    failed = "| tests | fresh noise: sac_continuous_action_torchcompile | failed | 0 | 1 failed / 3"
    assert failed in md
    assert "| learning | td3 > -700 | not run |" in md
    assert all(len(line) <= 200 for line in md.splitlines())
