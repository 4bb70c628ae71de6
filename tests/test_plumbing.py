"""Each script ends with the run plumbing under one banner comment, and the banner's words hold: the parts it names are
byte-identical within a family of scripts, the per-script ones are named here. Scripts are found on disk (every
`leanrl/*.py`), so a new script is held to its family's plumbing, and to the size budget of its suffix, at once.
Parsing only, each script once: ~1 s."""

import ast
import difflib
import functools
from collections import Counter
from fnmatch import fnmatch

import pytest
from conftest import SCRIPTS

# A script's family: the first whose patterns its file name matches. The `_seeds` scripts (N runs as one vmapped
# program) copy the standard plumbing and report each of their runs: their banner, `Run` and `evaluate` are their own,
# the same in all of them. The Atari scripts act on envpool's observations and count whole games (`finished_games`,
# which reads envpool's info, is their own); the recurrent ones carry a state through `evaluate`.
FAMILIES = {
    "seeds": ("*_seeds.py",),
    "atari": ("ppo_atari_envpool*.py",),
    "recurrent": ("ppo_lstm*.py", "ppo_mingru*.py"),
    "standard": ("*.py",),
}
SINGLE_RUN = ("standard", "atari", "recurrent")
# Each shared part (a top-level function or class; "banner": the banner comment) and the groups of families within
# which it is byte-identical, in every script of the group that has it.
SHARED = {
    "banner": [SINGLE_RUN, ("seeds",)],
    "fail": [(*SINGLE_RUN, "seeds")],
    "Run": [SINGLE_RUN, ("seeds",)],
    "evaluate": [("standard",), ("atari",), ("recurrent",), ("seeds",)],
    "true_next_obs": [("standard", "recurrent", "seeds")],
    "finished_episodes": [("standard", "recurrent"), ("seeds",)],
    "episode_starts": [("recurrent",)],
    "check_memory": [("seeds",)],
}
# written by each script for itself: its flag checks
PER_SCRIPT = ("check_args",)
# under the banner of every script, in this order, then the `__main__` guard and nothing else; the seeds scripts also
# check that their members' storage fits in memory
BELOW_THE_BANNER = ["fail", "check_args", "Run", "evaluate"]
BELOW_THE_SEEDS_BANNER = ["fail", "check_args", "check_memory", "Run", "evaluate"]
MAIN_GUARD = 'if __name__ == "__main__":\n    main(tyro.cli(Args))'
RULE = "# " + "=" * 118
ALL_SCRIPTS = sorted(path.stem for path in SCRIPTS.glob("*.py"))


def family(script):
    return next(name for name, patterns in FAMILIES.items() if any(fnmatch(f"{script}.py", p) for p in patterns))


@functools.cache
def plumbing(script):
    """The script's parts by name, as source text: its top-level functions and classes, "banner" (the rule and the
    comment lines under it), and "below": the names of what follows the banner, in order (the source of what has
    none)."""
    source = (SCRIPTS / f"{script}.py").read_text()
    lines = source.splitlines()
    assert lines.count(RULE) == 1, f"{script}: expected one banner rule"
    start = lines.index(RULE)
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("#"))
    nodes = ast.parse(source).body
    parts = {n.name: ast.get_source_segment(source, n) for n in nodes if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    below = [getattr(n, "name", None) or ast.get_source_segment(source, n) for n in nodes if n.lineno > end]
    return parts | {"banner": "\n".join(lines[start:end]), "below": below}


def test_the_family_rule():
    scripts = ("dqn_seeds", "ppo_atari_envpool_async", "ppo_mingru_torchcompile", "sac_continuous_action_cpu")
    assert [family(name) for name in scripts] == ["seeds", "atari", "recurrent", "standard"]
    assert len(ALL_SCRIPTS) >= 21 and Counter(map(family, ALL_SCRIPTS))["standard"] >= 14
    assert set(BELOW_THE_BANNER) - set(PER_SCRIPT) <= set(SHARED), "a part below the banner is neither shared nor own"


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_the_banner_is_followed_by_the_plumbing_it_names(script):
    below = BELOW_THE_SEEDS_BANNER if family(script) == "seeds" else BELOW_THE_BANNER
    assert plumbing(script)["below"] == [*below, MAIN_GUARD]


@pytest.mark.parametrize("part", SHARED)
def test_shared_parts_are_byte_identical_within_their_family(part):
    for group in SHARED[part]:
        texts = {name: plumbing(name).get(part) for name in ALL_SCRIPTS if family(name) in group}
        texts = {name: text for name, text in texts.items() if text is not None}
        if not texts:
            continue
        common = Counter(texts.values()).most_common(1)[0][0]
        for name, text in texts.items():
            diff = difflib.unified_diff(common.splitlines(), text.splitlines(), "most scripts", name, lineterm="")
            assert text == common, f"{part} of {name} differs within {'/'.join(group)}:\n" + "\n".join(diff)


# The most lines (`wc -l`) a script may have, by the first pattern its name matches: the recurrent scripts carry a
# state through acting, storage and update, and the plumbing section (from the banner's rule to the end) is capped
# in every script.
SIZE_BUDGETS = [
    ("*_seeds", 655),
    ("*_cpu", 632),
    ("*_async", 631),
    ("*_distributed", 750),
    ("*_ray", 753),
    ("ppo_lstm_torchcompile", 690),
    ("ppo_mingru_torchcompile", 717),
    ("*_torchcompile", 583),
    ("ppo_lstm", 634),
    ("ppo_mingru", 654),
    ("*", 544),
]
PLUMBING_BUDGET = 194
# the seeds scripts' plumbing also records, reports and leaves out each diverged member
SEEDS_PLUMBING_BUDGET = 206


def size_budget(script):
    return next(lines for pattern, lines in SIZE_BUDGETS if fnmatch(script, pattern))


def test_the_size_budget_rule():
    scripts = ("ppo_lstm_seeds", "td3_continuous_action_cpu", "ppo_atari_envpool_async", "ppo_continuous_action_ray")
    scripts += ("ppo_continuous_action_distributed", "ppo_mingru_torchcompile", "dqn_torchcompile", "ppo_lstm", "dqn")
    assert [size_budget(name) for name in scripts] == [655, 632, 631, 753, 750, 717, 583, 634, 544]


def test_every_script_is_within_its_size_budgets():
    over = []
    for script in ALL_SCRIPTS:
        lines = (SCRIPTS / f"{script}.py").read_text().splitlines()
        plumbing = len(lines) - lines.index(RULE)
        budget = SEEDS_PLUMBING_BUDGET if family(script) == "seeds" else PLUMBING_BUDGET
        if len(lines) > size_budget(script):
            over.append(f"{script}.py: {len(lines)} lines, budget {size_budget(script)}")
        if plumbing > budget:
            over.append(f"{script}.py: its plumbing section has {plumbing} lines, budget {budget}")
    assert not over, "\n".join(over)
