"""The CPU scripts' threads: `ThreadFlags` (`--threads`) and `CPUFlags` (adds `--bf16`), and
`ThreadChoice`, which measures whether one thread or every core runs the run faster where
`--threads` is not given; and `step_guards`, what dynamo checks before each call of their
compiled updates."""

import os
import sys
import time
from dataclasses import dataclass

import torch
import tqdm
from flags import RunFlags, fail


@dataclass
class ThreadFlags(RunFlags):
    threads: int | None = None
    """torch's intra-op threads (default: 1 or every core, whichever the run measures faster)"""

    def check_threads(self):
        if self.threads is not None and self.threads <= 0:
            fail(f"--threads must be positive, got {self.threads}")

    def thread_summary(self, choice):
        """The SUMMARY's threads: the count at the end and the trials of the `ThreadChoice`."""
        return dict(threads=torch.get_num_threads(), thread_trials=choice.trials if choice else [])

    def start_threads(self):
        """Sets torch's threads; returns the `ThreadChoice` that measures them, where the run is to
        choose (no --threads, more than one core), else None."""
        # a second thread speeds the updates' matmuls on an idle CPU, but a thread pool that loses
        # a core to other work waits for it at every op: without --threads, the run starts on one
        # and measures
        torch.set_num_threads(self.threads or 1)
        cores = len(os.sched_getaffinity(0))  # the cores it may use, at most OMP_NUM_THREADS
        limit = os.environ.get("OMP_NUM_THREADS", "")
        cores = min(cores, int(limit)) if limit.isdigit() and int(limit) > 0 else cores
        return ThreadChoice(cores) if self.threads is None and cores > 1 else None


@dataclass
class CPUFlags(ThreadFlags):
    bf16: bool = False
    """compute the compiled updates in bfloat16, the weights and the optimizer's state in float32
    (needs a CPU with AMX or AVX-512 BF16)"""

    def check_threads(self):
        super().check_threads()
        if self.bf16 and not bf16_native():
            fail("--bf16 needs a CPU with AMX or AVX-512 BF16, and this one has neither")


def bf16_native():
    """Whether this CPU computes bfloat16 natively: AMX or AVX-512 BF16 (Linux's cpuinfo flags)."""
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def step_guards(guards):
    """torch.compile's `guard_filter_fn` for an update called every step: dynamo checks before each
    call what the graph read, and here only the tensors and the flags can change, not the imported
    modules and functions (globals) nor the modules the update calls: most of its checks go, the
    thread count's and the flags' stay."""
    globals_kept = torch.compiler.skip_guard_on_globals_unsafe(guards)
    modules_kept = torch.compiler.skip_guard_on_all_nn_modules_unsafe(guards)
    return [a and b for a, b in zip(globals_kept, modules_kept)]


def compiled_graphs():
    """How many graphs torch.compile has compiled in this process: torch guards compiled code on
    the thread count, so the first calls at a new count compile again, for it. Without compile,
    none, and nothing imported (torch._dynamo takes seconds to import: it would be timed)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return dynamo.counters["stats"]["unique_graphs"] if dynamo else 0


class ThreadChoice:
    """torch's intra-op threads, chosen by measurement where `--threads` does not fix them. A trial
    times the run's own iterations at one thread and at every core the process may use, in turns
    of at least `turn_seconds` and one iteration, alternately, until each count has run
    `trial_seconds`, and keeps the faster. Time in which anything compiled is not the count's: a
    turn or window that compiled starts again. After the trial, each `window_seconds` the time of
    an iteration is checked against the trial's: `band` times longer or shorter (the machine got
    busy, or idle) starts a new trial. `left_out()`: what measuring cost, which sps leaves out."""

    def __init__(
        self,
        cores,
        turn_seconds=0.25,
        trial_seconds=1.0,
        window_seconds=5.0,
        band=1.5,
        compiles=compiled_graphs,
    ):
        self.counts, self.turn_seconds, self.trial_seconds = (1, cores), turn_seconds, trial_seconds
        self.window_seconds, self.band, self.compiles = window_seconds, band, compiles
        self.trials, self.chosen, self.mark = [], None, None
        self.excluded = [0.0, 0]  # the seconds and steps left out of sps so far

    def start(self, now, step=0):
        self.seconds = {n: [0.0, 0] for n in self.counts}  # each count's timed turns, iterations
        self.spent = {n: [0.0, 0] for n in self.counts}  # and all its seconds and steps
        self.chosen, self.last = None, (now, step)
        self.turn(now, self.counts[1])

    def turn(self, now, count):
        self.count = count
        torch.set_num_threads(count)
        self.restart(now)

    def restart(self, now):
        self.mark, self.compiled = (now, 0), self.compiles()

    def tick(self, now, step):
        """After an iteration: on to the next turn, the choice or a new trial; returns a line to
        print when a trial ends."""
        if self.mark is None:
            return None
        spent = [now - self.last[0], step - self.last[1]]  # this iteration's
        self.last = (now, step)
        if self.compiles() != self.compiled:
            self.leave_out(spent)
            self.restart(now)
            return None
        start, iterations = self.mark[0], self.mark[1] + 1
        self.mark = (start, iterations)
        if self.chosen is None:  # in a trial
            self.spent[self.count] = [a + b for a, b in zip(self.spent[self.count], spent)]
            if now - start < self.turn_seconds:
                return None
            self.seconds[self.count][0] += now - start
            self.seconds[self.count][1] += iterations
            if all(t >= self.trial_seconds and n for t, n in self.seconds.values()):
                return self.choose(now, step)
            self.turn(now, self.counts[self.count == self.counts[0]])  # the other count
        elif now - start >= self.window_seconds:  # a window of the chosen count
            per_iteration = (now - start) / iterations
            if 1 / self.band < per_iteration / self.chosen[1] < self.band:
                self.restart(now)
            else:
                self.start(now, step)
        return None

    def timed(self, iterations, run):
        """`iterations`, each timed: after each, a `tick` at the `run`'s env steps; a line when a
        trial ends."""
        for iteration in iterations:
            yield iteration
            line = self.tick(time.perf_counter(), run.steps)
            if line:
                tqdm.tqdm.write(line, file=sys.stderr)

    def leave_out(self, spent):
        self.excluded = [a + b for a, b in zip(self.excluded, spent)]

    def left_out(self):
        """The seconds and steps that sps leaves out: iterations that compiled (for a new count, as
        the first compile is), and each trial's iterations at the count it did not keep; of a trial
        still running, those at the count slower so far, once both have a timed turn."""
        trial = self.mark is not None and self.chosen is None
        if not trial or not all(n for _, n in self.seconds.values()):
            return tuple(self.excluded)
        ms = {n: seconds / count for n, (seconds, count) in self.seconds.items()}
        slower = max(ms, key=ms.get)
        return tuple(a + b for a, b in zip(self.excluded, self.spent[slower]))

    def choose(self, now, step):
        ms = {n: 1e3 * seconds / max(1, count) for n, (seconds, count) in self.seconds.items()}
        threads = min(ms, key=ms.get)
        self.chosen = (threads, ms[threads] / 1e3)
        self.leave_out(self.spent[self.counts[threads == self.counts[0]]])  # the other count's
        torch.set_num_threads(threads)
        self.trials.append(dict(step=step, threads=threads, ms=ms))
        self.restart(now)
        times = ", ".join(f"{n}: {t:.2f} ms" for n, t in ms.items())
        return (
            f"threads: {threads}, faster at step {step} (an iteration: {times}); --threads fixes it"
        )
