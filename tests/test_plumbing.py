"""Each script ends with the run plumbing under one banner comment, and the banner's words hold: the
parts it names are byte-identical within a family of scripts, the per-script ones are named here.
Scripts are found on disk (every `leanrl/*.py`), so a new script is held to its family's plumbing,
and to the size budget of its suffix, at once. Parsing only, each script once: ~1 s."""

import ast
import difflib
import functools
from collections import Counter
from fnmatch import fnmatch

import pytest
from conftest import ALL_SCRIPTS, SCRIPTS

# A script's family: the first whose patterns its file name matches. Each family's plumbing knows
# only what its scripts need: the `_seeds` scripts (N runs as one vmapped program) report each of
# their members; the Atari scripts act on envpool's observations, count whole games
# (`finished_games`) and record videos from envpool's `render()` (`VideoRecorder`, the same in the
# three); the recurrent ones load a policy only with the same observation entries and memory, and
# carry a state through `evaluate`; the torchrun script's `Run` knows ranks. Every family's banner,
# `Run` and `evaluate` are the same in all of its scripts.
FAMILIES = {
    "seeds": ("*_seeds.py",),
    "atari": ("ppo_atari_envpool*.py",),
    "recurrent": ("ppo_lstm*.py", "ppo_mingru*.py"),
    "distributed": ("*_distributed.py",),
    "standard": ("*.py",),
}
EACH_FAMILY = [(name,) for name in FAMILIES]
# Each shared part (a top-level function or class; "banner": the banner comment) and the groups of
# families within which it is byte-identical, in every script of the group that has it.
SHARED = {
    "banner": EACH_FAMILY,
    "fail": [tuple(FAMILIES)],
    "Run": EACH_FAMILY,
    "evaluate": [("standard", "distributed"), ("atari",), ("recurrent",), ("seeds",)],
    "true_next_obs": [("standard", "distributed", "recurrent", "seeds")],
    "finished_episodes": [("standard", "distributed", "recurrent"), ("seeds",)],
    "episode_starts": [("recurrent",)],
    "check_memory": [("seeds",)],
    "per_member": [("seeds",)],
    "flat": [("seeds",)],
    "VideoRecorder": [("atari",)],
}
# written by each script for itself: its flag checks
PER_SCRIPT = ("check_args",)
# under the banner of every script, in this order, then the `__main__` guard and nothing else; the
# seeds scripts also check that their members' storage fits in memory
BELOW_THE_BANNER = ["fail", "check_args", "Run", "evaluate"]
BELOW_THE_SEEDS_BANNER = ["fail", "check_args", "check_memory", "Run", "evaluate"]
MAIN_GUARD = 'if __name__ == "__main__":\n    main(tyro.cli(Args))'
RULE = "# " + "=" * 98


def family(script):
    return next(
        name
        for name, patterns in FAMILIES.items()
        if any(fnmatch(f"{script}.py", p) for p in patterns)
    )


@functools.cache
def plumbing(script):
    """The script's parts by name, as source text: its top-level functions and classes, "banner"
    (the rule and the comment lines under it), and "below": the names of what follows the
    banner, in order (the source of what has none)."""
    source = (SCRIPTS / f"{script}.py").read_text()
    lines = source.splitlines()
    assert lines.count(RULE) == 1, f"{script}: expected one banner rule"
    start = lines.index(RULE)
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("#"))
    nodes = ast.parse(source).body
    parts = {
        n.name: ast.get_source_segment(source, n)
        for n in nodes
        if isinstance(n, ast.FunctionDef | ast.ClassDef)
    }
    below = [
        getattr(n, "name", None) or ast.get_source_segment(source, n)
        for n in nodes
        if n.lineno > end
    ]
    return parts | {"banner": "\n".join(lines[start:end]), "below": below}


def test_the_family_rule():
    scripts = (
        "dqn_seeds",
        "ppo_atari_envpool_async",
        "ppo_mingru_torchcompile",
        "ppo_continuous_action_distributed",
        "sac_continuous_action_cpu",
    )
    families = ["seeds", "atari", "recurrent", "distributed", "standard"]
    assert [family(name) for name in scripts] == families
    assert len(ALL_SCRIPTS) >= 21 and Counter(map(family, ALL_SCRIPTS))["standard"] >= 13
    assert set(BELOW_THE_BANNER) - set(PER_SCRIPT) <= set(SHARED), (
        "a part below the banner is neither shared nor own"
    )


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
            diff = difflib.unified_diff(
                common.splitlines(), text.splitlines(), "most scripts", name, lineterm=""
            )
            assert text == common, (
                f"{part} of {name} differs within {'/'.join(group)}:\n" + "\n".join(diff)
            )


