"""One file for people who copy one file: `python leanrl/export.py SCRIPT OUT` writes the script
with the parts of the run modules it uses inlined. Every script's copy holds the script's own lines
in their order (its usage lines naming the copy), then what it uses in the order a reader looks for
it, with the comments those lines have in the modules; it imports nothing from the project, holds
no definition it does not use, passes the project's ruff rules and format, inlines no more
plumbing than its cap, and imports alone, in a Python that cannot see leanrl/; the eager scripts'
copies train alone from an empty folder, as their scripts do. That a copy trains, stops and
resumes as the script does is test_resume's (its `-exported` cases, one script of each family)."""

import ast
import difflib
import io
import os
import shutil
import subprocess
import sys
import tokenize

import pytest
import torch
from conftest import (
    ALL_SCRIPTS,
    ROOT,
    SCRIPTS,
    assert_same_state,
    assert_user_error,
    load_script,
    run_script,
    script_env,
    summary,
)

from benchmarks.scripts import RUN_MODULES

RUFF = shutil.which("ruff")  # requirements/requirements-dev.txt pins it
PENDULUM_SMOKE = ("--env-id", "Pendulum-v1", "--total-timesteps", 300, "--learning-starts", 200)
PENDULUM_SMOKE += ("--batch-size", 32)
EAGER = ("sac_continuous_action", "dqn", "td3_continuous_action", "pqn", "ppo_continuous_action")


