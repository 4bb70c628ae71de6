"""One file for people who copy one file: `python leanrl/runs.py export SCRIPT OUT` writes the
script with the parts of the run module and the optimizers it uses inlined. Every script's copy
holds the script's own lines in their order, imports nothing from the project, defines every name
it uses and imports, alone, in a Python that cannot see leanrl/. That a copy trains, stops and
resumes as the script does is test_resume's (its `-exported` cases, one script of each family)."""

import ast
import difflib
import shutil
import subprocess
import sys

import pytest
from conftest import ALL_SCRIPTS, ROOT, SCRIPTS, assert_user_error

RUFF = shutil.which("ruff")


def imported_modules(source):
    tree = ast.parse(source)
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return names + [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_copy_is_the_script_plus_the_plumbing_it_uses(script, exported):
    """Every line of the script is in its copy, in order, but its imports of the run module and the
    optimizers; what the copy adds is their text."""
    own = (SCRIPTS / f"{script}.py").read_text().splitlines()
    copy = (exported / f"{script}.py").read_text()
    assert not {"runs", "optimizers"} & set(imported_modules(copy))
    for node in ast.parse("\n".join(own)).body:  # the imports of the project's modules go
        if isinstance(node, ast.ImportFrom) and node.module in ("runs", "optimizers"):
            own[node.lineno - 1 : node.end_lineno] = [None] * (node.end_lineno - node.lineno + 1)
    own_lines = [line for line in own if line is not None]
    matcher = difflib.SequenceMatcher(None, own_lines, copy.splitlines(), autojunk=False)
    dropped = [
        line
        for tag, i1, i2, _, _ in matcher.get_opcodes()
        if tag in ("delete", "replace")
        for line in own_lines[i1:i2]
    ]
    assert not [line for line in dropped if line.strip()], dropped
    module = (SCRIPTS / "runs.py").read_text() + (SCRIPTS / "optimizers.py").read_text()
    added = [
        line
        for tag, _, _, j1, j2 in matcher.get_opcodes()
        if tag in ("insert", "replace")
        for line in copy.splitlines()[j1:j2]
    ]
    assert all(line in module or line.startswith("# ") or not line.strip() for line in added)


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed (requirements-dev.txt pins it)")
def test_every_copy_defines_what_it_uses(exported):
    """pyflakes' checks on the copies: no undefined name, no unused or redefined import."""
    proc = subprocess.run(
        [RUFF, "check", "--isolated", "--select", "F401,F811,F821", "--output-format", "concise"]
        + [str(exported / f"{script}.py") for script in ALL_SCRIPTS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_copies_import_in_a_python_that_cannot_see_leanrl(exported, tmp_path):
    """Each copy imports (nothing runs at import) with only its own folder on the path; the run
    module and the optimizers are never imported."""
    check = f"""
import importlib.util, sys
sys.path = [p for p in sys.path if "leanrl" not in p and p not in ("", {str(ROOT)!r})]
for name in {ALL_SCRIPTS!r}:
    spec = importlib.util.spec_from_file_location(name, {str(exported)!r} + f"/{{name}}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    assert callable(module.main) and not {{"runs", "optimizers"}} & set(sys.modules), name
print("imported", len({ALL_SCRIPTS!r}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["imported", str(len(ALL_SCRIPTS))]


def test_the_command_writes_the_copy_and_refuses_bad_usage(exported, tmp_path):
    runs = [sys.executable, str(SCRIPTS / "runs.py"), "export"]
    out = tmp_path / "dqn.py"
    proc = subprocess.run([*runs, str(SCRIPTS / "dqn.py"), str(out)], timeout=120)
    assert proc.returncode == 0 and out.read_text() == (exported / "dqn.py").read_text()
    usage = subprocess.run(runs, capture_output=True, text=True, timeout=120)
    assert_user_error(usage, "usage: python leanrl/runs.py export SCRIPT")
    missing = subprocess.run([*runs, "nothing.py"], capture_output=True, text=True, timeout=120)
    assert_user_error(missing, "cannot read nothing.py")
