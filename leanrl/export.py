"""One file for people who copy one file: a script of this folder with what it uses of the run
modules beside it inlined, so that the copy imports nothing from the project:

    python leanrl/export.py leanrl/sac_continuous_action.py my_sac.py

The copy reads top down: the script's own lines in their order, then the definitions it imports in
the order its code names them (`Run`, `make_envs`, ...), then the parts those use, level by level,
each class after its base (the few its top level needs as it is imported, the flags its `Args`
extends, come before its own). The inlined code keeps its comments, which explain the lines that
are not obvious, and leaves its docstrings in the modules; the copy's docstring says what it is an
export of, and its usage lines name the copy. A copy run with `--tensor-envs` needs tensor_envs.py,
tensor_wrappers.py and mujoco_envs.py beside it, and says so in one line without. No run imports
this file.
"""

import ast
import os
import sys
import textwrap

FOLDER = os.path.dirname(os.path.abspath(__file__))
# the modules a copy inlines, each after those it imports
MODULES = ("flags", "signals", "folders", "checkpoints", "logs", "runs", "vector_envs")
MODULES += ("threads", "seeds", "atari", "ranks", "optimizers")
# every script's docstring says what it needs, and a copy's what it is
NEEDS = (
    "It imports the run modules beside it in leanrl/; "
    "leanrl/export.py makes a copy that needs none."
)
EXPORTED = "Exported from leanrl/{}.py, with the plumbing it uses inlined."


def fail(message):
    print("error: " + message, file=sys.stderr)
    sys.exit(2)


def statement(node, alias):
    """One import statement for one name of `node`."""
    name = alias.name + (f" as {alias.asname}" if alias.asname else "")
    if isinstance(node, ast.ImportFrom):
        return f"from {node.module} import {name}"
    return f"import {name}"


def binding(alias):
    return (alias.asname or alias.name).split(".")[0]


def uses(nodes):
    """The names that `nodes` use, and the attributes and strings they name: the definitions and
    the methods they may reach (a string, as `hasattr(args, "check_threads")` names a method)."""
    names, attrs = set(), set()
    for n in (n for node in nodes for n in ast.walk(node)):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            attrs.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            attrs.add(n.value)
    return names, attrs


def definition(node, lines, module_defs):
    """A function's or class's source lines, what it uses outside its methods, and its methods: by
    name, their lines (counted from its first) and what each uses. `open`: a class with a base from
    outside the modules, whose methods its base's code may call, keeps them all."""
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
    methods, outside = {}, [node]
    if isinstance(node, ast.ClassDef):
        outside = node.bases + node.keywords + node.decorator_list
        for n in node.body:
            if isinstance(n, ast.FunctionDef):
                start = min([d.lineno for d in n.decorator_list] + [n.lineno]) - first
                methods[n.name] = (start, n.end_lineno - first, *uses([n]))
            else:
                outside.append(n)
    bases = getattr(node, "bases", [])
    names, attrs = uses(outside)
    return dict(
        lines=lines[first - 1 : node.end_lineno],
        names=names,
        attrs=attrs,
        methods=methods,
        needs=sorted(definition_time_names(node) & set(module_defs)),
        open=any(not (isinstance(b, ast.Name) and b.id in module_defs) for b in bases),
    )


def top_level(source, module_defs=()):
    """A module's definitions (name -> `definition`; `module_defs`: the names the run modules
    define) and import bindings (name -> its import statement), leaving out the imports of the run
    modules."""
    lines, defs, imports = source.splitlines(), {}, {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            if getattr(node, "module", None) not in MODULES:
                imports |= {binding(alias): statement(node, alias) for alias in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            defs[node.name] = definition(node, lines, module_defs)
    return defs, imports


def import_time_names(tree):
    """The names a script's top level uses as it is imported: base classes, decorators, defaults,
    module-level statements (not what its functions use when called)."""
    parts = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            parts += node.bases + node.decorator_list
            parts += [n for n in node.body if not isinstance(n, ast.FunctionDef)]
        elif isinstance(node, ast.FunctionDef):
            parts += node.decorator_list + node.args.defaults
        elif not isinstance(node, ast.Import | ast.ImportFrom | ast.If | ast.Expr):
            parts.append(node)
    return {n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)}


def definition_time_names(node):
    """The names a function or class uses as it is defined: its bases, decorators and defaults,
    its class body's and its methods' (not what runs when it is called)."""
    parts = node.decorator_list + getattr(node, "bases", []) + getattr(node, "keywords", [])
    names = set()
    if isinstance(node, ast.FunctionDef):
        parts += [d for d in node.args.defaults + node.args.kw_defaults if d]
    for n in node.body if isinstance(node, ast.ClassDef) else []:
        if isinstance(n, ast.FunctionDef):
            names |= definition_time_names(n)
        else:
            parts.append(n)
    return names | {n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)}


