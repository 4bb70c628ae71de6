"""The documentation points at what exists and shows what the results say: every relative link of
README.md, CONTRIBUTING.md, docs/*.md and docs/notes/*.md names a file (and, with `#anchor`, a
heading by GitHub's slug rules); every command in a code block names scripts, benchmark modules,
shell scripts and requirements files that exist; tables and figures are those of the results under
benchmarks/results/ that made them; docs/ holds no result file; no page refers to the issues. The
checker is tested on made-up pages, so that each check is shown able to fail."""

import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from benchmarks import report
from benchmarks.learning import short_markdown
from benchmarks.studies import seeds

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
QUICK_RESULTS = RESULTS / "run" / "quick.json"
LEARNING_REPORT = RESULTS / "learning"
# under benchmarks/results/: each results file, how its table is written, and the page that shows it
SEEDS_NOTE = ROOT / "docs" / "notes" / "seeds-cpu.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
SEEDS_RESULTS = {
    f"seeds/{name}.json": (seeds.markdown, SEEDS_NOTE)
    for name in ("n1_3_8_loaded_cpu", "sac_n8_idle_cpu", "td3_n8_idle_cpu")
    + ("dqn_n8_idle_family26_cpu", "ppo_continuous_n8_idle_cpu", "dqn_n8_idle_family25_cpu")
}
SEEDS_RESULTS["seeds/gpu_proxy_cpu.json"] = (seeds.proxy_markdown, SEEDS_NOTE)
# CleanRL's TD3 run here beside ours, in the notes
TD3_WINDOWS = ROOT / "benchmarks" / "results" / "learning" / "td3_cleanrl_hopper.json"
TD3_NOTE = ROOT / "docs" / "notes" / "td3-hopper.md"

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+).+?\1")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]"
    r"\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?(?:\s+\"[^\"]*\")?\s*\)"
)
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]*)\"", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"<[a-z]+\b[^>]*?\b(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:\s+(.*?))?(?:\s+#+)?\s*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")  # GitHub's line anchors into a source file

SCRIPT = re.compile(r"(?:^|[\s'\"=(])(?:\./)?leanrl/(\w+)\.py\b")
BENCHMARK = re.compile(r"\bpython3?\s+-m\s+benchmarks\.([\w.]+)")
SHELL_SCRIPT = re.compile(r"\bbash\s+((?:\./)?[\w./-]+\.sh)\b")
REQUIREMENTS = re.compile(r"\s-r\s+([\w./-]+\.txt)\b")
ISSUE = re.compile(
    r"\b(?:the|an|this|that|its|our) issue\b|\bissue'?s? #?\d+|\bissue's\b", re.IGNORECASE
)

# the README's names of the algorithms and variants of benchmarks/registry.py
README_ALGOS = {"SAC": "sac", "TD3": "td3", "DQN": "dqn", "PPO continuous": "ppo_continuous_action"}
README_ALGOS |= {
    "PQN": "pqn",
    "PPO LSTM": "ppo_lstm",
    "PPO minGRU": "ppo_mingru",
    "PPO Atari": "ppo_atari_envpool",
}
README_VARIANTS = {"`_torchcompile`": "torchcompile", "`_torchcompile --compile`": "compile"}
README_VARIANTS["`_cpu`"] = "cpu"
# a speed table's columns that are figures of the eager row; every other column is a variant's ratio
# to eager
EAGER_COLUMNS = {"eager sps": ("sps_median", "{:.0f}"), "env-only sps": ("env_only_sps", "{:.0f}")}


def doc_files(root=ROOT):
    """The README, CONTRIBUTING, docs/*.md and docs/notes/*.md."""
    docs = root / "docs"
    pages = [*sorted(docs.glob("*.md")), *sorted((docs / "notes").glob("*.md"))]
    return [root / "README.md", root / "CONTRIBUTING.md", *pages]


