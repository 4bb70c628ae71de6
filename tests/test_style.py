"""Readable lines, kept by a tool: every Python file of the repository is formatted by ruff at 100
columns, with no line longer (comments and docstrings too), and passes its lint rules
(pyproject.toml says which, and why). To fix a failure: `ruff format . && ruff check --fix .`."""

import shutil
import subprocess

from conftest import ROOT

RUFF = shutil.which("ruff")  # requirements/requirements-dev.txt pins it


def ruff(*args, cwd=ROOT):
    return subprocess.run([RUFF, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_every_file_is_formatted():
    proc = ruff("format", "--check", ".")
    assert proc.returncode == 0, f"not formatted (run `ruff format .`):\n{proc.stdout}{proc.stderr}"


def test_every_file_passes_the_lint_rules():
    proc = ruff("check", "--output-format", "concise", ".")
    assert proc.returncode == 0, f"ruff check:\n{proc.stdout}{proc.stderr}"


def test_the_checks_fail_on_a_badly_formatted_file(tmp_path):
    """The checks can fail: a long line and an unused import in a file of the project's
    configuration."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "bad.py").write_text("import os\nx = [" + ", ".join(["1"] * 60) + "]\n")
    assert ruff("format", "--check", ".", cwd=tmp_path).returncode == 1
    assert "F401" in ruff("check", "--output-format", "concise", ".", cwd=tmp_path).stdout
