"""The verify cost curve helpers: interpolation, ideal speedup, threshold choice, and a real measurement's shape."""

from __future__ import annotations

import math

import pytest

from tlt.bench.cost_timing import CostPoint, cost_ratio, ideal_speedup, measure_costs, pick_threshold
from tlt.models.tiny import tiny_model

# ratio grows with batch and width: 1 + 0.02 * batch * (width - 1)
POINTS = [CostPoint(b, w, 0.01, 1 + 0.02 * b * (w - 1), 1.0, 2.0) for b in (1, 4, 32) for w in (1, 5, 9)]


def test_cost_ratio_hits_measured_points_and_interpolates_between_them():
    assert math.isclose(cost_ratio(POINTS, 4, 5), 1 + 0.02 * 4 * 4)
    assert math.isclose(cost_ratio(POINTS, 4, 3), (cost_ratio(POINTS, 4, 1) + cost_ratio(POINTS, 4, 5)) / 2)
    between = cost_ratio(POINTS, 18, 9)
    assert cost_ratio(POINTS, 4, 9) < between < cost_ratio(POINTS, 32, 9)
    assert cost_ratio(POINTS, 64, 9) == cost_ratio(POINTS, 32, 9), "clamped past the largest batch"


def test_ideal_speedup_is_accept_length_over_cost_ratio():
    assert ideal_speedup(3.0, 1.5) == 2.0
    with pytest.raises(ValueError, match="ratio"):
        ideal_speedup(3.0, 0.0)


def test_threshold_is_the_largest_batch_where_the_arm_pays():
    # width 9, accept 2: pays while 1 + 0.16 * b < 2, i.e. b < 6.25
    assert pick_threshold(POINTS, 9, 2.0) == 6
    assert pick_threshold(POINTS, 9, 1.0) == 0, "an arm that accepts nothing never pays"


def test_measure_costs_reports_every_pair_with_width_one_as_unit():
    model = tiny_model("qwen2", vocab_size=32, seed=0)
    points = measure_costs(model, batches=[1, 2], widths=[3], context=8, repeats=2)
    assert [(p.batch, p.width) for p in points] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    for p in points:
        assert p.seconds > 0 and p.ratio_min <= p.ratio_max
        if p.width == 1:
            assert p.ratio == 1.0


def test_ideal_speedup_charges_the_drafter_steps():
    assert ideal_speedup(3.0, 1.2, drafter_steps=0.0) == pytest.approx(2.5)
    assert ideal_speedup(3.0, 1.2, drafter_steps=2 * 0.4) == pytest.approx(1.5), "a depth-2 chain: 2 drafter steps"
    with pytest.raises(ValueError, match="drafter_steps"):
        ideal_speedup(3.0, 1.2, drafter_steps=-1.0)


def test_drafter_costs_are_measured_per_batch_and_interpolated():
    from tlt.bench.cost_timing import DrafterCost, drafter_ratio, measure_drafter_costs

    model = tiny_model("qwen2", vocab_size=32, seed=0).eval()
    costs = measure_drafter_costs(model, batches=[1, 4], context=8, repeats=2)
    assert [c.batch for c in costs] == [1, 4]
    assert all(c.seconds > 0 and c.ratio > 0 for c in costs)
    table = [DrafterCost(1, 1e-3, 0.2), DrafterCost(5, 2e-3, 0.6)]
    assert drafter_ratio(table, 3) == pytest.approx(0.4) and drafter_ratio(table, 9) == pytest.approx(0.6)


def test_drafter_costs_with_a_reduced_draft_vocabulary_come_side_by_side():
    from tlt.bench.cost_timing import DrafterCost, drafter_ratio, measure_drafter_costs

    model = tiny_model("qwen2", vocab_size=32, seed=0).eval()
    costs = measure_drafter_costs(model, batches=[1, 2], context=8, repeats=2, draft_vocabs=(0, 8))
    assert [(c.batch, c.draft_vocab) for c in costs] == [(1, 0), (1, 8), (2, 0), (2, 8)]
    assert all(c.seconds > 0 and c.ratio > 0 for c in costs)
    table = [DrafterCost(1, 1e-3, 0.3), DrafterCost(1, 1e-3, 0.1, draft_vocab=8)]
    assert drafter_ratio(table, 1) == pytest.approx(0.3) and drafter_ratio(table, 1, 8) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="draft_vocab=4"):
        drafter_ratio(table, 1, 4)


def test_timed_rounds_run_each_batch_in_rounds_of_its_own():
    """A call right after a larger batch's reads slow: every timed call follows a call of its own batch."""
    from tlt.bench.cost_timing import _timed_rounds

    calls = []
    fns = {(b, w): (lambda b=b, w=w: calls.append((b, w))) for b in (1, 4) for w in (1, 2)}
    ticks = iter(range(1000))
    seconds = _timed_rounds(fns, repeats=3, now=lambda: float(next(ticks)))
    assert all(len(v) == 3 for v in seconds.values())
    first_four = [b for b, _ in calls].index(4)
    assert set(calls[:first_four]) == {(1, 1), (1, 2)} and all(b == 4 for b, _ in calls[first_four:])
    assert calls[:2] == [(1, 1), (1, 2)]  # the block settles into its shapes before its first timed round
