"""Threads chosen by measurement (threads.ThreadChoice), driven by a made-up clock: a trial times
the run's own iterations at one thread and at every core, keeps the faster, says so in one line, and
tries again only when an iteration's time leaves the band around the trial's; `--threads` fixes the
count and no trial runs. The iteration times here are made up, so nothing is timed for real."""

import functools
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ALL_SCRIPTS, ROOT, assert_measured_threads, load_script
from test_resume import COUNTED, SMOKE

runs = load_script("runs")
threads = load_script("threads")


@pytest.fixture(autouse=True)
def _threads_restored():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def drive(choice, cost, seconds, now=0.0, step=0):
    """Iterations for `seconds` of the made-up clock, each costing `cost(threads)`; returns the
    clock, the step and the lines printed."""
    lines, end = [], now + seconds
    while now < end:
        now += cost(torch.get_num_threads())
        step += 1
        line = choice.tick(now, step)
        lines += [line] if line else []
    return now, step, lines


def test_a_trial_keeps_the_faster_count_and_says_so():
    choice = threads.ThreadChoice(2)
    choice.start(0.0)
    now, step, lines = drive(choice, {1: 0.004, 2: 0.002}.get, 3.0)
    assert torch.get_num_threads() == 2 and len(choice.trials) == 1
    trial = choice.trials[0]
    assert trial["threads"] == 2 and trial["ms"] == pytest.approx({1: 4.0, 2: 2.0})
    assert lines == [
        f"threads: 2, faster at step {trial['step']} (an iteration: 1: 4.00 ms, 2: "
        "2.00 ms); --threads fixes it"
    ]


def test_a_busy_core_makes_one_thread_the_choice_and_a_slow_turn_is_one_iteration():
    """Two threads beside a busy core: 30x slower; a turn lasts one iteration past its time."""
    choice = threads.ThreadChoice(2)
    choice.start(0.0)
    drive(choice, {1: 0.004, 2: 0.12}.get, 5.0)
    assert torch.get_num_threads() == 1 and choice.trials[0]["threads"] == 1


def test_only_a_change_beyond_the_band_starts_a_new_trial():
    choice = threads.ThreadChoice(2)
    choice.start(0.0)
    now, step, _ = drive(choice, {1: 0.004, 2: 0.002}.get, 3.0)
    now, step, lines = drive(choice, {1: 0.004, 2: 0.0026}.get, 20.0, now, step)  # within 1.5x
    assert lines == [] and len(choice.trials) == 1
    # the machine got busy: two threads now cost 10x, one thread is still 4 ms
    now, step, lines = drive(choice, {1: 0.004, 2: 0.02}.get, 30.0, now, step)
    assert len(choice.trials) == 2 and choice.trials[1]["threads"] == 1 and len(lines) == 1
    assert torch.get_num_threads() == 1


def test_threads_fixed_by_the_flag_or_by_omp_num_threads_are_not_measured(make_run, monkeypatch):
    """Two cores: the default measures 1 against 2; `--threads 2` fixes them, and so does
    OMP_NUM_THREADS=1 (the cores the run may use); a script without --threads leaves them."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert make_run("sac_continuous_action_cpu", threads=2).threads is None
    assert torch.get_num_threads() == 2
    default = make_run("sac_continuous_action_cpu")
    assert torch.get_num_threads() == 1 and default.threads.counts == (1, 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert make_run("sac_continuous_action_cpu").threads is None
    assert make_run("sac_continuous_action").threads is None  # no --threads, not the run's to set


def test_long_iterations_end_a_trial_in_three_and_time_that_compiled_is_not_timed():
    """PPO's iterations take seconds: the first at the new count compiles (60 s here: torch guards
    compiled code on the thread count), so it is not timed and the turn starts again; then one
    timed iteration at each count ends the trial."""
    graphs = [0]
    choice = threads.ThreadChoice(2, compiles=lambda: graphs[0])
    choice.start(0.0)
    costs = iter([(60.0, 1), (1.0, 0), (1.5, 0)])  # 2 threads, compiling; 2 threads; 1 thread
    now, step, lines = 0.0, 0, []
    for cost, compiled in costs:
        now, step, graphs[0] = now + cost, step + 1, graphs[0] + compiled
        lines += [choice.tick(now, step)]
    assert lines[:2] == [None, None] and lines[2] is not None
    assert choice.trials == [dict(step=3, threads=2, ms={1: 1500.0, 2: 1000.0})]
    # sps leaves out the iteration that compiled and the turn at the count not kept
    assert choice.left_out() == (61.5, 2)


def run_with_threads(make_run, monkeypatch, compiles):
    """dqn_cpu's Run on two cores, measuring its threads on a made-up clock (`clock[0]`, seconds),
    `compiles()` its count of compiled graphs."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    clock = [100.0]
    fake_time = SimpleNamespace(time=lambda: clock[0], perf_counter=lambda: clock[0])
    fake_time.monotonic = fake_time.perf_counter
    monkeypatch.setattr(runs, "time", fake_time)
    monkeypatch.setattr(threads, "time", fake_time)  # ThreadChoice.timed's clock
    monkeypatch.setattr(
        threads, "ThreadChoice", functools.partial(threads.ThreadChoice, compiles=compiles)
    )
    return make_run("dqn_cpu"), clock


