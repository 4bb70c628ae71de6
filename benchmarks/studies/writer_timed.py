"""A run as `python <script> <flags>` makes it, its TensorBoard writer's calls (`runs.Scalars`)
made, then skipped, in turns of `--turn` seconds of the timed loop: neighbouring turns of one
process compare the loop with and without the writer, caches included, where two runs' sps differ
by 5-15% here. After the SUMMARY line: `WRITER {"seconds", "calls", "turns"}`, the time inside the
calls made in the turns, their number, and each turn's [writer on, steps, seconds].

    python -m benchmarks.studies.writer_timed --turn 0.1 leanrl/dqn_cpu.py --total-timesteps 80000
"""

import argparse
import atexit
import json
import runpy
import sys
import time
from pathlib import Path


class Turns:
    """The writer's calls timed, and made or skipped in turns of `seconds`."""

    def __init__(self, seconds):
        self.seconds, self.on, self.depth, self.start = seconds, True, 0, None
        self.result = dict(seconds=0.0, calls=0, turns=[])

    def writer_call(self, method):
        """`method` made and timed while the writer is on (a call inside another counts once)."""

        def call(*args):
            if not self.on:
                return None
            start, self.depth = time.perf_counter(), self.depth + 1
            method(*args)
            self.depth -= 1
            if not self.depth and self.start is not None:  # in a turn
                self.result["seconds"] += time.perf_counter() - start
                self.result["calls"] += 1

        return call

    def after_iteration(self, checkpoint):
        """`Run.checkpoint`, which every iteration calls, then a turn's end once it is due."""

        def call(run, iteration, state, steps):
            checkpoint(run, iteration, state, steps)
            now = time.perf_counter()
            if run.measure_start is None:  # the clock has not started
                return
            if self.start is None:
                self.start, self.steps = now, steps
            elif now - self.start >= self.seconds:
                self.result["turns"].append([self.on, steps - self.steps, now - self.start])
                self.on, self.start, self.steps = not self.on, now, steps

        return call


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turn", type=float, default=0.1, help="seconds of iterations a turn")
    parser.add_argument("script", type=Path)
    parser.add_argument("flags", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    script = args.script.resolve()
    sys.argv = [str(script), *args.flags]
    sys.path.insert(0, str(script.parent))  # as `python <script>` puts its folder first
    import runs

    turns = Turns(args.turn)
    for name in ("add", "add_episodes"):
        setattr(runs.Scalars, name, turns.writer_call(getattr(runs.Scalars, name)))
    runs.Run.checkpoint = turns.after_iteration(runs.Run.checkpoint)
    atexit.register(lambda: print("WRITER " + json.dumps(turns.result), flush=True))
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