def closure(names, defs):
    """`names` and every definition of `defs` they use outside methods, and those use."""
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in defs and name not in found:
            found.add(name)
            todo += defs[name]["names"]
    return found


def reach(names, attrs, defs):
    """What `names` and `attrs` reach: the definitions of `defs` named, the methods of their classes
    named as attributes (and the special ones, and every method of an open class), and what those
    use in turn. Returns the definitions, the methods as (class, method) and the names used."""
    names, attrs, found, methods = set(names), set(attrs), set(), set()
    while True:
        before = len(found) + len(methods)
        for name in [n for n in defs if n in names and n not in found]:
            found.add(name)
            names |= defs[name]["names"]
            attrs |= defs[name]["attrs"]
        for name in found:
            d = defs[name]
            for method, (_, _, method_names, method_attrs) in d["methods"].items():
                special = method.startswith("__")
                if (name, method) not in methods and (d["open"] or special or method in attrs):
                    methods.add((name, method))
                    names |= method_names
                    attrs |= method_attrs
        if len(found) + len(methods) == before:
            return found, methods, names


def module_definitions(modules):
    """Every definition of `modules` (name -> source), and their import bindings, by name."""
    module_defs = {
        n.name for s in modules.values() for n in ast.parse(s).body if hasattr(n, "name")
    }
    defs, imports = {}, {}
    for source in modules.values():
        module_defs_, module_imports = top_level(source, module_defs)
        defs |= module_defs_
        imports |= module_imports
    return defs, imports


def inlined(script_source, modules):
    """What a copy of `script_source` inlines of `modules` (name -> source): the definitions it
    imports, the methods its code names and what those use, in turn; of the definitions, the ones
    its top level needs as it is imported; and the names they use."""
    defs = module_definitions(modules)[0]
    tree = ast.parse(script_source)
    wanted = [
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module in modules
        for alias in node.names
    ]
    needed, methods, names = reach(wanted, uses([tree])[1], defs)
    return needed, closure(set(wanted) & import_time_names(tree), defs), methods, names


def pruned(name, d, methods):
    """Definition `d`'s source without the methods that `methods` does not hold, and the blank line
    before each."""
    lines, drop = d["lines"], set()
    for method, (start, end, _, _) in d["methods"].items():
        if (name, method) not in methods:
            blank = start > 0 and not lines[start - 1].strip()
            drop |= set(range(start - blank, end + 1))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def without_docstrings(text, fields=False):
    """A definition's source without its docstrings, which stay in the modules (one that is a
    body's only statement stays), nor a dataclass's field docstrings unless `fields` (a flags
    class's: its help, which tyro reads). Its comments stay: they explain what is not obvious."""
    lines = text.splitlines()
    drop = set()
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef | ast.ClassDef) or len(node.body) < 2:
            continue
        fields_too = isinstance(node, ast.ClassDef) and not fields
        for n in node.body if fields_too else node.body[:1]:
            if isinstance(n, ast.Expr) and isinstance(getattr(n.value, "value", None), str):
                drop |= set(range(n.lineno - 1, n.end_lineno))
                if n is node.body[0] and not lines[n.end_lineno].strip():
                    drop.add(n.end_lineno)  # and the blank line after a docstring
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def named_in_order(source):
    """The names that `source` uses, in the order it first names them."""
    found = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(n.id for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))))


def reading_order(first, texts, needs):
    """The definitions of `texts` (name -> source) in the order a reader looks for them: those
    named in `first` (the script's code), in the order it names them, then the ones those name,
    level by level; each after those it `needs` (name -> names) as it is defined (its bases, its
    defaults)."""
    order, queue = [], [name for name in named_in_order(first) if name in texts]
    while queue:
        name = queue.pop(0)
        before = [need for need in needs[name] if need in texts and need not in order]
        if before:
            queue[:0] = [*before, name]
        elif name not in order:
            order.append(name)
            queue += [n for n in named_in_order(texts[name]) if n in texts and n not in order]
    return order