def split_fences(text):
    """(prose with every fenced code block blanked line for line, the blocks' texts)."""
    prose, blocks, block, fence = [], [], [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence, block = match.group(1), []
            prose.append("")
        elif (
            fence and match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence)
        ):
            fence = None
            blocks.append("\n".join(block))
            prose.append("")
        elif fence is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    if fence is not None:  # an unclosed fence runs to the end of the page
        blocks.append("\n".join(block))
    return "\n".join(prose), blocks


def heading_text(markdown):
    """The text GitHub renders for a heading: links and images by their text, no code or tags."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("`", "").replace("*", "")


def slug(heading):
    """GitHub's anchor: lowercase, punctuation but '_' and '-' dropped, each space a '-'."""
    return re.sub(r"[^\w\- ]", "", heading_text(heading).strip().lower()).replace(" ", "-")


def anchors(text):
    """Headings' slugs, repeated ones numbered ('x', 'x-1'), and HTML elements' ids and names."""
    prose, _ = split_fences(HTML_COMMENT.sub("", text))
    lines = prose.splitlines()
    headings = []
    for i, line in enumerate(lines):
        atx = ATX_HEADING.match(line)
        if atx:
            headings.append(atx.group(1) or "")
        elif (
            line.strip()
            and i + 1 < len(lines)
            and SETEXT_UNDERLINE.match(lines[i + 1])
            and not line.lstrip().startswith(("|", "-", "*", ">"))
        ):
            headings.append(line.strip())
    seen, found = {}, set(HTML_ANCHOR.findall(prose))
    for heading in headings:
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_targets(text):
    """Every link's and image's target in the prose (not in code or HTML comments)."""
    prose, _ = split_fences(HTML_COMMENT.sub("", text))
    prose = INLINE_CODE.sub("", prose)
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose) + HTML_LINK.findall(prose)


def link_problems(page, root=ROOT):
    """One line per relative link leaving `root`, or naming a missing file or heading."""
    problems = []
    for target in link_targets(page.read_text()):
        if not target or SCHEME.match(target):
            continue  # empty, or a URL: http(s), mailto
        path_part, _, anchor = target.partition("#")
        path = (page.parent / unquote(path_part)).resolve() if path_part else page.resolve()
        where = f"{page.relative_to(root)}: link {target!r}"
        if not path.is_relative_to(root.resolve()):
            problems.append(f"{where} leaves the repository")
        elif not path.exists():
            problems.append(f"{where}: no file {path.relative_to(root.resolve())}")
        elif anchor and path.suffix.lower() == ".md":
            if unquote(anchor) not in anchors(path.read_text()):
                problems.append(f"{where}: no heading with the anchor #{anchor} in {path.name}")
        elif anchor and not (path.is_file() and LINE_ANCHOR.match(anchor)):
            problems.append(
                f"{where}: #{anchor} can only point into a markdown page (or #L<n> into a file)"
            )
    return problems


def command_problems(page, root=ROOT):
    """One line per script, benchmark module, shell script or requirements file a command names
    that does not exist."""
    problems = []
    _, blocks = split_fences(page.read_text())
    for block in blocks:
        for name in SCRIPT.findall(block):
            if not (root / "leanrl" / f"{name}.py").is_file():
                problems.append(
                    f"{page.name}: a command runs leanrl/{name}.py, which does not exist"
                )
        for module in BENCHMARK.findall(block):
            parts = module.rstrip(".").split(".")
            base = root / "benchmarks" / Path(*parts)
            if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
                problems.append(
                    f"{page.name}: a command runs `python -m benchmarks.{module}`, which does not "
                    "exist"
                )
        for path in SHELL_SCRIPT.findall(block) + REQUIREMENTS.findall(block):
            if not (root / path).is_file():
                problems.append(f"{page.name}: a command names {path}, which does not exist")
    return problems


def tables(text):
    """Every markdown table in the prose: (header cells, body rows of cells)."""
    prose, _ = split_fences(text)
    found, rows = [], None
    for line in prose.splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if rows is None:
            rows = []
            found.append((cells, rows))
        elif not set(line) <= set("|-: "):
            rows.append(cells)
    return found


