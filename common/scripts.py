"""Where the training scripts are, and how the benchmarks and the tests import one (scripts import
nothing from the project, so they are loaded by path)."""

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "leanrl"


def load_script(name, directory=SCRIPTS):
    """Import `<directory>/<name>.py` (by default a script of `leanrl/`) as a module; importing
    starts nothing."""
    spec = importlib.util.spec_from_file_location(f"leanrl_{name}", Path(directory) / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks functions' modules up by name
    spec.loader.exec_module(module)
    return module
