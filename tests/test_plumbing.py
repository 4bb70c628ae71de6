"""The run plumbing exists once, in the run modules of leanrl/ (runs.py and its neighbours by
purpose), and every script is its algorithm plus named calls into them: no script defines a name of
a module it uses, imports anything of the project but names of the run modules (each from the
module that defines it), or sets threads it has a flag for; the modules import no script, and no
run imports the exporter; each module is short enough to read at a sitting, `Run` too, and no class
of theirs rewrites another's methods wholesale; the flags a resumed run may change are flags of the
scripts; every script stays within its size budget. Scripts are found on disk, so a new one is held
to these at once. Parsing only: ~1 s."""

import ast
import functools

import pytest
from conftest import ALL_SCRIPTS, SCRIPTS, load_script

from benchmarks.scripts import MODULES, RUN_MODULES


@functools.cache
def tree(name):
    return ast.parse((SCRIPTS / f"{name}.py").read_text())


def top_level_names(name):
    return {
        node.name
        for node in tree(name).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
    }


def project_imports(name):
    """(module, names) of each import of a module that sits in leanrl/."""
    local = {path.stem for path in SCRIPTS.glob("*.py")}
    found = []
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.ImportFrom) and node.module in local:
            found.append((node.module, [alias.name for alias in node.names]))
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.split(".")[0] in local]
    return found


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_script_defines_nothing_its_export_inlines(script):
    """The plumbing is not copied into a script; and an exported copy, which holds both the
    script's definitions and the modules' it uses, has each name once (a script's own `make_envs`
    for envpool is its own as long as nothing it imports uses the module's)."""
    export = load_script("export")
    source = (SCRIPTS / f"{script}.py").read_text()
    needed = export.inlined(source, export.run_modules())[0]
    assert not top_level_names(script) & needed


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_script_imports_from_the_project_only_names_of_the_run_modules(script):
    """Each name from the module that defines it (ruff's F401 sees that it is used)."""
    imports = project_imports(script)
    assert imports and all(module in RUN_MODULES for module, _ in imports), imports
    for module, names in imports:
        assert set(names) <= top_level_names(module), (module, names)


def test_the_run_modules_import_no_script_and_no_run_imports_the_exporter():
    """Each run module imports only run modules before it in `RUN_MODULES` (so an export can inline
    them in that order) and the tensor envs (when --tensor-envs asks), which import nothing of the
    project but each other: the batch's normalization, classic control's base (the MuJoCo tasks);
    the exporter imports none of them."""
    for index, name in enumerate(RUN_MODULES):
        imported = {module for module, _ in project_imports(name)}
        assert imported <= {*RUN_MODULES[:index], "tensor_envs", "mujoco_envs"}, name
    assert project_imports("tensor_wrappers") == []
    wrappers = ("tensor_wrappers", ["NormalizeObservation", "NormalizeReward"])
    assert project_imports("tensor_envs") == [wrappers]
    assert project_imports("mujoco_envs") == [("tensor_envs", ["TensorEnv", "register"])]
    assert project_imports("export") == []
    assert load_script("export").MODULES == RUN_MODULES  # the exporter inlines every run module


@pytest.mark.parametrize("module", MODULES)
def test_every_module_reads_at_a_sitting(module):
    lines = len((SCRIPTS / f"{module}.py").read_text().splitlines())
    assert lines <= 400, f"{module}.py: {lines} lines"


def test_the_run_reads_at_a_sitting():
    node = next(n for n in tree("runs").body if isinstance(n, ast.ClassDef) and n.name == "Run")
    assert node.end_lineno - node.lineno + 1 <= 250


