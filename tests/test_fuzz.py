"""Property-based flag tests: every script of leanrl/ (found on disk) runs with flag combinations
hypothesis draws from each `Args` field's valid range and just outside it (0, negatives, nan, a
batch larger than the buffer, fractions out of range), on env ids per algorithm that truncate,
terminate, are Discrete, use `module:EnvId` or do not exist. The contract's property: a combination
trains (exit 0, one SUMMARY line, every number finite), is refused (exit 2, one line on stderr
naming a flag, no traceback) or diverges (exit 3, stderr says so, the SUMMARY says so, no model
file); a Ray run may also meet its --ray-timeout on a busy machine (exit 1, one line naming it).

Kept to about 3 minutes: runs are in process where the script allows (the Ray script and torchrun's
2 ranks run as subprocesses, SUBPROCESS_EXAMPLES each), FUZZ_EXAMPLES derandomized combinations per
script after every failure the fuzz has found (FOUND), expensive flags drawn rarely (`--compile` 1
in COMPILE_ONE_IN). Run it longer, with new draws: `LEANRL_FUZZ_EXAMPLES=200 python -m pytest
tests/test_fuzz.py -s` (each test prints its exit-status counts)."""

import collections
import contextlib
import io
import math
import os
import re
import signal
import subprocess
import tempfile
import warnings

import pytest
import torch
import tyro
from conftest import ALL_SCRIPTS, assert_user_error, load_script, run_script, summary
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_ppo_continuous_action_distributed import distributed_env, standalone, torchrun_command

# every script runs many drawn flag sets (3.5 min here); each family's bad-input tests stay quick
pytestmark = pytest.mark.slow