def test_sps_leaves_out_what_measuring_threads_cost(make_run, monkeypatch):
    """Beside a busy core two threads take 30 ms an iteration, one thread 1 ms, and the first
    iteration at two threads compiles for them (60 s): sps is one thread's 1,000 steps a second,
    whether the trial ended or still runs (then the count slower so far is left out); a run that
    keeps two threads leaves out its turns at one."""
    graphs = [0]
    run, clock = run_with_threads(make_run, monkeypatch, lambda: graphs[0])
    running = 0  # iterations that began with the trial running and a turn timed at each count
    for iteration in run.progress(range(1500)):
        if iteration == 0:
            run.start_clock(0)
        elif run.threads.chosen is None and all(n for _, n in run.threads.seconds.values()):
            running += 1
            assert run.sps(run.steps) == pytest.approx(1000.0)
        threads = torch.get_num_threads()
        compiling = threads == 2 and graphs[0] == 0
        clock[0] += 60.0 if compiling else {1: 0.001, 2: 0.030}[threads]
        graphs[0] += compiling
        run.steps = iteration + 1
    assert running > 100 and run.threads.trials[0]["threads"] == 1
    assert run.sps(run.steps) == pytest.approx(1000.0)

    run, clock = run_with_threads(make_run, monkeypatch, lambda: 0)  # nothing compiles
    for iteration in run.progress(range(2000)):
        if iteration == 0:
            run.start_clock(0)
        clock[0] += {1: 0.004, 2: 0.002}[torch.get_num_threads()]
        run.steps = iteration + 1
    assert run.threads.trials[0]["threads"] == 2
    assert run.sps(run.steps) == pytest.approx(500.0)


def test_a_turn_that_compiled_starts_again_so_a_late_compile_cannot_pick_the_count():
    """The bug this guards: SAC compiles its actor's update one iteration after its critic's, so
    the second iteration at a new count compiled too; timed, it made two threads look 3x slower
    than one. Here two threads are faster, but their turns compile for their first 3 iterations
    (0.2 s each): the choice is still two threads, at the uncompiled iterations' time."""
    graphs, at_two = [0], 0
    choice = threads.ThreadChoice(2, compiles=lambda: graphs[0])
    choice.start(0.0)
    now, step, lines = 0.0, 0, []
    while not choice.trials:
        count = torch.get_num_threads()
        at_two += count == 2
        compiling = count == 2 and at_two <= 3
        now, step = now + (0.2 if compiling else {1: 0.004, 2: 0.002}[count]), step + 1
        graphs[0] += compiling
        lines += [line for line in [choice.tick(now, step)] if line]
    assert choice.trials[0]["threads"] == 2 and len(lines) == 1
    assert choice.trials[0]["ms"] == pytest.approx({1: 4.0, 2: 2.0})