def import_key(line):
    """Where ruff's isort puts an import statement: its section, then `import x` before `from x
    import y`, then by module."""
    words = line.split()
    module = words[1]
    section = 0 if module.split(".")[0] in sys.stdlib_module_names else 1
    return section, words[0] == "from", module.lower(), line


def export(script_source, modules, script_name, copy_name):
    """`script_source` (leanrl/`script_name`.py) as one file, `copy_name`: the definitions of
    `modules` (name -> source) it imports, and those they use, inlined (the ones its top level
    needs before its own definitions, the rest after `main` in `reading_order`), with their
    comments and without their docstrings."""
    defs, imports = module_definitions(modules)
    origin = {name: m for m, source in modules.items() for name in top_level(source)[0]}
    tree = ast.parse(script_source)
    needed, early, methods, used = inlined(script_source, modules)
    usage = f"leanrl/{script_name}.py"
    docstring = tree.body[0]
    lines = script_source.splitlines()
    for i in range(docstring.lineno - 1, docstring.end_lineno):  # its usage lines name the copy
        lines[i] = lines[i].replace(usage, copy_name)
        lines[i] = EXPORTED.format(script_name) if lines[i] == NEEDS else lines[i]
    own_imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    kept = [
        "\n".join(lines[n.lineno - 1 : n.end_lineno])
        for n in own_imports
        if getattr(n, "module", None) not in modules
    ]
    bound = {binding(alias) for node in own_imports for alias in node.names}
    kept += [imports[name] for name in sorted(used & set(imports) - bound)]
    kept = sorted(dict.fromkeys(kept), key=import_key)
    sections = [[line for line in kept if import_key(line)[0] == s] for s in (0, 1)]
    first_def = next(n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef))
    first_def = min([d.lineno for d in first_def.decorator_list] + [first_def.lineno])
    guard = next(n.lineno for n in tree.body if isinstance(n, ast.If))
    start = own_imports[0].lineno
    names = ", ".join(f"{m}.py" for m in modules if m in {origin[name] for name in needed})
    order = "what the script uses, in the order it names it, then what that uses"
    title = textwrap.wrap(f"The run plumbing, from leanrl/ ({names}): {order}", 98)
    banner = f"# {'=' * 98}\n" + "\n".join(f"# {line}" for line in title)
    in_order = [name for name in defs if name in needed]
    texts = {
        name: without_docstrings(pruned(name, defs[name], methods), fields=name in early)
        for name in in_order
    }
    before = [texts[name] for name in in_order if name in early]
    late = {name: text for name, text in texts.items() if name not in early}
    needs = {name: defs[name]["needs"] for name in late}
    named = "\n\n".join([script_source, *before])  # the script, and the flags its Args extends
    after = [late[name] for name in reading_order(named, late, needs)]
    head = "\n".join(lines[: start - 1]).rstrip()
    parts = [
        head + "\n\n" + "\n\n".join("\n".join(section) for section in sections if section),
        "\n\n\n".join(before),
        "\n".join(lines[first_def - 1 : guard - 1]).rstrip(),
        banner + "\n\n\n" + "\n\n\n".join(after) if after else "",
        "\n".join(lines[guard - 1 :]),
    ]
    return "\n\n\n".join(part for part in parts if part) + "\n"


def run_modules(folder=FOLDER):
    """Each run module's source, by name."""
    modules = {}
    for name in MODULES:
        with open(os.path.join(folder, f"{name}.py")) as f:
            modules[name] = f.read()
    return modules


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        fail("usage: python leanrl/export.py SCRIPT [OUT] (OUT: standard output)")
    script, out = sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None
    try:
        with open(script) as f:
            script_source = f.read()
    except OSError as e:
        fail(f"cannot read {script}: {e.strerror}")
    name = os.path.splitext(os.path.basename(script))[0]
    copy_name = os.path.basename(out) if out else f"{name}.py"
    text = export(script_source, run_modules(), name, copy_name)
    if out is None:
        sys.stdout.write(text)
    else:
        with open(out, "w") as f:
            f.write(text)