# The most bytes a script may have: its own budget, set from its size once it had a named learner,
# step headers and the plumbing of its family, and the most bytes of the plumbing section (from the
# banner's rule to the end), the seeds scripts' also recording and leaving out diverged members.
# The Atari scripts' grew by their video recorder, every script's by checkpoints and resume (and a
# resumed run's video folder). The seeds scripts became their CPU scripts' functions plus one vmap
# block: DQN's, SAC's and TD3's shrank, PPO's grew; the SAC and TD3 CPU scripts grew by their
# gradient functions (critic_grads, actor_grads), which the seeds scripts share. The seeds plumbing
# grew by ~350 bytes when its text was brought to the single-process scripts' where they mean the
# same (state_of and restore walk a SimpleNamespace learner; one `diverged` entry per member).
SIZE_BUDGETS = {
    "dqn": 34_700,
    "dqn_cpu": 38_900,
    "dqn_seeds": 48_600,
    "dqn_torchcompile": 36_600,
    "ppo_atari_envpool": 35_900,
    "ppo_atari_envpool_async": 44_200,
    "ppo_atari_envpool_torchcompile": 38_900,
    "ppo_continuous_action": 39_600,
    "ppo_continuous_action_cpu": 45_000,
    "ppo_continuous_action_distributed": 50_800,
    "ppo_continuous_action_ray": 54_200,
    "ppo_continuous_action_seeds": 53_800,
    "ppo_continuous_action_torchcompile": 41_900,
    "ppo_lstm": 43_000,
    "ppo_lstm_torchcompile": 45_900,
    "ppo_mingru": 44_300,
    "ppo_mingru_torchcompile": 48_400,
    "sac_continuous_action": 37_700,
    "sac_continuous_action_cpu": 43_400,
    "sac_continuous_action_seeds": 50_100,
    "sac_continuous_action_torchcompile": 40_200,
    "td3_continuous_action": 36_500,
    "td3_continuous_action_cpu": 41_400,
    "td3_continuous_action_seeds": 49_300,
    "td3_continuous_action_torchcompile": 38_800,
}
PLUMBING_BUDGET = 22_200
SEEDS_PLUMBING_BUDGET = 23_600


def test_every_script_has_a_size_budget():
    assert sorted(SIZE_BUDGETS) == ALL_SCRIPTS


def test_every_script_is_within_its_size_budgets():
    over = []
    for script in ALL_SCRIPTS:
        text = (SCRIPTS / f"{script}.py").read_text()
        size, plumbing = len(text.encode()), len(text[text.index(RULE) :].encode())
        budget = SEEDS_PLUMBING_BUDGET if family(script) == "seeds" else PLUMBING_BUDGET
        if size > SIZE_BUDGETS[script]:
            over.append(f"{script}.py: {size} bytes, budget {SIZE_BUDGETS[script]}")
        if plumbing > budget:
            over.append(f"{script}.py: its plumbing section has {plumbing} bytes, budget {budget}")
    assert not over, "\n".join(over)


def flags_of(script):
    """The script's flags (its `Args` fields) and the flags its `Run.FREE_FLAGS` names."""
    tree = ast.parse((SCRIPTS / f"{script}.py").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    fields = {n.target.id for n in classes["Args"].body if isinstance(n, ast.AnnAssign)}
    free = set()
    for node in classes["Run"].body:
        if isinstance(node, ast.Assign | ast.AugAssign) and "FREE_FLAGS" in ast.unparse(node):
            free |= set(ast.literal_eval(node.value))
    return fields, free


@pytest.mark.parametrize("name", FAMILIES)
def test_a_familys_free_flags_are_flags_of_its_scripts(name):
    """`--resume` lets the flags of `Run.FREE_FLAGS` differ from the checkpoint's: each must be a
    flag of some script of the family (the plumbing knows only its own family)."""
    scripts = [script for script in ALL_SCRIPTS if family(script) == name]
    fields, free = set(), set()
    for script in scripts:
        script_fields, script_free = flags_of(script)
        fields |= script_fields
        free |= script_free
    assert free and free <= fields, f"{name}: not a flag of its scripts: {sorted(free - fields)}"