def speed_table_problems(text, runs):
    """One line per cell of a README speed table that is not the figure of `runs`."""
    rows = {(r["algo"], r["variant"]): r for run in runs for r in run["table"]}
    problems = []
    for header, body in tables(text):
        if header[:2] != ["algorithm", "eager sps"]:
            continue
        for cells in body:
            algo = README_ALGOS.get(cells[0])
            for name, cell in zip(header[1:], cells[1:]):
                variant = "eager" if name in EAGER_COLUMNS else README_VARIANTS.get(name)
                row = rows.get((algo, variant))
                if row is None:
                    problems.append(f"{cells[0]} {name}: no such row in the results")
                    continue
                key, form = EAGER_COLUMNS.get(name, ("vs_eager", "{:.2f}x"))
                want = form.format(row[key])
                if cell.strip("*") != want:
                    problems.append(f"{cells[0]} {name}: the page says {cell}, the results {want}")
    return problems


def missing_lines(text, lines):
    """The lines of `lines` (blank ones aside) that the page does not have, each whole."""
    page = set(text.splitlines())
    return [line for line in lines if line.strip() and line not in page]


def quick_table_lines(run):
    """The table lines `benchmarks.run` prints for a run: its header and its rows."""
    lines = report.markdown(run["table"], run["machine"], run["settings"]).splitlines()
    return lines[lines.index(next(line for line in lines if line.startswith("| algo |"))) :]


def issue_mentions(text):
    """The prose lines that refer to an issue ("the issue", "issue 31", "the issue's")."""
    prose, _ = split_fences(HTML_COMMENT.sub("", text))
    return [line.strip() for line in prose.splitlines() if ISSUE.search(INLINE_CODE.sub("", line))]


# The project's pages


def test_the_pages_are_checked():
    checked = {page.relative_to(ROOT).as_posix() for page in doc_files() if page.is_file()}
    pages = ["performance", "cuda", "memory", "scaling-torchrun", "scaling-ray", "serving-rpc"]
    pages += ["usage", "scripts", "results", "design", "notes/README", "notes/history"]
    assert {"README.md", "CONTRIBUTING.md", *(f"docs/{page}.md" for page in pages)} <= checked


def test_the_readme_speed_tables_are_the_benchmarks_figures():
    runs = json.loads(QUICK_RESULTS.read_text())["runs"]
    readme = (ROOT / "README.md").read_text()
    assert len(
        [header for header, _ in tables(readme) if header[:2] == ["algorithm", "eager sps"]]
    ) == len(runs)
    assert speed_table_problems(readme, runs) == []
    for run in runs:
        assert run["settings"]["started"][:16] in readme


def test_the_quick_tables_in_performance_md_are_the_benchmarks_tables():
    page = (ROOT / "docs" / "performance.md").read_text()
    for run in json.loads(QUICK_RESULTS.read_text())["runs"]:
        assert missing_lines(page, quick_table_lines(run)) == []


@pytest.mark.parametrize("learning_set", ["default", "atari"])
def test_the_learning_tables_are_the_learning_report(learning_set):
    results = (ROOT / "docs" / "results.md").read_text()
    report_lines = (LEARNING_REPORT / f"{learning_set}.md").read_text().splitlines()
    assert missing_lines(results, report_lines) == []
    table = json.loads((LEARNING_REPORT / f"{learning_set}.json").read_text())["table"]
    assert missing_lines((ROOT / "README.md").read_text(), short_markdown(table).splitlines()) == []


@pytest.mark.parametrize("name", SEEDS_RESULTS)
def test_the_seeds_tables_are_the_benchmarks_tables(name):
    write, page = SEEDS_RESULTS[name]
    table = write(json.loads((RESULTS / name).read_text()))
    assert missing_lines(page.read_text(), table.splitlines()) == []


