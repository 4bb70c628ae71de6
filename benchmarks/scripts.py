"""Where the training scripts are, and how the benchmarks and the tests import one: by path, with
`leanrl/` on `sys.path` as `python leanrl/<script>.py` has it, so that a script's `from runs import
...` finds the run modules beside it."""

import functools
import importlib
import importlib.util
import inspect
import sys
import tempfile
from contextlib import chdir
from pathlib import Path

import tyro

SCRIPTS = Path(__file__).resolve().parents[1] / "leanrl"
# the modules beside the scripts, not scripts: the run plumbing by purpose and the optimizers (the
# ones an export inlines, each after those it imports), the tensor envs it makes, and the exporter
RUN_MODULES = ("flags", "signals", "folders", "checkpoints", "logs", "runs", "vector_envs")
RUN_MODULES += ("threads", "seeds", "atari", "ranks", "optimizers")
MODULES = (*RUN_MODULES, "tensor_envs", "tensor_wrappers", "mujoco_envs", "export")
ALL_SCRIPTS = sorted(path.stem for path in SCRIPTS.glob("*.py") if path.stem not in MODULES)


def load_script(name, directory=SCRIPTS):
    """Import `<directory>/<name>.py` (by default a script of `leanrl/`) as a module; importing
    starts nothing."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    if name in MODULES and Path(directory) == SCRIPTS:  # the one the scripts import
        return importlib.import_module(name)
    # a copy elsewhere (an exported script) under a name of its own
    prefix = "leanrl" if Path(directory) == SCRIPTS else f"leanrl_{Path(directory).name}"
    spec = importlib.util.spec_from_file_location(
        f"{prefix}_{name}", Path(directory) / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks functions' modules up by name
    spec.loader.exec_module(module)
    return module


def script_envs(module, flags):
    """The parsed `Args` of a script `module` for its command-line `flags`, and the vector env its
    `make_envs` builds from them (every parameter of `make_envs` without a default is a field of
    `Args`; the optional ones, such as video recording, keep their defaults). A script with its own
    wrappers, `wrap(env, ...)` for vector_envs.make_envs, has them too, with its flags."""
    args = tyro.cli(module.Args, args=list(flags))
    # the memory scripts resolve their default in main, as here
    if hasattr(module, "observed_indices"):
        args.obs_indices = module.observed_indices(args.env_id, args.obs_indices)
    kwargs = {name: getattr(args, name) for name in required_parameters(module.make_envs)}
    if hasattr(module, "observation_wrap"):  # the memory scripts' wrappers
        kwargs["wrap"] = module.observation_wrap(args.obs_indices)
    if hasattr(module, "wrap"):
        wrap_flags = {name: getattr(args, name) for name in required_parameters(module.wrap)[1:]}
        kwargs["wrap"] = functools.partial(module.wrap, **wrap_flags)
    if hasattr(args, "num_seeds") and "num_seeds" not in kwargs:  # every member's, as main makes
        kwargs["num_envs"] *= args.num_seeds
    return args, module.make_envs(**kwargs)


def required_parameters(function):
    """The names of `function`'s parameters without a default."""
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters if p.default is inspect.Parameter.empty]


def export_scripts(names, directory):
    """`python leanrl/export.py` of each script of `names` into `directory`: one file each, with the
    parts of the run modules it uses inlined."""
    export = load_script("export")
    modules = export.run_modules()
    for name in names:
        source = (SCRIPTS / f"{name}.py").read_text()
        copy = export.export(source, modules, name, f"{name}.py")
        (Path(directory) / f"{name}.py").write_text(copy)
    return Path(directory)


def run_learning_phase(module, args, *contexts):
    """Run a script `module`'s own `main(args)` in a temporary folder (its runs/), with its learning
    phase, from its sps clock's start (after the random steps and the burn-in) to its end, inside
    the context managers `contexts`; returns the env steps of that phase."""
    steps = {}

    class Run(module.Run):
        def start_clock(self, global_step):
            super().start_clock(global_step)
            steps["first"] = global_step
            for context in contexts:
                context.__enter__()

        def finish(self, *args, **kwargs):
            for context in reversed(contexts):
                context.__exit__(None, None, None)
            steps["phase"] = self.steps - steps["first"]
            return super().finish(*args, **kwargs)

    module.Run = Run
    with tempfile.TemporaryDirectory() as folder, chdir(folder):
        module.main(args)
    return steps["phase"]
