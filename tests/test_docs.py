"""The documentation points at what exists: every relative link in README.md, CONTRIBUTING.md and docs/*.md names a
file of the repository (and, with `#anchor`, a heading of that file, by GitHub's slug rules), and every command in a
fenced code block names scripts (`leanrl/<name>.py`), benchmark modules (`python -m benchmarks.<module>`), shell
scripts and requirements files that exist. The checker itself is tested on made-up pages, so that each check is
shown able to fail. Nothing here runs a script."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Scripts the README documents ahead of their arrival (issue 30: the CPU scripts). While one is missing, the command
# check leaves it out and `test_scripts_awaited_by_the_readme` is skipped, naming it; once all exist, they are checked
# like any other and this set can be emptied.
AWAITED_SCRIPTS = {"sac_continuous_action_cpu", "td3_continuous_action_cpu", "dqn_cpu", "ppo_continuous_action_cpu"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+).+?\1")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?(?:\s+\"[^\"]*\")?\s*\)"
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


def doc_files(root=ROOT):
    """The pages whose links are checked."""
    return [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]


def split_fences(text):
    """(prose, code blocks): the text with every fenced code block blanked out line for line, and the blocks' text."""
    prose, blocks, block, fence = [], [], [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence, block = match.group(1), []
            prose.append("")
        elif fence is not None and match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
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
    """The text GitHub renders for a heading's markdown: links and images by their text, no code marks, no tags."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("`", "").replace("*", "")


def slug(heading):
    """GitHub's anchor for a heading's text: lowercase, punctuation dropped (letters, digits, '_', '-' and spaces
    kept), each space turned into '-'."""
    return re.sub(r"[^\w\- ]", "", heading_text(heading).strip().lower()).replace(" ", "-")


def anchors(text):
    """Every anchor a page offers: its headings' slugs, repeated ones numbered as GitHub numbers them ('x', 'x-1',
    'x-2'), and the ids and names of its HTML elements."""
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
    """The targets of every link and image in a page's prose (code blocks, inline code and HTML comments skipped)."""
    prose, _ = split_fences(HTML_COMMENT.sub("", text))
    prose = INLINE_CODE.sub("", prose)
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose) + HTML_LINK.findall(prose)


def link_problems(page, root=ROOT):
    """One line per relative link of `page` that points outside `root`, to a file that does not exist, or to a
    heading its target page does not have."""
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
            problems.append(f"{where}: #{anchor} can only point into a markdown page (or #L<n> into a file)")
    return problems


def command_problems(page, root=ROOT, awaited=frozenset()):
    """One line per script, benchmark module, shell script or requirements file that a command in one of `page`'s
    fenced code blocks names and that does not exist; scripts in `awaited` are left out."""
    problems = []
    _, blocks = split_fences(page.read_text())
    for block in blocks:
        for name in SCRIPT.findall(block):
            if name not in awaited and not (root / "leanrl" / f"{name}.py").is_file():
                problems.append(f"{page.name}: a command runs leanrl/{name}.py, which does not exist")
        for module in BENCHMARK.findall(block):
            parts = module.rstrip(".").split(".")
            base = root / "benchmarks" / Path(*parts)
            if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
                problems.append(f"{page.name}: a command runs `python -m benchmarks.{module}`, which does not exist")
        for path in SHELL_SCRIPT.findall(block) + REQUIREMENTS.findall(block):
            if not (root / path).is_file():
                problems.append(f"{page.name}: a command names {path}, which does not exist")
    return problems


# The project's pages


def test_the_pages_are_checked():
    checked = {page.relative_to(ROOT).as_posix() for page in doc_files() if page.is_file()}
    pages = ["performance", "cuda", "memory", "scaling-torchrun", "scaling-ray", "serving-rpc"]
    assert {"README.md", "CONTRIBUTING.md", *(f"docs/{page}.md" for page in pages)} <= checked


@pytest.mark.parametrize("page", doc_files(), ids=lambda page: page.relative_to(ROOT).as_posix())
def test_relative_links_point_at_files_and_headings(page):
    assert link_problems(page) == []


@pytest.mark.parametrize("page", doc_files(), ids=lambda page: page.relative_to(ROOT).as_posix())
def test_commands_name_what_exists(page):
    missing = {name for name in AWAITED_SCRIPTS if not (ROOT / "leanrl" / f"{name}.py").is_file()}
    assert command_problems(page, awaited=missing) == []