def methods(name, cls):
    """The methods that class `cls` of module `name` defines, but `__init__`."""
    node = next(n for n in tree(name).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {n.name for n in node.body if isinstance(n, ast.FunctionDef)} - {"__init__"}


def classes():
    """(module, class, [(base module, base), ...]) of every class of the run modules."""
    found = []
    for name in MODULES:
        for node in tree(name).body:
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                known = [
                    (module_of(b), b)
                    for b in bases
                    if any(b in top_level_names(m) for m in RUN_MODULES)
                ]
                found.append((name, node.name, known))
    return found


def test_no_class_rewrites_more_than_three_methods_of_another():
    """A run is composed of parts: a class of the run modules that extends another overrides at most
    three of its methods (and its ancestors'), `__init__` aside."""
    overrides = {}
    for name, cls, bases in classes():
        inherited, todo = set(), list(bases)
        while todo:
            module, base = todo.pop()
            inherited |= methods(module, base)
            todo += next(known for m, c, known in classes() if (m, c) == (module, base))
        overrides[cls] = sorted(methods(name, cls) & inherited)
    assert overrides["SeedsRun"] and not [c for c, o in overrides.items() if len(o) > 3], overrides


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_script_with_a_threads_flag_leaves_them_to_the_run(script):
    """`--threads` fixes them, else the Run measures: the script sets none itself."""
    if "threads" in flags_of(script):
        assert "set_num_threads" not in (SCRIPTS / f"{script}.py").read_text()


def fields(name, cls):
    """The fields a dataclass `cls` of script (or module) `name` declares itself."""
    node = next(n for n in tree(name).body if isinstance(n, ast.ClassDef) and n.name == cls)
    own = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
    return own, [base.id for base in node.bases]


def module_of(cls):
    """The run module that defines class `cls`."""
    return next(name for name in RUN_MODULES if cls in top_level_names(name))


def flags_of(script):
    """Every flag of a script: its Args' fields and those of the run modules' classes it extends."""
    flags, bases = fields(script, "Args")
    while bases:
        base = bases.pop()
        own, more = fields(module_of(base), base)
        flags |= own
        bases += more
    return flags


def free_flags_of(script):
    """The `free_flags=(...)` a script passes to its Run, and the Run classes' FREE_FLAGS."""
    free = set()
    for node in ast.walk(tree(script)):
        for keyword in getattr(node, "keywords", []) if isinstance(node, ast.Call) else []:
            if keyword.arg == "free_flags":
                free |= set(ast.literal_eval(keyword.value))
    return free


def test_the_flags_a_resumed_run_may_change_are_flags():
    """`Run.FREE_FLAGS` are run flags (or a flag every script has); each script's own
    `free_flags` are flags of that script."""
    free = set(load_script("runs").Run.FREE_FLAGS)
    every_script = set.intersection(*map(flags_of, ALL_SCRIPTS))
    run_flags = set.union(*(fields(module_of(cls), cls)[0] for cls in ("CudaFlags", "ThreadFlags")))
    assert free <= every_script | run_flags | fields("flags", "RunFlags")[0]
    for script in ALL_SCRIPTS:
        assert free_flags_of(script) <= flags_of(script), script


def eager_of(script):
    """The eager script a script's size is held to: its algorithm's (the recurrent and scaled-out
    PPO scripts grow from PPO continuous's twin or sit beside it, so theirs is its eager one)."""
    stem = script
    for suffix in ("_torchcompile", "_cpu", "_seeds", "_distributed", "_ray", "_async"):
        stem = stem.removesuffix(suffix)
    return stem


# The eager scripts' own caps, CleanRL's size x about 1.25 (CleanRL's SAC 12.9 KB, DQN 9.5 KB, PPO
# continuous 13.6 KB), and the scripts held to a budget of their own above the rule of
# `test_every_script_is_within_its_size_budget`, each with what it adds to its `_cpu` script or
# twin: the seeds scripts their vmap block, GPU path and sweeps; Ray its runners and their cluster;
# the PQN twin its rollout on the device with the tensor envs (the step, its logging, its memory)
# and 0.2 KB for `--reward-scale`, which every PQN script has; the SAC, TD3 and PPO continuous twins
# the same (the step, its episode log, the buffer's device cursor; SAC's and TD3's loop on the
# device beside the host's). Where a clear line needed bytes, its cap grew by them, to the next 100:
# the eager SAC's by 0.1 KB (`LOG_EVERY`, its policy's actions in one line), the SAC, TD3 and PPO
# continuous twins' by 0.3-0.4 KB (`LOG_EVERY`, the make_envs flags by name, the comments that say
# why the rollout step holds the eager policy and why the random phase runs eagerly).
EAGER_CAPS = {"sac_continuous_action": 16_100, "dqn": 12_000, "ppo_continuous_action": 17_000}
OWN_BUDGETS = {
    "dqn_seeds": 21_800,
    "sac_continuous_action_seeds": 24_400,
    "td3_continuous_action_seeds": 22_600,
    "ppo_continuous_action_seeds": 30_400,
    "ppo_continuous_action_ray": 29_000,
    "pqn_torchcompile": 19_900,  # with --reward-scale and its import of TensorEnvFlags
    "sac_continuous_action_torchcompile": 22_100,  # with the device rollout step
    "td3_continuous_action_torchcompile": 20_600,  # with the device rollout step
    "ppo_continuous_action_torchcompile": 21_800,
}


def test_every_script_is_within_its_size_budget():
    """A `_torchcompile` twin at most its eager script + 20%, every other script + 60%."""
    size = {script: len((SCRIPTS / f"{script}.py").read_bytes()) for script in ALL_SCRIPTS}
    over = [f"{s}: {size[s]} bytes, cap {cap}" for s, cap in EAGER_CAPS.items() if size[s] > cap]
    for script in ALL_SCRIPTS:
        eager = eager_of(script)
        if script == eager:
            continue
        factor = 1.2 if script.endswith("_torchcompile") else 1.6
        budget = OWN_BUDGETS.get(script, factor * size[eager])
        if size[script] > budget:
            over.append(f"{script}: {size[script]} bytes, budget {budget:.0f} ({eager} x {factor})")
    assert not over, "\n".join(over)
