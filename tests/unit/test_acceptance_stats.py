"""`AcceptanceStats`: acceptance pooled, per request and per range of response positions."""

from __future__ import annotations

import pytest

from tlt.rollout.speculative import POSITION_EDGES, AcceptanceStats, position_edge


@pytest.mark.parametrize(
    ("position", "edge"),
    [(0, 0), (31, 0), (32, 32), (63, 32), (64, 64), (127, 64), (128, 128), (255, 128), (256, 256), (10_000, 256)],
)
def test_position_edge_is_the_lower_edge_of_its_range(position, edge):
    assert position_edge(position) == edge and edge in POSITION_EDGES


def test_record_counts_row_steps_and_accepted_drafts_by_the_position_each_step_started_at():
    stats = AcceptanceStats()
    stats.record(["a", "b"], [3, 0], drafted=6, positions=[0, 40])
    stats.record(["a", "b"], [2, 1], drafted=6, positions=[4, 41])
    stats.record(["b"], [3], drafted=3, positions=[300])
    stats.record(["a"], [1], drafted=3)  # no positions given: pooled and per request only
    assert stats.by_position == {0: [2, 5], 32: [2, 1], 256: [1, 3]}
    assert (stats.row_steps, stats.accepted) == (6, 10)
    assert stats.per_request == {"a": [3, 2, 1], "b": [0, 1, 3]}
