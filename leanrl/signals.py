"""Ctrl-C and SIGTERM (`kill`, Slurm's time limit, a preempted machine): the first stops the
training loop after its step, so that the run saves and reports; a second stops the process at
once (its default action)."""

import signal


class Signals:
    """`received`: this process's first Ctrl-C or SIGTERM (0: none); `stop`: the signal the loop
    stops on, the same (ranks.py's `RankSignals`: the one torchrun's ranks agreed on)."""

    def __init__(self):
        self.received = 0
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame):
        self.received = self.received or signum
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second signal stops at once
            signal.signal(signum, signal.SIG_DFL)

    @property
    def stop(self):
        return self.received
