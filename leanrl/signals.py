"""Ctrl-C and SIGTERM (`kill`, Slurm's time limit, a preempted machine): the first stops the
training loop after its step, so that the run saves and reports; a second stops the process at
once (its default action)."""

import signal


class Signals:
    """`received`: this process's first Ctrl-C or SIGTERM (0: none). `stop`: the signal the loop
    stops on: the same, or with `agree` (torchrun's ranks) the one the ranks agreed on, which the
    script sets in `agreed` after each iteration, so that all stop after the same one."""

    def __init__(self, agree=False):
        self.received, self.agreed, self.agree = 0, 0, agree
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame):
        self.received = self.received or signum
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second signal stops at once
            signal.signal(signum, signal.SIG_DFL)

    @property
    def stop(self):
        return self.agreed if self.agree else self.received
