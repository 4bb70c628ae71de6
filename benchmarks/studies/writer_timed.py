"""A run as `python <script> <flags>` makes it, with the time inside its TensorBoard writer's calls
counted (`runs.Scalars`: the events built, checksummed, written and flushed); after the SUMMARY line
it prints `WRITER {"seconds": ..., "calls": ...}`.

    python -m benchmarks.studies.writer_timed leanrl/dqn_cpu.py --total-timesteps 80000
"""

import atexit
import json
import runpy
import sys
import time
from pathlib import Path


def count_time(cls, names, spent):
    """Wrap `cls`'s methods `names` to add their time and calls to `spent`; a call inside another
    counts once."""
    depth = [0]

    def timed(method):
        def call(*args):
            start, depth[0] = time.perf_counter(), depth[0] + 1
            try:
                return method(*args)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    spent["seconds"] += time.perf_counter() - start
                    spent["calls"] += 1

        return call

    for name in names:
        setattr(cls, name, timed(getattr(cls, name)))


def main():
    script = Path(sys.argv[1]).resolve()
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(script.parent))  # as `python <script>` puts its folder first
    import runs

    spent = dict(seconds=0.0, calls=0)
    count_time(runs.Scalars, ("add", "add_episodes"), spent)
    atexit.register(lambda: print("WRITER " + json.dumps(spent), flush=True))
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
