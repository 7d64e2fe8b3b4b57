"""The coordinator's per-step drafter bookkeeping: which drafter is served next and the step's metrics."""

from __future__ import annotations

import pytest

from tlt.drafter.publish import publish_outcome
from tlt.runtime.shard_metrics import drafter_step_metrics

SERVED, CANDIDATE = (3, "served-params"), (5, "candidate-params")


def _result(agree: int, total: int, cand: tuple[int, int] | None = None) -> dict:
    out = {"agree": agree, "agree_total": total}
    if cand is not None:
        out.update(candidate_agree=cand[0], candidate_total=cand[1])
    return out


def test_without_a_candidate_the_served_drafter_stays():
    out, served = publish_outcome(SERVED, None, [_result(5, 10)])
    assert served is SERVED
    assert out == {
        "drafter_served_version": 3,
        "drafter_candidate_version": None,
        "drafter_candidate_agreement": None,
        "drafter_promoted": None,
    }
    assert publish_outcome(None, None, [])[0]["drafter_served_version"] is None


@pytest.mark.parametrize("cand, promoted", [((7, 10), True), ((3, 10), False), ((5, 10), True)])
def test_a_candidate_is_served_next_when_it_agrees_at_least_as_often(cand, promoted):
    # two workers: the served drafter agrees 10 of 20, the candidate cand summed over both halves
    results = [_result(4, 10, (cand[0] - 1, 5)), _result(6, 10, (1, cand[1] - 5))]
    out, served = publish_outcome(SERVED, CANDIDATE, results)
    assert out["drafter_promoted"] is promoted
    assert served == (CANDIDATE if promoted else SERVED)
    assert out["drafter_candidate_version"] == 5 and out["drafter_served_version"] == 3
    assert out["drafter_candidate_agreement"] == pytest.approx(cand[0] / cand[1])


def test_a_candidate_scored_nowhere_is_not_promoted():
    out, served = publish_outcome(SERVED, CANDIDATE, [_result(4, 10)])
    assert out["drafter_promoted"] is False and out["drafter_candidate_agreement"] is None and served is SERVED


def test_step_metrics_weigh_losses_by_optimizer_steps_and_count_only_trainers_that_trained():
    pushes = [
        {"steps": 1, "loss": 4.0, "tokens": 100, "version": 7, "trainer": "w1"},
        {"steps": 3, "loss": 2.0, "tokens": 300, "version": 8, "trainer": "w0"},
    ]
    acks = [
        {"was_training": True, "started_at": 10.0, "stopped_at": 12.5, "requested_at": 20.0, "acked_at": 20.25},
        {"was_training": False, "started_at": 0.0, "stopped_at": 0.0, "requested_at": 20.0, "acked_at": 21.0},
    ]
    m = drafter_step_metrics([_result(3, 4), _result(1, 4)], acks, pushes)
    assert m["drafter_agreement"] == 0.5
    assert m["drafter_version"] == 8 and m["drafter_updates"] == 4 and m["drafter_tokens"] == 400
    assert m["drafter_loss"] == pytest.approx((4.0 + 3 * 2.0) / 4)
    assert m["drafter_trainers"] == ["w0", "w1"]
    assert m["harvested_seconds"] == 2.5 and m["stop_latency_max"] == 0.25
    assert m["trainer_acks"] == acks[:1]


def test_step_metrics_of_a_step_without_training():
    m = drafter_step_metrics([_result(0, 0)], [], [])
    assert m["drafter_agreement"] is None and m["drafter_loss"] is None and m["drafter_version"] is None
    assert m["drafter_updates"] == 0 and m["harvested_seconds"] == 0 and m["stop_latency_max"] is None
