"""TLT's threshold and buckets as vLLM's dynamic draft table, and the per-bucket plan of a vLLM engine (pure:
no vLLM here; the vLLM tier proves the table reaches vLLM)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tlt.rollout.draft_switch import sd_bucket
from tlt.rollout.vllm.spec_table import drafts_anywhere, k_at, k_table, off_table
from tlt.spec.run import RunSpec
from tlt.workers.vllm_speculation import VllmSpeculation, depth_choices


@pytest.mark.parametrize(
    "threshold, buckets, depths, max_batch, want",
    [
        (8, [1, 2, 4, 8, 16], [4, 4, 3, 2, 2], 32, [(1, 2, 4), (3, 4, 3), (5, 8, 2), (9, 32, 0)]),
        (3, [1, 2, 4], [3, 2, 1], 8, [(1, 1, 3), (2, 2, 2), (3, 3, 1), (4, 8, 0)]),
        (64, [1, 2, 4], [3, 2, 1], 8, [(1, 1, 3), (2, 2, 2), (3, 4, 1), (5, 8, 0)]),
        (0, [1, 2], [3, 3], 8, [(1, 8, 0)]),
        (8, [1, 8], [0, 3], 8, [(1, 1, 0), (2, 8, 3)]),
        (4, [2, 4], [3, 3], 2, [(1, 2, 3)]),
    ],
    ids=["default", "threshold inside a bucket", "threshold past the buckets", "threshold 0", "plain arm", "small"],
)
def test_the_table_covers_every_batch_with_the_rule_of_this_engine(threshold, buckets, depths, max_batch, want):
    table = k_table(threshold, buckets, depths, max_batch)
    assert table == want
    assert table[0][0] == 1 and table[-1][1] == max_batch
    assert all(a[1] + 1 == b[0] for a, b in zip(table, table[1:])), "no gap, no overlap: vLLM's rules"
    for batch in range(1, max_batch + 1):
        bucket = sd_bucket(batch, threshold, buckets)
        assert k_at(table, batch) == (0 if bucket is None else depths[bucket])


def test_bad_tables_are_refused_and_off_drafts_nothing():
    with pytest.raises(ValueError, match="one depth per bucket"):
        k_table(8, [1, 2], [3], 8)
    with pytest.raises(ValueError, match="max_batch"):
        k_table(8, [1], [3], 0)
    assert off_table(16) == [(1, 16, 0)] and not drafts_anywhere(off_table(16))


@dataclass(frozen=True)
class Step:
    running: int
    k: int
    new_tokens: int
    seconds: float


SPEC = RunSpec.model_validate(
    {
        "speculative": {
            "mode": "static",
            "threshold": 4,
            "buckets": [1, 2, 4],
            "arms": [{"kind": "chain", "depth": 2}, {"kind": "chain", "depth": 4}, {"kind": "plain"}],
        },
        "drafter": {"health": {"minRowSteps": 2}},
    }
)


def test_the_bandit_chooses_each_buckets_depth_and_learns_from_its_steps():
    assert depth_choices(SPEC.speculative) == [0, 2, 4]
    plan = VllmSpeculation(SPEC.speculative, SPEC.drafter.health, max_batch=8, seed=0)
    assert plan.start_table() == [(1, 4, 4), (5, 8, 0)], "the deepest until the bandit has chosen"
    seen = set()
    for step in range(1, 4):  # untried arms first: every depth of every bucket within three rollouts
        table = plan.table((1, {}))
        seen |= {(b, plan.depths[a]) for b, a in enumerate(plan.arms)}
        k1, k2, k4 = k_at(table, 1), k_at(table, 2), k_at(table, 4)
        steps = [Step(4, k4, 4, 1.0), Step(4, k4, 4 * (1 + k4), 0.1), Step(2, k2, 2 * (1 + k2), 0.1)]
        steps.append(Step(1, k1, 1 + k1, 0.1))
        out = plan.settle(step, steps, drafts=5, accepted=10)
        assert out["sd_health"]["healthy"]
        if k4:
            assert out["sd_by_bucket"]["4"] == [4, 4 * k4, 4 * k4], "the prefill step is not counted"
    assert seen == {(b, d) for b in range(3) for d in (0, 2, 4)}
    assert plan.bandit.best(2) == 2, "the depth that gained the most tokens per second wins"


def test_a_flagged_drafter_gets_the_table_that_drafts_nothing_until_a_newer_version():
    spec = SPEC.model_copy(deep=True)
    spec.speculative.arms = [a for a in spec.speculative.arms if a.kind != "plain"]
    plan = VllmSpeculation(spec.speculative, spec.drafter.health, max_batch=8, seed=0)
    plan.table((1, {}))
    plan.settle(1, [], drafts=10, accepted=20)
    plan.table((2, {}))
    assert plan.settle(2, [], drafts=10, accepted=0)["sd_health"]["change"] == "flagged"
    assert plan.table(None) == off_table(8) and not plan.drafting
    assert plan.settle(3, [Step(1, 0, 1, 0.1), Step(1, 0, 1, 0.1)], 0, 0)["sd_health"]["drafted"] is False
    assert drafts_anywhere(plan.table((3, {}))) and plan.drafting
