"""The machine a benchmark ran on, written next to its figures."""

import importlib.metadata
import importlib.util
import os
from pathlib import Path

import torch

PACKAGES = ("torch", "tensordict", "gymnasium", "envpool")
# widest first: (name, cpuinfo flag)
VECTOR_EXTENSIONS = (("AVX-512", "avx512f"), ("AVX2", "avx2"), ("AVX", "avx"))


def cpu_model(cpuinfo=Path("/proc/cpuinfo")):
    """The CPU's model name from `cpuinfo`, with its family, model and widest vector extension
    (virtual machines often report a bare "AMD EPYC" for CPUs generations apart), or None where
    that file does not say."""
    if not cpuinfo.exists():
        return None
    fields = {}
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "model name" not in fields:
        return None
    flags = fields.get("flags", "").split()
    vector = next((name for name, flag in VECTOR_EXTENSIONS if flag in flags), "no AVX")
    family, model = fields.get("cpu family", "?"), fields.get("model", "?")
    return f"{fields['model name']} (family {family} model {model}, {vector})"


def package_version(name):
    """The installed version of package `name`, or None if it cannot be imported."""
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.metadata.version(name)


def machine_info():
    """CPU model, core count, GPU name (None without CUDA) and the versions of the packages in
    `PACKAGES`."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": {name: package_version(name) for name in PACKAGES},
    }