def windows_markdown(results):
    """One row per run of benchmarks/results/learning/td3_cleanrl_hopper.json: its mean return in
    each window, then its last 20 episodes'."""
    windows = results["windows"]
    lines = [
        "| run | seed | " + " | ".join(windows) + " | last 20 |",
        "|---|---:|" + "---:|" * (len(windows) + 1),
    ]
    for group, runs in results["groups"].items():
        for seed, run in runs.items():
            if seed != "mean_std":
                cells = [f"{value:.1f}" for value in run["windows"]]
                cells += [""] * (len(windows) - len(cells)) + [f"{run['last_20']:.1f}"]
                lines.append(f"| {group} | {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_the_td3_windows_table_in_its_note_is_its_json():
    page = TD3_NOTE.read_text()
    table = windows_markdown(json.loads(TD3_WINDOWS.read_text()))
    assert missing_lines(page, table.splitlines()) == []


# a command of the README: `python leanrl/<script>.py` and its flags, `<algo>` standing for every
# algorithm with such a script, and `N` for a number the reader picks
README_COMMAND = re.compile(r"python leanrl/([\w<>]+)\.py((?: +[^\s`|#]+)*)")


def readme_commands(text):
    """(script, its flags) for each command in `text` that runs a training script."""
    from benchmarks.scripts import ALL_SCRIPTS

    commands = []
    for name, flags in README_COMMAND.findall(text):
        pattern = re.compile(name.replace("<algo>", r"\w+") + "$")
        flags = ["2" if flag == "N" else flag for flag in flags.split()]
        commands += [(script, flags) for script in ALL_SCRIPTS if pattern.match(script)]
    return commands


def refused(commands, capsys):
    """The commands that their script refuses: tyro does not parse them (a seeds script checks a
    sweep's flags first), or the run flags' checks exit."""
    import tyro
    from conftest import load_script

    found = []
    for script, flags in commands:
        module = load_script(script)
        try:
            argv = module.sweep_argv(module.Args, flags) if hasattr(module, "sweep_argv") else flags
            load_script("flags").check_flags(tyro.cli(module.Args, args=argv))
        except SystemExit:
            found.append((script, " ".join(flags), capsys.readouterr().err.strip()[-200:]))
    return found


def test_every_readme_command_is_one_its_script_takes(capsys):
    commands = readme_commands((ROOT / "README.md").read_text())
    assert len({script for script, _ in commands}) > 10
    assert refused(commands, capsys) == []


def test_a_readme_command_its_script_refuses_is_found(capsys):
    """A sweep that gives SAC's seeds script a flag it lacks (it has --policy-lr and --q-lr)."""
    text = "`python leanrl/<algo>_seeds.py --num-seeds N --learning-rate 1e-4 3e-4`"
    commands = readme_commands(text)
    assert ("dqn_seeds", ["--num-seeds", "2", "--learning-rate", "1e-4", "3e-4"]) in commands
    assert [script for script, _, _ in refused(commands, capsys)] == ["sac_continuous_action_seeds"]


def test_the_readme_is_short():
    """The README is read in five minutes; reference goes to docs/, dated notes to docs/notes/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 180


def test_docs_holds_pages_not_results():
    """A user opening docs/ finds the reference pages, figures under docs/images/ and the notes: at
    most 20 entries at its top level and no result file anywhere under it (those live under
    benchmarks/results/): pages, figures and the Slurm example only."""
    entries = sorted(p.name for p in (ROOT / "docs").iterdir())
    assert len(entries) <= 20, entries
    files = [p.relative_to(ROOT) for p in (ROOT / "docs").rglob("*") if p.is_file()]
    kept = (".md", ".png", ".sbatch")
    assert [str(path) for path in files if path.suffix not in kept] == []
    assert [p.name for p in (ROOT / "docs" / "images").iterdir() if p.suffix != ".png"] == []


IMAGE = re.compile(r"!\[[^\]]*\]\(([^()\s]+\.png)\)")


def figure_problems(text):
    """Each figure (`![...](....png)`) followed, in the paragraph after it, by a caption that starts
    `Figure:` and names the command that made it (in backticks) and its result file (a path under
    benchmarks/results/, or says it was not kept)."""
    problems = []
    paragraphs = re.split(r"\n\s*\n", split_fences(text)[0])
    for i, paragraph in enumerate(paragraphs):
        for image in IMAGE.findall(paragraph):
            caption = paragraphs[i + 1].strip() if i + 1 < len(paragraphs) else ""
            if not caption.startswith("Figure:"):
                problems.append(f"{image}: no `Figure:` caption after it")
            elif not re.search(r"`python3? [^`]+`", caption):
                problems.append(f"{image}: its caption names no command")
            elif "benchmarks/results/" not in caption and "not kept" not in caption:
                problems.append(f"{image}: its caption names no result file")
    return problems


PAGE_CHECKS = {"links": link_problems, "commands": command_problems}
PAGE_CHECKS["issues"] = lambda page: issue_mentions(page.read_text())
PAGE_CHECKS["figures"] = lambda page: figure_problems(page.read_text())


@pytest.mark.parametrize("page", doc_files(), ids=lambda page: page.relative_to(ROOT).as_posix())
@pytest.mark.parametrize("check", PAGE_CHECKS)
def test_links_commands_and_figures_point_at_what_exists_and_no_issue_is_named(check, page):
    assert PAGE_CHECKS[check](page) == []


def test_the_figure_check_fails_on_a_bare_figure():
    ok = "![a](a.png)\n\nFigure: `python -m benchmarks.run`; [r](benchmarks/results/run/q.json).\n"
    assert figure_problems(ok) == []
    for caption, problem in [
        ("Some text.", "no `Figure:` caption after it"),
        ("Figure: a run.", "its caption names no command"),
        ("Figure: `python -m benchmarks.run`.", "its caption names no result file"),
    ]:
        assert figure_problems(f"![a](a.png)\n\n{caption}\n") == [f"a.png: {problem}"]


def test_run_sh_sweeps_every_algorithm_with_a_twin():
    """run.sh's loop names each eager script that has a `_torchcompile` twin (its `_cpu` and
    `_async` scripts run with it), so a new algorithm joins the full sweep or fails here."""
    text = (ROOT / "run.sh").read_text().replace("\\\n", " ")  # continued lines joined
    loop = re.search(r"^for algo in (.*); do$", text, re.M)
    twins = {
        p.stem.removesuffix("_torchcompile") for p in (ROOT / "leanrl").glob("*_torchcompile.py")
    }
    assert loop and sorted(loop.group(1).split()) == sorted(twins)


def test_contributing_names_the_quick_tier():
    """CONTRIBUTING.md gives contributors the quick tier, and pyproject.toml declares its marker."""
    _, blocks = split_fences((ROOT / "CONTRIBUTING.md").read_text())
    assert any('python -m pytest tests -m "not slow"' in block for block in blocks)
    assert '"slow: ' in (ROOT / "pyproject.toml").read_text()


def test_the_readme_keeps_the_ci_command():
    """CI (.ci/run) runs the README's test command verbatim."""
    _, blocks = split_fences((ROOT / "README.md").read_text())
    command = "pip install -r requirements/requirements-dev.txt && python -m pytest tests"
    assert any(line.strip() == command for block in blocks for line in block.splitlines())
    assert command in (ROOT / ".ci" / "run").read_text()


