"""The speculative plan answers every question of `speculative.mode`, and nothing else asks the mode itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tlt.spec.plan import LearnedDrafters, SpeculativePlan, learned_drafters, spread_layers
from tlt.spec.run import RunSpec

ROOT = Path(__file__).resolve().parents[2]
MODES = {"off", "ngram", "static", "tlt"}
# the spec (where the mode is declared) and the plan (where it is resolved) are the only readers of the word
ALLOWED = {ROOT / "tlt" / "spec" / "plan.py", ROOT / "tlt" / "spec" / "speculative.py"}
SOURCES = [ROOT / "tlt", ROOT / "operator" / "tlt_operator", ROOT / "components" / "tlt_components", ROOT / "bench"]
ARMS = [
    {"kind": "chain", "depth": 2},
    {"kind": "ngram", "depth": 4},
    {"kind": "block", "depth": 4},
    {"kind": "history", "depth": 4},
    {"kind": "plain"},
]


def plan(**sections) -> SpeculativePlan:
    spec = RunSpec.model_validate(sections)
    return SpeculativePlan.of(spec.speculative, spec.drafter)


@pytest.mark.parametrize(
    ("mode", "training", "path", "expected"),
    [
        ("off", True, None, [False, False]),
        ("ngram", True, None, [False, False]),
        ("static", True, None, [True, False]),  # trained on the first step's rollouts, then frozen
        ("static", True, "/drafters/d0", [False, False]),  # starts from a given drafter: frozen throughout
        ("tlt", True, None, [True, True]),
        ("tlt", False, None, [False, False]),
    ],
)
def test_which_steps_train_the_drafter(mode, training, path, expected):
    p = plan(speculative={"mode": mode, "drafterPath": path}, drafter={"training": training})
    assert [p.trains_drafter(step) for step in (1, 2)] == expected
    assert p.ever_trains == any(expected)


@pytest.mark.parametrize(
    ("mode", "arms", "learns", "eagle", "block_size"),
    [
        ("off", (), False, False, 0),
        ("ngram", (1, 3, 4), False, False, 0),  # model-free arms only: no learned drafter
        ("static", (0, 1, 2, 3, 4), True, True, 4),
        ("tlt", (0, 1, 2, 3, 4), True, True, 4),
    ],
)
def test_each_mode_resolves_its_arms_and_drafters(mode, arms, learns, eagle, block_size):
    p = plan(speculative={"mode": mode, "arms": ARMS})
    assert (p.arms, p.learns, p.eagle, p.block_size) == (arms, learns, eagle, block_size)
    assert p.drafts == (mode != "off") and p.model_free_only == (mode == "ngram")


def test_history_arms_leave_with_the_history_store():
    p = plan(speculative={"mode": "tlt", "arms": ARMS, "history": {"enabled": False}})
    assert p.arms == (0, 1, 2, 4)


def test_ngram_mode_without_a_model_free_draft_is_refused_in_one_line():
    with pytest.raises(ValueError, match="speculative.mode 'ngram' needs at least one arm of kind 'ngram'"):
        plan(speculative={"mode": "ngram", "arms": [{"kind": "chain", "depth": 2}, {"kind": "plain"}]})


def test_the_feature_layers_follow_the_target_depth():
    p = plan(speculative={"mode": "tlt", "arms": ARMS})
    assert p.learned(16) == LearnedDrafters(eagle=True, block_size=4, feature_layers=(1, 7, 13))
    assert p.learned(16) == learned_drafters(RunSpec.model_validate({"speculative": {"arms": ARMS}}).speculative, 16)
    assert spread_layers(2) == (0,)
    eagle_only = plan(speculative={"mode": "static", "arms": ARMS[:2]})
    assert eagle_only.learned(16) == LearnedDrafters(eagle=True, block_size=0)


def _mode_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    """`<...>.mode` or `mode` compared (==, !=, in, not in) with a speculative mode's name, or with a
    collection named `*MODES`."""

    def is_mode(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "mode") or (
            isinstance(node, ast.Attribute) and node.attr == "mode"
        )

    def names_a_mode(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in MODES
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(names_a_mode(e) for e in node.elts)
        return isinstance(node, ast.Name) and node.id.endswith("MODES")

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and len(node.comparators) == 1:
            left, right = node.left, node.comparators[0]
            if (is_mode(left) and names_a_mode(right)) or (is_mode(right) and names_a_mode(left)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_but_the_spec_and_the_plan_compares_the_speculative_mode():
    found = [path for root in SOURCES for path in sorted(root.rglob("*.py")) if path not in ALLOWED]
    hits = [line for path in found for line in _mode_comparisons(path)]
    assert hits == [], "ask tlt.spec.plan instead:\n" + "\n".join(hits)


def test_the_mode_check_finds_a_comparison(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('if spec.speculative.mode in ("static", "tlt"):\n    pass\nok = mode == "eager"\n')
    (hit,) = [line.partition(": ")[2] for line in _mode_comparisons(probe, tmp_path)]
    assert hit == "spec.speculative.mode in ('static', 'tlt')"
