"""The requirements files, read without a network: every line parses, every package is pinned to
one version, torch in every file, and on each Python that pyproject.toml's `requires-python` admits
(3.11 to 3.14) exactly one distribution of the `pygame` module is pinned: pygame 2.6.1 below 3.14,
and from 3.14 on pygame-ce 2.5.8, which has a cp314 wheel where pygame has none.

Whether every pin has a wheel for a Python is the index's to say: resolve without installing, e.g.
  pip install --dry-run --ignore-installed --only-binary :all: --python-version 3.14 \\
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --target /tmp/t \\
    -r requirements/requirements-dev.txt
pip evaluates markers for the Python it runs on, not for --python-version, and it downloads each
wheel whose metadata the index does not serve on its own (torch's is 0.5 GB)."""

import tomllib

import pytest
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REQUIREMENTS = ROOT / "requirements"
FILES = sorted(path.name for path in REQUIREMENTS.glob("*.txt"))
PYTHONS = ("3.11", "3.12", "3.13", "3.14")
# the one distribution of the `pygame` module each Python gets
PYGAME = {python: "pygame==2.6.1" for python in PYTHONS[:-1]} | {"3.14": "pygame-ce==2.5.8"}


def read(name, python, seen=()):
    """The requirements of `requirements/<name>` and of the files it includes (`-r`) whose
    markers hold on `python`: a list of Requirement, markers dropped."""
    assert name not in seen, f"{name} includes itself"
    environment = {"python_version": python, "python_full_version": f"{python}.0"}
    requirements = []
    for line in (REQUIREMENTS / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            requirements += read(line[3:].strip(), python, (*seen, name))
        elif line:
            assert not line.startswith("-"), f"{name}: an option other than -r: {line!r}"
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                requirement.marker = None
                requirements.append(requirement)
    return requirements


def pins(name, python):
    """{package: version} of `name` on `python`; fails where a package is not pinned with `==`,
    or is pinned twice to different versions."""
    pinned = {}
    for requirement in read(name, python):
        (specifier, *more) = requirement.specifier
        assert not more and specifier.operator == "==", f"{name}: {requirement} is not pinned"
        version = pinned.setdefault(requirement.name, specifier.version)
        assert version == specifier.version, f"{name}: {requirement.name} {version} and {specifier}"
    return pinned


def test_requires_python_admits_the_pythons_the_pins_are_checked_on():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    admitted = SpecifierSet(project["requires-python"])
    pythons = ("3.10", *PYTHONS, "3.15")
    assert [python for python in pythons if Version(python) in admitted] == list(PYTHONS)


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", FILES)
def test_every_file_pins_every_package_and_torch(name, python):
    assert pins(name, python)["torch"] == "2.13.0"


@pytest.mark.parametrize("python", PYTHONS)
def test_each_python_gets_one_pygame(python):
    pinned = pins("requirements.txt", python)
    got = [f"{name}=={pinned[name]}" for name in ("pygame", "pygame-ce") if name in pinned]
    assert got == [PYGAME[python]]


@pytest.mark.parametrize("python", PYTHONS)
def test_the_dev_file_holds_every_other_file(python):
    dev = pins("requirements-dev.txt", python)
    for name in FILES:
        assert pins(name, python).items() <= dev.items(), name