def test_counting_compiled_graphs_imports_nothing_where_nothing_compiled():
    """An eager run's first trial turn would time torch._dynamo's import (seconds)."""
    code = (
        "import sys; import threads; import torch; n = threads.compiled_graphs();"
        "print(n, 'torch._dynamo' in sys.modules);"
        "torch.compile(lambda x: x + 1)(torch.ones(2)); print(threads.compiled_graphs())"
    )
    cmd = [sys.executable, "-c", code]
    out = subprocess.run(cmd, cwd=ROOT / "leanrl", capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["0", "False", "1"], out.stderr


SCALE = 2.0  # a global the compiled function reads: its guard is one that step_guards drops


def test_step_guards_keep_the_flags_and_the_thread_count_and_drop_the_globals():
    # the guards kept tell the two kinds of step apart, and a new thread count compiles again;
    # a global's is dropped: the compiled step keeps the value it was compiled with
    global SCALE
    torch.set_num_threads(1)
    state = torch.zeros(3)

    def step(x, flag):
        state.add_(x * SCALE)
        return state * 2 if flag else state

    compiled = torch.compile(step, fullgraph=True, options={"guard_filter_fn": threads.step_guards})
    before = threads.compiled_graphs()
    assert torch.equal(compiled(torch.ones(3), True), torch.full((3,), 4.0))
    assert torch.equal(compiled(torch.ones(3), False), torch.full((3,), 4.0))
    assert threads.compiled_graphs() == before + 2
    SCALE = 10.0
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            assert torch.equal(compiled(torch.ones(3), False), torch.full((3,), 6.0))
    finally:
        SCALE = 2.0
    torch.set_num_threads(2)
    compiled(torch.ones(3), False)
    assert threads.compiled_graphs() == before + 3


def test_a_window_that_compiled_does_not_start_a_new_trial():
    graphs = [0]
    choice = threads.ThreadChoice(2, compiles=lambda: graphs[0])
    choice.start(0.0)
    now, step, _ = drive(choice, {1: 0.004, 2: 0.002}.get, 3.0)
    graphs[0] += 1  # an evaluation compiles for 2 s inside a window
    now, step, _ = drive(choice, lambda threads: 2.0, 2.0, now, step)
    now, step, lines = drive(choice, {1: 0.004, 2: 0.002}.get, 20.0, now, step)
    assert lines == [] and len(choice.trials) == 1


# every script with `--threads`: a tiny run of it (test_resume's), long enough for a trial whose
# turns last one iteration each (the PPO scripts: 8 iterations)
THREAD_SCRIPTS = [name for name in ALL_SCRIPTS if name.endswith(("_cpu", "_seeds"))]
LONGER = {"ppo_continuous_action_cpu": 512, "ppo_continuous_action_seeds": 128}


@pytest.mark.parametrize("script", THREAD_SCRIPTS)
def test_every_script_with_threads_chooses_them_in_its_loop(script, train, monkeypatch):
    """Without `--threads`, on two cores, the run's own loop holds a trial after its burn-in (turns
    of one iteration, no second trial), and the SUMMARY reports the trial and ends on its choice;
    `--threads 1` fixes the count and no trial runs."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    quick = functools.partial(
        threads.ThreadChoice, turn_seconds=0.0, trial_seconds=0.0, window_seconds=1e9
    )
    monkeypatch.setattr(threads, "ThreadChoice", quick)
    flags = (*SMOKE[script], "--measure-burnin", 0)
    flags += ("--total-timesteps", LONGER[script]) if script in LONGER else ()
    counted = COUNTED.get(script)
    assert train(script, *flags, "--run-name", "measured", counted=counted) == 0
    s = json.loads(Path("runs/measured/summary.json").read_text())
    assert len(s["thread_trials"]) == 1 and s["threads"] == s["thread_trials"][0]["threads"]
    assert_measured_threads(s)
    assert train(script, *flags, "--threads", 1, "--run-name", "fixed", counted=counted) == 0
    s = json.loads(Path("runs/fixed/summary.json").read_text())
    assert (s["threads"], s["thread_trials"]) == (1, [])


def test_training_starts_with_what_setup_made_kept_from_full_garbage_collections(make_run):
    """`progress` freezes the objects made so far (modules, networks, the writer): a full garbage
    collection in the loop scans only what the loop made (before: 0.25 s, a quarter of dqn_cpu's
    timed steps at its quick budget)."""
    import gc

    gc.unfreeze()
    run = make_run("dqn_cpu", tensorboard=False)
    try:
        assert gc.get_freeze_count() == 0
        run.progress(range(2))
        assert gc.get_freeze_count() > 10_000  # torch's modules alone
        assert len(gc.get_objects()) < 1_000  # what a full collection still scans
    finally:
        gc.unfreeze()
