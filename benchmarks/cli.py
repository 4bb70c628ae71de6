"""What the benchmarks' command lines share: the parser, its common flags and their types, the
device, and the end of a study (its table printed, where its results went, its failed checks)."""

import argparse
from pathlib import Path

import torch

from benchmarks.processes import note
from benchmarks.scripts import SCRIPTS

RESULTS = Path(__file__).resolve().parent / "results"
COMMON = {
    "--backend": dict(default="inductor", help="torch.compile backend (tests use aot_eager)"),
    "--device": dict(choices=("auto", "cpu", "cuda"), default="auto"),
    "--seed": dict(type=int, default=1),
    "--out": dict(type=Path, default=RESULTS, help="directory for the json, md and png"),
    "--out-dir": dict(type=Path, default=RESULTS, help="where results go"),
    "--scripts-dir": dict(type=Path, default=SCRIPTS, help=argparse.SUPPRESS),
}


def positive_int(text):
    """An argparse type: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text):
    """An argparse type: a float > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def values_of(kind):
    """An argparse type: comma-separated values, each parsed by `kind`."""
    return lambda text: [kind(item) for item in text.split(",")]


class OneLineParser(argparse.ArgumentParser):
    """argparse, with bad input reported in one line (exit status 2), without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser(module, doc, common="", one_line=False):
    """The parser of `python -m <module>` with the COMMON flags named in `common`, and its
    add_argument."""
    kind = OneLineParser if one_line else argparse.ArgumentParser
    made = kind(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    for flag in common.split():
        made.add_argument(flag, **COMMON[flag])
    return made, made.add_argument


def parse(made, argv, quick=None, full=None):
    """Parse `argv`; each flag left unset (None) takes its value in `quick` (with --quick) or
    `full`; --device cuda without CUDA is an error."""
    args = made.parse_args(argv)
    for key, value in ((quick if getattr(args, "quick", False) else full) or {}).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if getattr(args, "device", None) == "cuda" and not torch.cuda.is_available():
        made.error("--device cuda: no CUDA device is available")
    return args


def pick_device(choice):
    """The device to run on: `choice`, or CUDA when there is one for 'auto'."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def conclude(table, paths, failures=()):
    """Print the table, say where the results went and which checks failed; the exit status."""
    print(table)
    note("wrote " + ", ".join(map(str, paths)))
    for line in failures:
        note(f"check failed: {line}")
    return 1 if failures else 0