# The checker, on made-up pages


SLUGS = {
    "Start here": "start-here",
    "Scaling out: data-parallel PPO with torchrun": "scaling-out-data-parallel-ppo-with-torchrun",
    "Acting: compiled against eager": "acting-compiled-against-eager",
    "What `--double-buffer` costs (in learning)": "what---double-buffer-costs-in-learning",
    "The `_cpu` scripts, ppo_lstm & [memory](memory.md)": "the-_cpu-scripts-ppo_lstm--memory",
    "µs per step, 2026-11-24": "µs-per-step-2026-11-24",
}


@pytest.mark.parametrize("heading", SLUGS)
def test_slug_follows_githubs_rules(heading):
    assert slug(heading) == SLUGS[heading]


def test_anchors_number_repeated_headings_and_skip_code():
    text = "# Results\n\n## Results\n\n```bash\n# not a heading\n```\n\n"
    text += 'Setext\n------\n\n<a id="here"></a>\n'
    assert anchors(text) == {"results", "results-1", "setext", "here"}


@pytest.fixture
def repo(tmp_path):
    """A made-up repository: a README, a docs page with two headings, one script, one benchmark
    module and one study."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "leanrl").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# A page\n\n## Where the time goes\n\nSee [home](../README.md).\n"
    )
    (tmp_path / "docs" / "plot.png").write_bytes(b"")
    (tmp_path / "leanrl" / "dqn.py").write_text("")
    (tmp_path / "benchmarks" / "run.py").write_text("")
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "studies").mkdir()
    (tmp_path / "benchmarks" / "studies" / "seeds.py").write_text("")
    return tmp_path


def write_readme(repo, text):
    (repo / "README.md").write_text("# Readme\n\n## Start here\n\n" + text)
    return repo / "README.md"


def test_good_links_pass(repo):
    readme = write_readme(
        repo,
        "[page](docs/page.md), [time](docs/page.md#where-the-time-goes), [up](#start-here), "
        "![plot](docs/plot.png), [site](https://example.org/missing.md), [mail](mailto:a@b.c)\n\n"
        "[ref]: docs/page.md#a-page\n",
    )
    assert link_problems(readme, repo) == []
    assert link_problems(repo / "docs" / "page.md", repo) == []


@pytest.mark.parametrize(
    "link, complaint",
    [
        ("[gone](docs/missing.md)", "no file docs/missing.md"),
        ("[typo](docs/page.md#where-time-goes)", "no heading with the anchor #where-time-goes"),
        ("[case](docs/page.md#Where-the-time-goes)", "no heading with the anchor #Where-the-"),
        ("[self](#start-her)", "no heading with the anchor #start-her"),
        ("![plot](plot.png)", "no file plot.png"),
        ("[out](../outside/NOTES.md)", "leaves the repository"),
        ("[png anchor](docs/plot.png#top)", "can only point into a markdown page"),
        ("[ref]: docs/nothing.md", "no file docs/nothing.md"),
        ('<img src="docs/none.png">', "no file docs/none.png"),
    ],
)
def test_bad_links_fail(repo, link, complaint):
    readme = write_readme(repo, link + "\n")
    problems = link_problems(readme, repo)
    assert len(problems) == 1 and complaint in problems[0], problems


def test_links_in_code_and_comments_are_not_links(repo):
    readme = write_readme(
        repo, "`[x](missing.md)`\n\n```markdown\n[y](missing.md)\n```\n\n<!-- [z](missing.md) -->\n"
    )
    assert link_problems(readme, repo) == []


def test_commands_naming_what_exists_pass(repo):
    readme = write_readme(
        repo,
        "```bash\npython leanrl/dqn.py --seed 1\npython -m benchmarks.run --quick\n"
        "python -m benchmarks.studies.seeds --quick\n"
        "python leanrl/<algo>.py   # a placeholder, not a script\n```\n",
    )
    assert command_problems(readme, repo) == []


@pytest.mark.parametrize(
    "command, complaint",
    [
        ("python leanrl/dqn_cpu.py --seed 1", "leanrl/dqn_cpu.py, which does not exist"),
        ("torchrun --standalone leanrl/ppo.py", "leanrl/ppo.py, which does not exist"),
        ("python -m benchmarks.nothing", "`python -m benchmarks.nothing`, which does not exist"),
        ("bash run.sh", "run.sh, which does not exist"),
        ("pip install -r requirements/none.txt", "requirements/none.txt, which does not exist"),
    ],
)
def test_commands_naming_what_is_missing_fail(repo, command, complaint):
    readme = write_readme(repo, f"```bash\n{command}\n```\n")
    problems = command_problems(readme, repo)
    assert len(problems) == 1 and complaint in problems[0], problems


QUICK_RUN = {
    "settings": {"budget": "quick", "repeats": 2, "seeds": [1, 2],
                 "started": "2026-01-01T00:00:00"},
    "machine": {"cpu": "a CPU", "cores": 2, "gpu": None, "versions": {"torch": "2.13.0+cpu"}},
    "table": [
        {"algo": "sac", "variant": "eager", "runs": 2,
         "sps_median": 91.4, "sps_min": 81, "sps_max": 101,
         "return_mean": -273.2, "vs_eager": 1.0, "env_only_sps": 16710},
        {"algo": "sac", "variant": "cpu", "runs": 2,
         "sps_median": 172, "sps_min": 152, "sps_max": 193,
         "return_mean": -273.2, "vs_eager": 1.894, "env_only_sps": 16710},
    ],
}  # fmt: skip
SPEED_TABLE = (
    "| algorithm | eager sps | `_cpu` | env-only sps |\n|---|---:|---:|---:|\n"
    "| SAC | {} | {} | 16710 |\n"
)


def test_a_speed_table_with_the_results_figures_passes():
    assert speed_table_problems(SPEED_TABLE.format("91", "**1.89x**"), [QUICK_RUN]) == []


@pytest.mark.parametrize(
    "eager, cpu, complaint",
    [
        ("92", "1.89x", "SAC eager sps: the page says 92, the results 91"),
        ("91", "1.90x", "SAC `_cpu`: the page says 1.90x, the results 1.89x"),
    ],
)
def test_a_speed_table_that_drifted_from_the_results_fails(eager, cpu, complaint):
    assert speed_table_problems(SPEED_TABLE.format(eager, cpu), [QUICK_RUN]) == [complaint]


def test_a_speed_table_row_without_results_fails():
    table = "| algorithm | eager sps | `_cpu` |\n|---|---:|---:|\n| TD3 | 175 | 1.41x |\n"
    assert speed_table_problems(table, [QUICK_RUN]) == [
        "TD3 eager sps: no such row in the results",
        "TD3 `_cpu`: no such row in the results",
    ]


def test_a_full_table_needs_every_line_the_harness_printed():
    lines = quick_table_lines(QUICK_RUN)
    assert lines[2:] == [
        "| sac | eager | 91 | 81-101 | 1.00x | 16710 | -273.2 | 2 |",
        "| sac | cpu | 172 | 152-193 | 1.89x | 16710 | -273.2 | 2 |",
    ]
    page = "Intro.\n\n" + "\n".join(lines) + "\n"
    assert missing_lines(page, lines) == []
    assert missing_lines(page.replace("1.89x", "1.88x"), lines) == [lines[3]]


@pytest.mark.parametrize(
    "line, found",
    [
        ("As the issue asked, the table has seeds.", True),
        ("Issue 31 moved it.", True),
        ("The issue's bar is met.", True),
        ("Tianshou's issue #1172 has the table.", True),
        ("See pytorch/tutorials#2913 and `the issue` in code.", False),
        ("Nothing here is at issue.", False),
    ],
)
def test_issue_mentions_are_found_in_prose(line, found):
    assert issue_mentions(line + "\n\n```\nthe issue in a code block\n```\n") == (
        [line] if found else []
    )


def test_scripts_named_outside_code_blocks_are_not_commands(repo):
    readme = write_readme(repo, "Run `python leanrl/missing.py` one day.\n")
    assert command_problems(readme, repo) == []


def test_the_checkpoint_figures_are_the_measurements():
    """docs/usage.md's and the note's figures of SAC's checkpoint come from the JSON of
    `benchmarks.studies.checkpoint` (retired since), under benchmarks/results/checkpoint/."""
    result = json.loads((RESULTS / "checkpoint" / "sac_halfcheetah_full_buffer.json").read_text())
    size = f"{result['checkpoint_bytes'] / 1e6:.0f} MB"
    note = (ROOT / "docs" / "notes" / "checkpoint-cost.md").read_text()
    assert result["buffer_size"] == 1_000_000 and result["env_id"] == "HalfCheetah-v4"
    for figure in (
        size,
        ", ".join(f"{seconds:.2f}" for seconds in result["write_s"]) + " s",
        ", ".join(f"{seconds:.2f}" for seconds in result["load_s"]) + " s",
        f"{100 * result['sps_cost']:.2f}% of the run's time",
    ):
        assert figure in note, figure
    usage = (ROOT / "docs" / "usage.md").read_text()
    assert size in usage and result["sps_cost"] < 0.001 and "under 0.1% of the time" in usage
