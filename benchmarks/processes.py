"""Ending a process and everything it started (torchrun's ranks, Ray's workers), for the benchmarks
and the tests alike; a process that ends with the one that started it; progress on stderr."""

import ctypes
import os
import signal
import sys


def note(message):
    """Progress and notes go to stderr, so that stdout carries only the table."""
    print(message, file=sys.stderr, flush=True)


def die_with_parent():
    """In a started process: the kernel kills it when its parent dies, however the parent dies
    (Linux's PR_SET_PDEATHSIG; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def descendants(pid):
    """The pids of every live descendant of `pid`, from /proc (torchrun starts its ranks in
    sessions of their own, so killing its process group misses them)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid):
    """SIGKILL to `pid` and to every descendant of it."""
    for target in [*descendants(pid), pid]:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
