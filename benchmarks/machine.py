"""The machine a benchmark ran on, written next to its figures."""

import importlib.metadata
import importlib.util
import os
from pathlib import Path

import torch

PACKAGES = ("torch", "tensordict", "gymnasium", "envpool")


def cpu_model(cpuinfo=Path("/proc/cpuinfo")):
    """The CPU's model name from `cpuinfo`, or None where that file does not say."""
    if not cpuinfo.exists():
        return None
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def package_version(name):
    """The installed version of package `name`, or None if it cannot be imported."""
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.metadata.version(name)


def machine_info():
    """CPU model, core count, GPU name (None without CUDA) and the versions of the packages in `PACKAGES`."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": {name: package_version(name) for name in PACKAGES},
    }
