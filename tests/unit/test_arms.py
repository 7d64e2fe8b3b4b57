"""Arms are built from `speculative.arms` per mode, labelled stably, and EAGLE arms share one drafter cache."""

from __future__ import annotations

import pytest

from tlt.adaptive.adaptive_stepper import AdaptiveStepper, new_bandit
from tlt.adaptive.arms import arm_label, build_arms, drafter_graphs, tree_budget, verify_width
from tlt.models.block_drafter import new_block_drafter
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout.block import BlockChainDrafter
from tlt.rollout.drafting import EagleChainDrafter, NgramDrafter
from tlt.rollout.eagle_tree import EagleTreeDrafter
from tlt.rollout.history import HistoryDrafter, HistoryStore, HistoryTreeDrafter
from tlt.rollout.mixed import MixedDrafter
from tlt.rollout.runner import ModelRunner
from tlt.sim.accept import drafter_steps
from tlt.spec.plan import usable_arms
from tlt.spec.run import ArmSpec, SpeculativeSpec

ARMS = [
    ArmSpec(kind="chain", depth=3),
    ArmSpec(kind="tree", depth=4, topk=2, verify_tokens=8),
    ArmSpec(kind="ngram", depth=5),
    ArmSpec(kind="tree", depth=2, topk=3),
]


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", vocab_size=32, seed=1)


def _drafter(model):
    d = EagleDrafter(drafter_config_from_target(model.config))
    d.bind_policy(model)
    return d


def test_labels_budgets_and_verify_widths():
    assert [arm_label(a) for a in ARMS] == ["chain-d3", "tree-d4k2v8", "ngram-d5", "tree-d2k3v6"]
    assert tree_budget(ARMS[3]) == 6, "verifyTokens 0 means depth * topk"
    assert [verify_width(a) for a in ARMS] == [4, 9, 6, 7]


@pytest.mark.parametrize(
    ("mode", "expected"), [("off", []), ("ngram", [2]), ("static", [0, 1, 2, 3]), ("tlt", [0, 1, 2, 3])]
)
def test_modes_select_arms(mode, expected):
    assert usable_arms(SpeculativeSpec(mode=mode, arms=ARMS)) == expected


def test_ngram_mode_without_an_ngram_arm_is_refused():
    with pytest.raises(ValueError, match="kind 'ngram' or 'history'"):
        usable_arms(SpeculativeSpec(mode="ngram", arms=[ArmSpec(kind="chain", depth=2)]))


def test_factory_builds_each_kind_and_eagle_arms_share_one_cache(model):
    arms = build_arms(
        SpeculativeSpec(mode="tlt", arms=ARMS),
        embed=model.get_input_embeddings(),
        drafter=_drafter(model),
        max_batch_size=2,
        max_context=64,
    )
    kinds = [type(a.drafter) for a in arms]
    assert kinds == [EagleChainDrafter, EagleTreeDrafter, NgramDrafter, EagleTreeDrafter]
    assert arms[0].drafter.k == 3 and arms[2].drafter.k == 5
    assert (arms[1].drafter.topk, arms[1].drafter.depth, arms[1].drafter.budget) == (2, 4, 8)
    assert arms[0].drafter.state is arms[1].drafter.state is arms[3].drafter.state
    assert [a.index for a in arms] == [0, 1, 2, 3]


def test_ngram_mode_needs_no_drafter_and_keeps_spec_indices(model):
    arms = build_arms(
        SpeculativeSpec(mode="ngram", arms=ARMS),
        embed=model.get_input_embeddings(),
        drafter=None,
        max_batch_size=2,
        max_context=64,
    )
    assert [(a.index, a.label) for a in arms] == [(2, "ngram-d5")]


def test_stepper_refuses_a_bandit_of_another_shape(model):
    spec = SpeculativeSpec(mode="ngram", arms=ARMS, buckets=[1, 2])
    runner = ModelRunner(model, max_batch_size=2, max_context=64)
    arms = build_arms(spec, embed=model.get_input_embeddings(), drafter=None, max_batch_size=2, max_context=64)
    with pytest.raises(ValueError, match="arms"):
        AdaptiveStepper(runner, arms, new_bandit(spec, 3, seed=0), threshold=2, buckets=[1, 2])
    stepper = AdaptiveStepper(runner, arms, new_bandit(spec, 1, seed=0), threshold=2, buckets=[1, 2])
    assert [stepper.bucket(n) for n in (1, 2, 3)] == [0, 1, None]