def imported_modules(source):
    tree = ast.parse(source)
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return names + [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_copy_is_the_script_plus_the_plumbing_it_uses(script, exported):
    """Every line of the script is in its copy, in order, but its imports of the run modules (its
    usage lines naming the copy); what the copy adds is the run modules' text."""
    export = load_script("export")
    own = (SCRIPTS / f"{script}.py").read_text().replace(f"leanrl/{script}.py", f"{script}.py")
    own = own.replace(export.NEEDS, export.EXPORTED.format(script)).splitlines()
    copy = (exported / f"{script}.py").read_text()
    assert not set(RUN_MODULES) & set(imported_modules(copy))
    for node in ast.parse("\n".join(own)).body:  # the imports of the run modules go
        if isinstance(node, ast.ImportFrom) and node.module in RUN_MODULES:
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
    modules = "\n".join((SCRIPTS / f"{name}.py").read_text() for name in RUN_MODULES)
    added = [
        line
        for tag, _, _, j1, j2 in matcher.get_opcodes()
        if tag in ("insert", "replace")
        for line in copy.splitlines()[j1:j2]
    ]
    assert all(line in modules or line.startswith("# ") or not line.strip() for line in added)
    assert f"leanrl/{script}.py" not in copy.replace(export.EXPORTED.format(script), "")


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_script_says_it_needs_the_run_modules_and_its_copy_what_it_is(script, exported):
    export = load_script("export")
    docstring = ast.get_docstring(ast.parse((SCRIPTS / f"{script}.py").read_text()), clean=False)
    assert export.NEEDS in docstring.splitlines()
    copy = ast.get_docstring(ast.parse((exported / f"{script}.py").read_text()), clean=False)
    assert export.EXPORTED.format(script) in copy.splitlines() and export.NEEDS not in copy


def named(nodes):
    """The names, attributes and strings (`hasattr(args, "check_threads")`) that `nodes` use."""
    found = set()
    for n in (n for node in nodes for n in ast.walk(node)):
        if isinstance(n, ast.Name | ast.Attribute):
            found.add(n.id if isinstance(n, ast.Name) else n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            found.add(n.value)
    return found


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_copy_holds_no_function_or_method_that_nothing_in_it_reaches(script, exported):
    """Each function, class and method of a copy that came from the run modules is named by the
    script's own code or by a definition or method so reached: a function or class by its name, a
    method as an attribute (or a string, as `hasattr` takes it). A special method (`__init__`)
    is reached with its class, and every method of a class whose base is not the copy's (a
    library's code may call them)."""
    copy = ast.parse((exported / f"{script}.py").read_text())
    own = {
        n.name for n in ast.parse((SCRIPTS / f"{script}.py").read_text()).body if hasattr(n, "name")
    }
    defs = {n.name: n for n in copy.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    methods = {
        (cls.name, m.name): m
        for cls in defs.values()
        if isinstance(cls, ast.ClassDef)
        for m in cls.body
        if isinstance(m, ast.FunctionDef)
    }
    used = named([n for n in copy.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)])
    used |= named([defs[name] for name in own])
    reached = set(own)
    while True:
        before = len(reached)
        for name, node in defs.items():
            if name in used and name not in reached:
                reached.add(name)
                outside = [n for n in ast.iter_child_nodes(node) if n not in node.body]
                outside += [n for n in node.body if not isinstance(n, ast.FunctionDef)]
                used |= named(outside if isinstance(node, ast.ClassDef) else [node])
        for (cls, name), node in methods.items():
            base_outside = any(
                not isinstance(b, ast.Name) or b.id not in defs for b in defs[cls].bases
            )
            wanted = name in used or name.startswith("__") or base_outside
            if cls in reached and (cls, name) not in reached and wanted:
                reached.add((cls, name))
                used |= named([node])
        if len(reached) == before:
            break
    unreached = (set(defs) | {m for m in methods if m[0] not in own}) - reached
    assert not unreached, sorted(unreached, key=str)


def test_every_copy_passes_the_projects_ruff_rules_and_format(exported):
    """The project's ruff configuration (import order included) and its format, on every copy."""
    copies = [str(exported / f"{script}.py") for script in ALL_SCRIPTS]
    config = ["--config", str(ROOT / "pyproject.toml")]
    for command in (["check", "--output-format", "concise"], ["format", "--check"]):
        proc = subprocess.run(
            [RUFF, *command, *config, *copies], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


# The bytes of each copy's inlined plumbing (its code without comments, docstrings and blank lines)
# at most these: the run modules hold it once, and it must not grow in every copy. At 5887bc3 the
# eager SAC's, DQN's, PQN's and TD3's was 27,023 bytes (PPO continuous's 27,302, a seeds script's
# 44,337-45,238). Issue 95 added 2.1 KB to a single run's: the checkpoint defined once
# (`Checkpoint`, its format and its check, 0.8 KB), one `Run.finish` for one run or N members
# (1.0 KB; a seeds copy's lost as much, `SeedsRun.finish` is 0.9 KB shorter) and `Run.__init__`'s
# inputs made visible (`named_folder`, `seed_generators`, 0.2 KB). The copies keep their comments
# (2 KB in the eager SAC's), which these do not count.
PLUMBING = {
    "dqn": 29_200,
    "dqn_cpu": 36_000,
    "dqn_seeds": 46_500,
    "dqn_torchcompile": 29_200,
    "ppo_atari_envpool": 27_200,
    "ppo_atari_envpool_async": 27_300,
    "ppo_atari_envpool_torchcompile": 27_200,
    "ppo_continuous_action": 29_400,
    "ppo_continuous_action_cpu": 36_300,
    "ppo_continuous_action_distributed": 30_300,
    "ppo_continuous_action_ray": 29_000,
    "ppo_continuous_action_seeds": 40_900,
    "ppo_continuous_action_torchcompile": 31_100,
    "ppo_lstm": 31_600,
    "ppo_lstm_torchcompile": 31_600,
    "ppo_mingru": 31_600,
    "ppo_mingru_torchcompile": 31_600,
    "pqn": 29_200,
    "pqn_atari_envpool": 27_200,
    "pqn_atari_envpool_torchcompile": 27_200,
    "pqn_cpu": 35_900,
    "pqn_torchcompile": 29_600,
    "sac_continuous_action": 29_200,
    "sac_continuous_action_cpu": 36_200,
    "sac_continuous_action_seeds": 45_600,
    "sac_continuous_action_torchcompile": 30_800,
    "td3_continuous_action": 29_200,
    "td3_continuous_action_cpu": 36_200,
    "td3_continuous_action_seeds": 45_600,
    "td3_continuous_action_torchcompile": 30_800,
}


def code(source):
    """`source` (a module's definitions) without its comments, docstrings and blank lines."""
    lines, drop, cut = source.splitlines(), set(), {}
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and len(body) > 1:
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                drop |= set(range(body[0].lineno - 1, body[0].end_lineno))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            cut[row - 1] = col
    kept = [line[: cut.get(i, len(line))].rstrip() for i, line in enumerate(lines)]
    return "\n".join(line for i, line in enumerate(kept) if i not in drop and line.strip())


def inlined_definitions(script, copy):
    """The definitions of `copy` that came from the run modules (those `script` does not define),
    as nodes, in the copy's order."""
    own = {
        n.name for n in ast.parse((SCRIPTS / f"{script}.py").read_text()).body if hasattr(n, "name")
    }
    return [
        n
        for n in ast.parse(copy).body
        if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name not in own
    ]


def source_of(node, text):
    """The lines of definition `node` of `text`, its decorators with it."""
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
    return "\n".join(text.splitlines()[first - 1 : node.end_lineno])


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_copys_plumbing_does_not_grow(script, exported):
    copy = (exported / f"{script}.py").read_text()
    nodes = inlined_definitions(script, copy)
    size = sum(len(code(source_of(node, copy))) for node in nodes)
    assert 20_000 < size <= PLUMBING[script], f"{script}: {size} bytes of plumbing"


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_a_copy_reads_top_down(script, exported):
    """After the script's own lines come the definitions its code names, each class after its
    base, then the ones only they use: a reader meets `Run` and `make_envs` first. (The flags its
    `Args` extends come before the script, which needs them as it is imported.)"""
    copy = (exported / f"{script}.py").read_text()
    source = (SCRIPTS / f"{script}.py").read_text()
    main = next(n.lineno for n in ast.parse(copy).body if getattr(n, "name", None) == "main")
    after = [n for n in inlined_definitions(script, copy) if n.lineno > main]
    named = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    named |= {name for n in after if n.name in named for name in definition_time_names(n)}
    first = [n.name in named for n in after]
    assert after and first[0] and first == sorted(first, reverse=True), [n.name for n in after]


def definition_time_names(node):
    """The names a definition's bases, decorators and defaults use: what must come before it."""
    methods = [n for n in getattr(node, "body", []) if isinstance(n, ast.FunctionDef)]
    parts = [*getattr(node, "bases", []), *node.decorator_list]
    parts += [
        d for n in [node, *methods] if isinstance(n, ast.FunctionDef) for d in n.args.defaults
    ]
    return {n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)}


def test_a_sac_copy_has_run_first_after_the_script_within_500_lines(exported):
    lines = (exported / "sac_continuous_action.py").read_text().splitlines()
    definitions = [i for i, line in enumerate(lines, 1) if line.startswith(("def ", "class "))]
    run = lines.index("class Run:") + 1
    assert definitions[definitions.index(run) - 1] == lines.index("def check_args(args):") + 1
    assert run < 500


def comments(source):
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [token.string for token in tokens if token.type == tokenize.COMMENT]


def test_a_copy_keeps_the_comments_of_the_lines_it_inlines(exported):
    """Each definition a copy inlines has every comment its module gives the lines it keeps (those
    of a method it leaves out go with it): they say what is not obvious, as why
    `__import__("torch._dynamo")` comes first."""
    modules = [(SCRIPTS / f"{name}.py").read_text() for name in RUN_MODULES]
    defined = {
        node.name: (node, source)
        for source in modules
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
    }
    for script in ALL_SCRIPTS:
        copy = (exported / f"{script}.py").read_text()
        for node in inlined_definitions(script, copy):
            original, source = defined[node.name]
            kept = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            methods = original.body if isinstance(original, ast.ClassDef) else []
            left_out = [n for n in methods if isinstance(n, ast.FunctionDef) and n.name not in kept]
            lines = source_of(original, source).splitlines()
            start = min([d.lineno for d in original.decorator_list] + [original.lineno])
            for method in left_out:
                first = min([d.lineno for d in method.decorator_list] + [method.lineno])
                lines[first - start : method.end_lineno - start + 1] = [""] * (
                    method.end_lineno - first + 1
                )
            assert comments(source_of(node, copy)) == comments("\n".join(lines)), (script, node)
    assert "# that crashes the process, so it comes first" in copy


def test_the_copies_import_in_a_python_that_cannot_see_leanrl(exported, tmp_path):
    """Each copy imports (nothing runs at import) with only its own folder on the path; no run
    module is ever imported."""
    check = f"""
import importlib.util, sys
sys.path = [p for p in sys.path if "leanrl" not in p and p not in ("", {str(ROOT)!r})]
for name in {ALL_SCRIPTS!r}:
    spec = importlib.util.spec_from_file_location(name, {str(exported)!r} + f"/{{name}}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    assert callable(module.main) and not set({RUN_MODULES!r}) & set(sys.modules), name
print("imported", len({ALL_SCRIPTS!r}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["imported", str(len(ALL_SCRIPTS))]


# a few hundred steps: every step of the loop runs, the run ends with a SUMMARY
TINY = {
    "sac_continuous_action": PENDULUM_SMOKE,
    "td3_continuous_action": PENDULUM_SMOKE,
    "dqn": ("--total-timesteps", 300, "--learning-starts", 200, "--train-frequency", 1),
    "pqn": ("--total-timesteps", 512, "--num-envs", 4, "--num-steps", 32),
    "ppo_continuous_action": ("--env-id", "Pendulum-v1", "--total-timesteps", 256, "--num-envs", 1)
    + ("--num-steps", 128),
}


@pytest.mark.parametrize("script", EAGER)
def test_an_eager_copy_trains_alone_as_the_script_does(script, exported, tmp_path):
    """The copy alone in a folder, a Python whose path has no leanrl/ and no checkout: it trains,
    to the script's episodes, returns and saved model at the same seed, bit for bit."""
    alone, beside = tmp_path / "alone", tmp_path / "script"
    alone.mkdir(), beside.mkdir()
    shutil.copy(exported / f"{script}.py", alone)
    env = script_env()
    env.pop("PYTHONPATH", None)
    flags = [*map(str, TINY[script]), "--checkpoint-minutes", "0", "--save-model"]
    proc = subprocess.run(
        [sys.executable, f"{script}.py", *flags],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=alone,
        env=env,
    )
    copied, trained = summary(proc), summary(run_script(script, *flags, cwd=beside))
    assert copied["total_timesteps"] == trained["total_timesteps"] > 0
    assert sorted(os.listdir(alone)) == sorted([f"{script}.py", "runs"])
    returns = [[r for _, _, r in result["curve"]] for result in (copied, trained)]
    assert returns[0] == returns[1] and copied["return_mean"] == trained["return_mean"]
    models = [torch.load(r["model_file"], weights_only=True)["model"] for r in (copied, trained)]
    assert_same_state(models[0], models[1], "model")


def test_the_command_writes_the_copy_and_refuses_bad_usage(exported, tmp_path):
    export = [sys.executable, str(SCRIPTS / "export.py")]
    out = tmp_path / "dqn.py"
    proc = subprocess.run([*export, str(SCRIPTS / "dqn.py"), str(out)], timeout=120)
    assert proc.returncode == 0 and out.read_text() == (exported / "dqn.py").read_text()
    named = subprocess.run([*export, str(SCRIPTS / "dqn.py"), str(tmp_path / "my_dqn.py")])
    assert named.returncode == 0 and "python my_dqn.py" in (tmp_path / "my_dqn.py").read_text()
    usage = subprocess.run(export, capture_output=True, text=True, timeout=120)
    assert_user_error(usage, "usage: python leanrl/export.py SCRIPT")
    missing = subprocess.run([*export, "nothing.py"], capture_output=True, text=True, timeout=120)
    assert_user_error(missing, "cannot read nothing.py")
