"""Where the training scripts are, and how the benchmarks and the tests import one: by path, with
`leanrl/` on `sys.path` as `python leanrl/<script>.py` has it, so that a script's `from runs import
...` finds the run module beside it."""

import importlib.util
import inspect
import sys
from pathlib import Path

import tyro

SCRIPTS = Path(__file__).resolve().parents[1] / "leanrl"
RUN_MODULE = "runs"  # leanrl/runs.py, the run plumbing: not a script
ALL_SCRIPTS = sorted(path.stem for path in SCRIPTS.glob("*.py") if path.stem != RUN_MODULE)


def load_script(name, directory=SCRIPTS):
    """Import `<directory>/<name>.py` (by default a script of `leanrl/`) as a module; importing
    starts nothing."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"leanrl_{name}", Path(directory) / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks functions' modules up by name
    spec.loader.exec_module(module)
    return module


def script_envs(module, flags):
    """The parsed `Args` of a script `module` for its command-line `flags`, and the vector env its
    `make_envs` builds from them (every parameter of `make_envs` without a default is a field of
    `Args`; the optional ones, such as video recording, keep their defaults)."""
    args = tyro.cli(module.Args, args=list(flags))
    parameters = inspect.signature(module.make_envs).parameters.values()
    required = [p.name for p in parameters if p.default is inspect.Parameter.empty]
    kwargs = {name: getattr(args, name) for name in required}
    # the memory scripts resolve their default in main, as here, and wrap their envs
    if hasattr(module, "observed_indices"):
        args.obs_indices = module.observed_indices(args.env_id, args.obs_indices)
        kwargs["wrap"] = module.make_wrap(args.obs_indices)
    return args, module.make_envs(**kwargs)