def test_plain_arm_drafts_nothing_and_counts_as_a_plain_step(model):
    arms = [ArmSpec(kind="ngram", depth=2), ArmSpec(kind="plain"), ArmSpec(kind="chain", depth=2)]
    assert arm_label(arms[1]) == "plain" and verify_width(arms[1]) == 1
    spec = SpeculativeSpec(mode="ngram", arms=arms, buckets=[1, 2])
    assert usable_arms(spec) == [0, 1], "the plain arm is model-free: ngram mode keeps it"
    built = build_arms(spec, embed=model.get_input_embeddings(), drafter=None, max_batch_size=2, max_context=64)
    assert built[1].drafter is None
    runner = ModelRunner(model, max_batch_size=2, max_context=64)
    stepper = AdaptiveStepper(runner, built, new_bandit(spec, 2, seed=0), threshold=2, buckets=[1, 2])
    assert stepper.speculative[1] is stepper.plain
    with pytest.raises(ValueError, match="kind 'ngram' or 'history'"):
        usable_arms(SpeculativeSpec(mode="ngram", arms=[ArmSpec(kind="plain")]))


def test_arm_rates_sum_steps_seconds_and_tokens_per_bucket_and_arm():
    from tlt.adaptive.adaptive_stepper import StepRecord, arm_rates, merge_arm_rates

    log = [
        StepRecord(4, None, None, 4, 4, 1.0),  # above the threshold: not the bandit's
        StepRecord(2, 1, "chain-d2", 5, 6, 0.5),
        StepRecord(2, 1, "plain", 2, 2, 0.25),
        StepRecord(1, 0, "chain-d2", 3, 3, 0.5),
    ]
    table = arm_rates(log, [1, 2])
    assert table == {
        "2": {
            "chain-d2": {"steps": 1, "seconds": 0.5, "tokens": 5},
            "plain": {"steps": 1, "seconds": 0.25, "tokens": 2},
        },
        "1": {"chain-d2": {"steps": 1, "seconds": 0.5, "tokens": 3}},
    }
    merged = merge_arm_rates([table, table])
    assert merged["2"]["chain-d2"] == {"steps": 2, "seconds": 1.0, "tokens": 10}


HISTORY_ARMS = [
    ArmSpec(kind="history", depth=4),
    ArmSpec(kind="history", depth=3, topk=2),
    ArmSpec(kind="mixed", depth=2),
    ArmSpec(kind="chain", depth=2),
    ArmSpec(kind="plain"),
]


def test_history_and_mixed_arms_labels_widths_and_modes():
    assert [arm_label(a) for a in HISTORY_ARMS] == ["history-d4", "history-d3k2v6", "mixed-d2", "chain-d2", "plain"]
    assert [verify_width(a) for a in HISTORY_ARMS] == [5, 7, 3, 3, 1]
    assert usable_arms(SpeculativeSpec(mode="ngram", arms=HISTORY_ARMS)) == [0, 1, 4]  # model-free only
    off = SpeculativeSpec(mode="tlt", arms=HISTORY_ARMS, history={"enabled": False})
    assert usable_arms(off) == [3, 4]


def test_history_arms_share_one_store_and_mixed_shares_the_eagle_cache(model):
    store = HistoryStore(max_nodes=1000, min_match=2, max_match=4, max_draft=8)
    arms = build_arms(
        SpeculativeSpec(mode="tlt", arms=HISTORY_ARMS),
        embed=model.get_input_embeddings(),
        drafter=_drafter(model),
        max_batch_size=2,
        max_context=64,
        history=store,
    )
    assert [type(a.drafter) for a in arms[:4]] == [HistoryDrafter, HistoryTreeDrafter, MixedDrafter, EagleChainDrafter]
    assert arms[0].drafter.store is arms[1].drafter.store is arms[2].drafter.store is store
    assert arms[2].drafter.eagle.state is arms[3].drafter.state
    fresh = build_arms(
        SpeculativeSpec(mode="ngram", arms=HISTORY_ARMS),
        embed=model.get_input_embeddings(),
        drafter=None,
        max_batch_size=2,
        max_context=64,
    )
    assert fresh[0].drafter.store is fresh[1].drafter.store  # a new store from speculative.history


def test_history_arm_deeper_than_max_draft_is_refused():
    with pytest.raises(ValueError, match="kind history or mixed must have depth <= speculative.history.maxDraft"):
        SpeculativeSpec(arms=[ArmSpec(kind="history", depth=9)])


def test_building_the_arms_allocates_one_drafter_cache(model, monkeypatch):
    """The EAGLE arms (chain, trees, a mixed arm's chain) get the shared cache at construction: no arm
    allocates a KV cache of its own only to have it replaced (a rollout builds its arms afresh)."""
    from tlt.rollout import drafting

    built = []

    class Counting(drafting.EagleCache):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(drafting, "EagleCache", Counting)
    monkeypatch.setattr("tlt.adaptive.arms.EagleCache", Counting)
    arms = [*ARMS, ArmSpec(kind="mixed", depth=3), ArmSpec(kind="history", depth=4)]
    build_arms(
        SpeculativeSpec(mode="tlt", arms=arms),
        embed=model.get_input_embeddings(),
        drafter=_drafter(model),
        max_batch_size=2,
        max_context=64,
    )
    assert len(built) == 1


