"""The run plumbing exists once, in leanrl/runs.py, and every script is its algorithm plus named
calls into it: no script defines a name of the module it uses, imports anything of the project but
the module (and only names it has), or sets threads it has a flag for; the module imports no
script; the flags a resumed run may change are flags of the scripts; every script stays within its
size budget. Scripts are found on disk, so a new one is held to these at once. Parsing only:
~1 s."""

import ast
import functools

import pytest
from conftest import ALL_SCRIPTS, SCRIPTS, load_script

MODULE = "runs"


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
    script's definitions and the module's it uses, has each name once (a script's own `make_envs`
    for envpool is its own as long as nothing it imports uses the module's)."""
    runs = load_script(MODULE)
    sources = [(SCRIPTS / f"{name}.py").read_text() for name in (script, MODULE)]
    needed, _ = runs.inlined(*sources)
    assert not top_level_names(script) & needed


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_script_imports_from_the_project_only_names_of_the_run_module(script):
    imports = project_imports(script)
    assert [module for module, _ in imports] == [MODULE], imports
    assert set(imports[0][1]) <= top_level_names(MODULE)


def test_the_run_module_imports_no_script():
    assert project_imports(MODULE) == []


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


def flags_of(script):
    """Every flag of a script: its Args' fields and those of the run module's classes it extends."""
    flags, bases = fields(script, "Args")
    while bases:
        own, more = fields(MODULE, bases.pop())
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
    """`Run.FREE_FLAGS` are run flags (or a flag every script has); each script's own `free_flags`
    are flags of that script."""
    node = next(n for n in tree(MODULE).body if isinstance(n, ast.ClassDef) and n.name == "Run")
    free = set()
    for statement in node.body:
        if isinstance(statement, ast.Assign | ast.AugAssign) and "FREE_FLAGS" in ast.unparse(
            statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
        ):
            free |= set(ast.literal_eval(statement.value))
    every_script = set.intersection(*map(flags_of, ALL_SCRIPTS))
    run_flags = set.union(*(fields(MODULE, cls)[0] for cls in ("CudaFlags", "ThreadFlags")))
    assert free <= every_script | run_flags | fields(MODULE, "RunFlags")[0]
    for script in ALL_SCRIPTS:
        assert free_flags_of(script) <= flags_of(script), script