def test_scripts_awaited_by_the_readme():
    missing = sorted(name for name in AWAITED_SCRIPTS if not (ROOT / "leanrl" / f"{name}.py").is_file())
    if missing:
        pytest.skip(f"the README documents scripts not yet in leanrl/ (issue 30): {', '.join(missing)}")
    assert command_problems(ROOT / "README.md") == []


def test_the_readme_keeps_the_ci_command():
    """CI (.ci/run) runs the README's test command verbatim."""
    _, blocks = split_fences((ROOT / "README.md").read_text())
    command = "pip install -r requirements/requirements-dev.txt && python -m pytest tests"
    assert any(line.strip() == command for block in blocks for line in block.splitlines())
    assert command in (ROOT / ".ci" / "run").read_text()


# The checker, on made-up pages


@pytest.mark.parametrize(
    "heading, expected",
    [
        ("Start here", "start-here"),
        ("Scaling out: data-parallel PPO with torchrun", "scaling-out-data-parallel-ppo-with-torchrun"),
        ("Acting: compiled against eager", "acting-compiled-against-eager"),
        ("What `--double-buffer` costs (in learning)", "what---double-buffer-costs-in-learning"),
        ("The `_cpu` scripts, ppo_lstm & [memory](memory.md)", "the-_cpu-scripts-ppo_lstm--memory"),
        ("µs per step, 2026-11-24", "µs-per-step-2026-11-24"),
    ],
)
def test_slug_follows_githubs_rules(heading, expected):
    assert slug(heading) == expected


def test_anchors_number_repeated_headings_and_skip_code():
    text = '# Results\n\n## Results\n\n```bash\n# not a heading\n```\n\nSetext\n------\n\n<a id="here"></a>\n'
    assert anchors(text) == {"results", "results-1", "setext", "here"}


@pytest.fixture
def repo(tmp_path):
    """A made-up repository: a README, a docs page with two headings, one script and one benchmark module."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "leanrl").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Where the time goes\n\nSee [home](../README.md).\n")
    (tmp_path / "docs" / "plot.png").write_bytes(b"")
    (tmp_path / "leanrl" / "dqn.py").write_text("")
    (tmp_path / "benchmarks" / "run.py").write_text("")
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
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
        ("[case](docs/page.md#Where-the-time-goes)", "no heading with the anchor #Where-the-time-goes"),
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
    readme = write_readme(repo, "`[x](missing.md)`\n\n```markdown\n[y](missing.md)\n```\n\n<!-- [z](missing.md) -->\n")
    assert link_problems(readme, repo) == []


def test_commands_naming_what_exists_pass(repo):
    readme = write_readme(
        repo,
        "```bash\npython leanrl/dqn.py --seed 1\npython -m benchmarks.run --quick\n"
        "python leanrl/<algo>.py   # a placeholder, not a script\n```\n",
    )
    assert command_problems(readme, repo) == []


@pytest.mark.parametrize(
    "command, complaint",
    [
        ("python leanrl/dqn_cpu.py --total-timesteps 100", "leanrl/dqn_cpu.py, which does not exist"),
        ("torchrun --standalone leanrl/ppo.py", "leanrl/ppo.py, which does not exist"),
        ("python -m benchmarks.nothing --quick", "`python -m benchmarks.nothing`, which does not exist"),
        ("bash run.sh", "run.sh, which does not exist"),
        ("pip install -r requirements/none.txt", "requirements/none.txt, which does not exist"),
    ],
)
def test_commands_naming_what_is_missing_fail(repo, command, complaint):
    readme = write_readme(repo, f"```bash\n{command}\n```\n")
    problems = command_problems(readme, repo)
    assert len(problems) == 1 and complaint in problems[0], problems


def test_awaited_scripts_are_left_out_only_when_named(repo):
    readme = write_readme(repo, "```bash\npython leanrl/dqn_cpu.py\n```\n")
    assert command_problems(readme, repo, awaited={"dqn_cpu"}) == []
    assert len(command_problems(readme, repo)) == 1


def test_scripts_named_outside_code_blocks_are_not_commands(repo):
    readme = write_readme(repo, "Run `python leanrl/missing.py` one day.\n")
    assert command_problems(readme, repo) == []