LONG_RUN = "LEANRL_FUZZ_EXAMPLES" in os.environ
FUZZ_EXAMPLES = int(os.environ.get("LEANRL_FUZZ_EXAMPLES", 8))
SUBPROCESS_EXAMPLES = max(1, FUZZ_EXAMPLES // 10)
RAY, DISTRIBUTED = "ppo_continuous_action_ray", "ppo_continuous_action_distributed"
IN_PROCESS = [name for name in ALL_SCRIPTS if name != RAY]
# a cold compile costs more than the fuzz of a whole script: the suite draws `--compile` rarely
COMPILE_ONE_IN = 4 if os.environ.get("LEANRL_FUZZ_COMPILE") else 24
# learning rates that blow the weights up within a few updates
DIVERGING_RATES = [1e6, 1e12, 1e30]


def rarely(common, rare, one_in=16):
    """`rare` in about 1 draw of `one_in`, else `common` (shrinking goes to `common`)."""
    return st.integers(1, one_in).flatmap(lambda i: rare if i == one_in else common)


def floats(low, high, **kwargs):
    return st.floats(low, high, allow_nan=False, allow_infinity=False, **kwargs)


def mostly(good, bad):
    """One of `good` in 3 draws of 4, else one of `bad`."""
    return st.sampled_from([good, good, good, bad]).flatmap(st.sampled_from)


# env ids per algorithm (a script's name starts with it): ids it trains on, ids it must refuse, and
# rarely an expensive one Pendulum's episodes are cut at 200 steps (truncation), InvertedPendulum's
# end within ~10 random steps (termination)
BOX = ["Pendulum-v1", "gymnasium.envs.classic_control:Pendulum-v1", "InvertedPendulum-v4"]
DISCRETE = ["CartPole-v1", "gymnasium.envs.classic_control:CartPole-v1", "Acrobot-v1"]
UNKNOWN = ["NoSuchEnv-v0", "no_such_module:CartPole-v1"]
GAMES = ["Pong-v5", "Breakout-v5"]
CONTINUOUS = rarely(mostly(BOX, DISCRETE[:2] + UNKNOWN), st.just("HalfCheetah-v4"))
RECURRENT = rarely(mostly(DISCRETE, BOX[:1] + UNKNOWN), st.just("popgym:popgym-RepeatFirstEasy-v0"))
ENV_IDS = {
    "sac": CONTINUOUS,
    "td3": CONTINUOUS,
    "ppo_continuous": CONTINUOUS,
    "dqn": rarely(mostly(DISCRETE, BOX[:1] + UNKNOWN), st.just("HalfCheetah-v4")),
    "ppo_lstm": RECURRENT,
    "ppo_mingru": RECURRENT,
    # envpool's ids: two games; a game that does not exist, and an envpool env that is not Atari
    "ppo_atari": mostly(GAMES, ["NoSuchGame-v5", "CartPole-v1"]),
    # before "pqn": a script's ids are those of the first name it starts with
    "pqn_atari": mostly(GAMES, ["NoSuchGame-v5", "CartPole-v1"]),
    "pqn": mostly(DISCRETE, BOX[:1] + UNKNOWN),
}


def positive(high):
    """(valid, invalid) of a size: 1 to `high`; 0 or negative."""
    return st.integers(1, high), st.integers(-2, 0)


def fraction(closed_low=True):
    """(valid, invalid) of a number in [0, 1] (or (0, 1]): just outside, or nan."""
    valid = floats(0, 1, exclude_min=not closed_low)
    return valid, st.sampled_from([-0.01, 1.01, math.nan] + ([] if closed_low else [0.0]))


def positive_float(low, high):
    """(valid, invalid) of a positive float drawn in [low, high]; 0, negative, nan, inf or past
    float32's range."""
    return floats(low, high), st.sampled_from([0.0, -low, math.nan, math.inf, 1e38])


def learning_rate():
    """(valid, invalid) of a learning rate: mostly in [1e-5, 1e-2], rarely one so large that
    training diverges (a valid flag: the run must stop with exit status 3, or end with finite
    numbers)."""
    valid, invalid = positive_float(1e-5, 1e-2)
    return rarely(valid, st.sampled_from(DIVERGING_RATES), 8), invalid


def non_negative_float(high):
    return floats(0, high), st.sampled_from([-0.1, math.nan])


def rollout(values):
    """The env steps of one on-policy iteration."""
    return values["num_steps"] * values["num_envs"] * values.get("num_runners", 1)


def on_policy_budget(values):
    """Valid `--total-timesteps` of an on-policy script: 1 to 3 rollouts, or rarely enough rollouts
    for every env to pass 200 steps, where Pendulum truncates its episodes (and envpool's envs
    take a reset step); 600 for an Atari game, where a random player's Breakout ends."""
    steps = 600 if values["env_id"] in GAMES else 200
    long = -(-steps // values["num_steps"]) + 1
    rollouts = rarely(st.integers(1, 3), st.integers(long, long + 1), 6)
    return rollouts.map(lambda n: n * rollout(values))


def minibatches(values):
    """Valid `--num-minibatches`: a divisor of the rollout's steps into minibatches of 2 or more, at
    most 8."""
    steps = values["num_steps"] * values["num_envs"]
    return st.sampled_from([d for d in range(1, 9) if steps % d == 0 and steps // d >= 2])


def off_policy_budget(values):
    """Valid `--total-timesteps` of an off-policy script: from a few steps before
    `--learning-starts` to 150 after."""
    return st.integers(-10, 150).map(lambda steps: max(1, values["learning_starts"] + steps))


# Each field's (valid, invalid) strategies, by name, in the order they are drawn (a strategy may be
# a function of the values drawn before it). A field not named here keeps its default, unless it is
# a bool or a small int (GENERIC).
FIELDS = {
    "seed": (st.integers(0, 2**31 - 1), st.sampled_from([-1, 2**31])),
    "torch_deterministic": (st.booleans(), None),
    "cuda": (st.booleans(), None),
    "cudagraphs": (rarely(st.just(False), st.just(True), 4), None),  # exit 2 without CUDA
    "compile": (rarely(st.just(False), st.just(True), COMPILE_ONE_IN), None),
    "track": (rarely(st.just(False), st.just(True)), None),
    "capture_video": (rarely(st.just(False), st.just(True)), None),
    "save_model": (st.booleans(), None),
    "eval_episodes": (st.integers(0, 2), st.just(-1)),
    "eval_model": (rarely(st.none(), st.sampled_from(["missing.pt", "not_a_model.pt"])), None),
    "measure_burnin": (st.integers(0, 4), st.just(-1)),
    # a checkpoint now and then, or on nearly every step; resuming what is not there, or a name
    # that is not one folder
    "checkpoint_minutes": (st.sampled_from([10.0, 0.0, 1e-4]), st.just(-1.0)),
    "resume": (rarely(st.none(), st.sampled_from(["auto", "missing.pt", "not_a_model.pt"])), None),
    "run_name": (rarely(st.none(), st.just("fuzz")), st.sampled_from(["", "..", "a/b"])),
    "num_envs": positive(3),
    "num_runners": (st.integers(1, 2), st.just(3)),  # 3: more than this machine's 2 CPUs
    "num_steps": (st.integers(2, 24), st.integers(-1, 0)),
    # num_steps + 1: mostly no divisor of the rollout
    "num_minibatches": (
        minibatches,
        lambda values: st.sampled_from([0, -1, values["num_steps"] + 1]),
    ),
    "update_epochs": positive(2),
    "learning_starts": (st.sampled_from([0, 1, 32, 100, 200]), st.just(-1)),
    "total_timesteps": (
        lambda values: (
            on_policy_budget(values) if "num_steps" in values else off_policy_budget(values)
        ),
        lambda values: (
            st.integers(-1, max(-1, rollout(values) - 1))
            if "num_steps" in values
            else st.integers(-1, 0)
        ),
    ),
    "batch_size": positive(64),
    # now and then smaller than the batch
    "buffer_size": (
        lambda values: st.integers(max(1, values["batch_size"] - 8), 1000),
        st.integers(-1, 0),
    ),
    "learning_rate": learning_rate(),
    "policy_lr": learning_rate(),
    "q_lr": learning_rate(),
    "gamma": fraction(),
    "gae_lambda": fraction(),
    "q_lambda": fraction(),
    "tau": fraction(closed_low=False),
    "exploration_fraction": fraction(closed_low=False),
    "start_e": fraction(),
    "end_e": fraction(),
    "train_frequency": positive(10),
    "target_network_frequency": positive(5),
    "policy_frequency": positive(7),
    "alpha": positive_float(1e-3, 1.0),
    "autotune": (st.booleans(), None),
    "policy_noise": non_negative_float(1.0),
    "exploration_noise": non_negative_float(1.0),
    "noise_clip": non_negative_float(1.0),
    "anneal_lr": (st.booleans(), None),
    "norm_adv": (st.booleans(), None),
    "clip_vloss": (st.booleans(), None),
    "clip_coef": positive_float(0.01, 1.0),
    "ent_coef": (floats(0, 0.1), None),
    "vf_coef": (floats(0, 1), None),
    "max_grad_norm": positive_float(0.01, 10.0),
    "reward_scale": positive_float(1e-3, 10.0),
    "target_kl": (st.none() | floats(1e-3, 0.1), st.sampled_from([0.0, -0.01, math.nan])),
    "obs_indices": (
        st.sampled_from([None, (), (0, 2), (1,), (-1, 0)]),
        st.sampled_from([(0, 9), (-9,)]),
    ),
    "memory": (st.booleans(), None),
    "async_batch_size": (
        lambda values: st.none() | st.sampled_from(divisors(values["num_envs"])),
        st.just(0),
    ),
    "env_threads": (st.none() | st.integers(1, 2), st.just(0)),
    "threads": (st.sampled_from([None, 1, 2]), st.integers(-1, 0)),
    "double_buffer": (st.booleans(), None),
    "ray_timeout": (floats(30, 120), st.sampled_from([0.0, -1.0])),
    "runner_restarts": (st.integers(0, 3), st.just(-1)),
    "ray_address": (rarely(st.none(), st.sampled_from(["nohost", "127.0.0.1:1"])), None),
    "dist_backend": (st.sampled_from([None, "gloo"]), st.sampled_from(["nccl", "mpi9"])),
    "dist_timeout": (floats(30, 120), st.sampled_from([0.0, -1.0])),
}
# a field of a script not in FIELDS: a bool is drawn, a small int drawn from 1..3 (or 0, -1 outside)
GENERIC = {bool: (st.booleans(), None), int: positive(3)}


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def env_ids(script):
    family = next((name for name in ENV_IDS if script.startswith(name)), None)
    assert family, f"{script}: add its algorithm's env ids to ENV_IDS"
    return ENV_IDS[family]


def field_strategies(module):
    """{field: (valid, invalid)} of `module.Args`, in FIELDS' order, then the script's own fields
    (GENERIC)."""
    defaults = vars(module.Args())
    known = {name: FIELDS[name] for name in FIELDS if name in defaults}
    generic = {
        name: GENERIC[type(value)] for name, value in defaults.items() if type(value) in GENERIC
    }
    fields = known | {name: generic[name] for name in generic if name not in known}
    swept = [name for name in fields if isinstance(defaults[name], tuple)]  # a seeds script's
    return fields | {name: tuple(map(sweep_values, fields[name])) for name in swept}


def sweep_values(strategy):
    """A sweep's flag (a seeds script's): one value of `strategy`, or two in 1 draw of 8."""
    if strategy is None:
        return None
    if callable(strategy):  # a function of the values drawn before
        return lambda values: sweep_values(strategy(values))
    return rarely(strategy.map(lambda value: (value,)), st.tuples(strategy, strategy), 8)


@st.composite
def flag_values(draw, script, fields):
    """{field: value}: an env id for `script`, a valid value for each of `fields`, then up to 2 of
    them drawn again from outside their range."""
    values = {"env_id": draw(env_ids(script))}
    for name, (valid, _) in fields.items():
        values[name] = draw(valid(values) if callable(valid) else valid)
    breakable = [name for name, (_, invalid) in fields.items() if invalid is not None]
    # half the combinations are all valid
    broken = draw(st.sampled_from([0, 0, 1, 2])) if breakable else 0
    names = st.lists(st.sampled_from(breakable), min_size=broken, max_size=broken)
    for name in draw(names) if broken else []:
        invalid = fields[name][1]
        values[name] = draw(invalid(values) if callable(invalid) else invalid)
    return values


def cli(values):
    """The command line of `values`: `--flag value`, `--flag`/`--no-flag`, a tuple as its items,
    None left out."""
    flags = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else flag.replace("--", "--no-", 1))
        elif isinstance(value, tuple):
            flags += [flag, *map(str, value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def run_in_process(script, flags, cwd):
    """`python leanrl/<script>.py *flags`, in this process: a CompletedProcess of its exit status
    and output. An exception other than SystemExit is raised, as the script would raise it."""
    module = load_script(script)
    args = tyro.cli(module.Args, args=flags)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    threads, here = torch.get_num_threads(), os.getcwd()
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        # a folder of its own: two runs in one second have the same run name
        os.chdir(tempfile.mkdtemp(dir=cwd))
        # tiny networks: more threads only wait for each other, the more so on a busy machine
        torch.set_num_threads(1)
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")  # the libraries' (pytest would collect them)
            module.main(args)
    except SystemExit as stop:
        if isinstance(stop.code, str):  # sys.exit("message"): the message on stderr, status 1
            err.write(stop.code + "\n")
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return subprocess.CompletedProcess(flags, code, out.getvalue(), err.getvalue())


def assert_trains_refuses_or_diverges(proc):
    """The contract's outcomes: exit 0 with one SUMMARY line whose numbers are finite; exit 2 with
    one line naming a flag; exit 3 with the SUMMARY of a run that diverged and lines on stderr
    that say so. No traceback. Returns the exit status and the summary (None after a refusal)."""
    if proc.returncode == 2:
        line = assert_user_error(proc)
        assert re.search(r"--[a-z]", line), f"the line names no flag: {line!r}"
        return 2, None
    result = summary(proc, returncode=proc.returncode if proc.returncode == 3 else 0)
    if proc.returncode == 3:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert errors and all("diverged" in line for line in errors), proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
        files = [result.get("model_file"), *(result.get("model_files") or [])]
        assert result["diverged"] and not any(files), result
    else:
        assert_finite(result)
    return proc.returncode, result


NON_FINITE = ("nan", "inf", "-inf")
# the per-member lists of a seeds script's summary: a diverged member's entries may hold NaN
PER_MEMBER = ("return_means", "curves", "eval_returns", "eval_return_means")


def assert_finite(result):
    """Every number in the summary of a run that trained is finite, but those of a seeds script's
    members that diverged (the others went on) and the values that `diverged` reports."""
    members = {entry["member"] for entry in result.get("diverged") or []}

    def walk(value, where):
        if isinstance(value, float) or value in NON_FINITE:  # a summary writes them as strings
            assert value not in NON_FINITE and math.isfinite(value), f"{where} is {value}"
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")

    for key, value in result.items():
        if key == "diverged":  # the members that diverged, each with the number that was not finite
            continue
        if key in PER_MEMBER and isinstance(value, list):
            value = [item for k, item in enumerate(value) if k not in members]
        walk(value, key)


# Every failure the fuzz has found (docs/design.md lists them), as flags by the start of a script's
# name; replayed first on every run of the in-process test (a `_cpu` script's with --no-compile, its
# default being --compile), with budgets that keep a run short should a check go
SAC_BUDGET = "--env-id Pendulum-v1 --total-timesteps 300 --learning-starts 100 --batch-size 32"
PPO_BUDGET = "--env-id Pendulum-v1 --total-timesteps 64 --num-steps 32 --num-minibatches 2"
FOUND = {
    "": ["--seed -1", "--seed 4294967296"],  # numpy refused the seed
    "ppo_atari": [
        "--seed 2147483648",  # envpool refused the seed
        # huge finite weights, logits overflowed to inf: Categorical.sample raised before a loss was
        # logged
        "--env-id Pong-v5 --num-steps 2 --num-minibatches 1 --total-timesteps 8 --learning-rate "
        "1e6",
    ],
    "sac": [
        # the loss log read actor_loss before the first policy update
        f"{SAC_BUDGET} --policy-frequency 3",
        f"{SAC_BUDGET} --policy-lr -1e-05",  # Adam refused it
        f"{SAC_BUDGET} --q-lr nan",  # Adam refused it
        f"{SAC_BUDGET} --q-lr 1e38",  # Adam overflowed float32
    ],
    # one member diverged, the other went on: the summary's `diverged` holds the nan, as it should
    "sac_continuous_action_seeds": [
        "--env-id Pendulum-v1 --num-envs 2 --learning-starts 0 --total-timesteps 4 --batch-size 2 "
        "--buffer-size 2 --policy-lr 1e12 --gamma 0 --tau 1 --policy-frequency 1 --autotune False "
        "--num-seeds 2 --no-compile"
    ],
    "ppo_continuous": [
        f"{PPO_BUDGET} --learning-rate nan",  # Adam refused it
        # NaN weights: torch.distributions.Normal refused their mean
        f"{PPO_BUDGET} --learning-rate inf",
    ],
}


def found(script):
    no_compile = ["--no-compile"] if script.endswith("_cpu") else []
    return [
        flags.split() + no_compile
        for start, cases in FOUND.items()
        if script.startswith(start)
        for flags in cases
    ]


def fuzz(script, run, max_examples, examples=()):
    """Run `run(flags) -> (exit status, summary)` on `examples`, then on `max_examples` combinations
    drawn for `script`; prints and returns the count of each exit status, of the runs that reached
    an episode's end and of those that compiled."""
    counts = collections.Counter()

    def counted(flags):
        status, result = run(flags)
        counts[status] += 1
        counts["episode ended"] += bool(result and result["episodes"])
        counts["compiled"] += bool(result and result["compile"])

    fields = field_strategies(load_script(script))
    test = given(flags=flag_values(script, fields).map(cli))(counted)
    for flags in examples:
        test = example(flags=flags)(test)
    kept = dict(deadline=None, derandomize=not LONG_RUN, database=None)
    settings(max_examples=max_examples, suppress_health_check=[HealthCheck.too_slow], **kept)(
        test
    )()
    print(
        f"{script}: {sum(counts[status] for status in (0, 1, 2, 3))} combinations, {counts[0]} "
        f"trained, {counts[2]} refused, {counts[3]} diverged, {counts[1]} timed out (Ray's); "
        f"{counts['episode ended']} reached an episode's end, {counts['compiled']} compiled"
    )
    return counts


@pytest.fixture
def fuzz_cwd(tmp_path, monkeypatch):
    """A folder for the runs' `runs/`, with a file that is not a model; wandb offline and quiet."""
    (tmp_path / "not_a_model.pt").write_text("not a model")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("MUJOCO_GL", "egl")
    return tmp_path


@pytest.mark.parametrize("script", IN_PROCESS)
def test_every_flag_combination_trains_or_is_refused_in_one_line(script, fuzz_cwd):
    def run(flags):
        return assert_trains_refuses_or_diverges(run_in_process(script, flags, fuzz_cwd))

    statuses = fuzz(script, run, FUZZ_EXAMPLES, found(script))
    assert statuses[0] > 0, "no combination trained: the draws test refusals only"


def test_the_ray_script_trains_or_refuses_in_one_line(fuzz_cwd):
    """Through a subprocess: the run starts Ray, which this process must not host. Besides the
    contract's outcomes, a run may meet its timeout: a runner's first fragment waits for its
    process to start, which on a loaded machine can take longer than a drawn --ray-timeout, and
    the contract for that is exit status 1 and one line naming the runner and the timeout."""

    def run(flags):
        proc = run_script(RAY, *flags, cwd=fuzz_cwd, timeout=300)
        if proc.returncode == 1:
            return assert_timed_out(proc, flags)
        return assert_trains_refuses_or_diverges(proc)

    fuzz(RAY, run, SUBPROCESS_EXAMPLES)


# a line of the progress bar on stderr (tqdm's), its description first
BAR = re.compile(r".*\d+%\|.*\| *\d+/\d+ \[.*\]")


def assert_timed_out(proc, flags):
    """A runner that sent nothing in --ray-timeout: exit status 1 and, beside the progress bar, one
    line on stderr, `error: runner <i> sent nothing in --ray-timeout <the flag's value> s`; no
    traceback, no SUMMARY. Returns the exit status and no summary."""
    timeout = float(flags[flags.index("--ray-timeout") + 1])
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not BAR.fullmatch(line)]
    line = rf"error: runner \d+ sent nothing in --ray-timeout {re.escape(f'{timeout:g}')} s"
    assert len(lines) == 1 and re.fullmatch(line, lines[0]), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "SUMMARY" not in proc.stdout
    return 1, None


def assert_every_rank_trains_refuses_or_diverges(proc, world_size=2):
    """Under torchrun: rank 0 prints one SUMMARY line with finite numbers; or the ranks diverge
    (exit status 3, rank 0's SUMMARY says so); or every rank exits 2 with the same one line
    naming a flag (torchrun then fails, and reports each rank's exit code). No rank prints a
    traceback. Returns the exit status and the summary."""
    assert not re.search(r"\[rank\d\]: Traceback", proc.stderr), proc.stderr[-3000:]
    if proc.returncode == 0:
        result = summary(proc)
        assert_finite(result)
        return 0, result
    if re.search(r"exitcode +: 3\b", proc.stderr):
        assert "diverged" in proc.stderr, proc.stderr[-3000:]
        result = summary(proc, returncode=proc.returncode)
        assert result["diverged"] and not result["model_file"], result
        return 3, result
    # the ranks write at once (a line can land in the middle of another's), and once one rank has
    # exited torchrun stops the others, which may not have written theirs yet
    errors = re.findall(r"error: .*?(?=error: |$)", proc.stderr, flags=re.MULTILINE)
    assert 1 <= len(errors) <= world_size and len(set(errors)) == 1, proc.stderr[-3000:]
    assert re.search(r"--[a-z]", errors[0]), f"the line names no flag: {errors[0]!r}"
    assert len(re.findall(r"exitcode +: 2\b", proc.stderr)) >= 1, proc.stderr[-3000:]
    assert "SUMMARY" not in proc.stdout
    return 2, None


def test_the_torchrun_script_under_torchrun_trains_or_refuses_on_every_rank(fuzz_cwd):
    """2 ranks on the CPU with gloo on loopback, through torchrun (in process the script is one
    rank, fuzzed above)."""

    def launch(flags):
        cmd = torchrun_command(*standalone(2), *flags)
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, cwd=fuzz_cwd, env=distributed_env()
        )
        return assert_every_rank_trains_refuses_or_diverges(proc)

    fuzz(DISTRIBUTED, launch, SUBPROCESS_EXAMPLES)