def test_a_shared_drafter_cache_must_fit_the_arm(model):
    """An EAGLE arm given the arms' shared cache uses it (no cache of its own); one of another drafter, or
    with too few scratch slots for the arm's drafts, is refused with the reason."""
    from tlt.rollout.drafting import EagleCache

    drafter, embed = _drafter(model), model.get_input_embeddings()
    shared = EagleCache(drafter, embed, 2, 64, scratch=2)
    chain = EagleChainDrafter(drafter, embed, 3, max_batch_size=2, max_context=64, state=shared)
    assert chain.state is shared
    with pytest.raises(ValueError, match="scratch"):
        EagleChainDrafter(drafter, embed, 4, max_batch_size=2, max_context=64, state=shared)
    with pytest.raises(ValueError, match="scratch"):
        EagleTreeDrafter(drafter, embed, topk=2, depth=3, budget=4, max_batch_size=2, max_context=64, state=shared)
    other = EagleCache(_drafter(model), embed, 2, 64, scratch=2)
    with pytest.raises(ValueError, match="same drafter"):
        EagleChainDrafter(drafter, embed, 2, max_batch_size=2, max_context=64, state=other)


def test_drafter_graphs_are_those_the_usable_arms_and_sampling_reach():
    spec = SpeculativeSpec(mode="tlt", arms=ARMS + [ArmSpec(kind="mixed", depth=2), ArmSpec(kind="history", depth=4)])
    assert drafter_graphs(spec, sampled=True) == {"chain_depths": [2, 3], "guesses": ["coupled"], "step_widths": [2]}
    assert drafter_graphs(spec, sampled=False)["guesses"] == ["argmax"]
    # a tree of topk 1 runs its levels at width 1; one of depth 1 only its catch-up (width >= 2)
    one = SpeculativeSpec(mode="static", arms=[ArmSpec(kind="tree", depth=3, topk=1)])
    assert drafter_graphs(one, sampled=True) == {"chain_depths": [], "guesses": [], "step_widths": [1, 2]}
    root = SpeculativeSpec(mode="static", arms=[ArmSpec(kind="tree", depth=1, topk=1)])
    assert drafter_graphs(root, sampled=True)["step_widths"] == [2]
    # no EAGLE arm usable: no drafter graph (mode ngram, or only model-free arms)
    empty = {"chain_depths": [], "guesses": [], "step_widths": []}
    assert drafter_graphs(SpeculativeSpec(mode="ngram", arms=ARMS), sampled=True) == empty
    assert drafter_graphs(SpeculativeSpec(mode="off", arms=ARMS), sampled=True) == empty
    free = SpeculativeSpec(mode="tlt", arms=[ArmSpec(kind="plain"), ArmSpec(kind="history", depth=4)])
    assert drafter_graphs(free, sampled=False) == empty
    # mixed arms are dropped with the history store, and their chains with them
    off = SpeculativeSpec(mode="tlt", arms=[ArmSpec(kind="mixed", depth=3)], history={"enabled": False})
    assert drafter_graphs(off, sampled=True) == empty


def test_block_arms_label_width_mode_and_one_drafter_for_every_depth(model):
    arms = [ArmSpec(kind="block", depth=2), ArmSpec(kind="ngram", depth=3), ArmSpec(kind="block", depth=8)]
    assert [arm_label(a) for a in arms] == ["block-d2", "ngram-d3", "block-d8"]
    assert [verify_width(a) for a in arms] == [3, 4, 9]
    assert drafter_steps(arms[2]) == (1, 1), "the simulator charges a block arm one drafter forward"
    assert usable_arms(SpeculativeSpec(mode="ngram", arms=arms)) == [1], "a block drafter is learned"
    block = new_block_drafter(model)
    built = build_arms(
        SpeculativeSpec(mode="static", arms=arms),
        embed=model.get_input_embeddings(),
        drafter=None,
        max_batch_size=2,
        max_context=64,
        block=block,
    )
    assert [type(a.drafter) for a in built] == [BlockChainDrafter, NgramDrafter, BlockChainDrafter]
    assert built[0].drafter.drafter is built[2].drafter.drafter is block
    assert [built[0].drafter.k, built[2].drafter.k] == [2, 8]
    with pytest.raises(ValueError, match="kind block need 2 <= depth <= 8"):
        ArmSpec(kind="block", depth=9)
