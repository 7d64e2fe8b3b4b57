"""A served drafter that collapses after a sync is flagged within the step, its engine decodes plainly while it
serves that version, and a newer version that drafts well again brings it back (`tlt.adaptive.drafter_health`,
`tlt.workers.drafter_watch`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tlt.adaptive.drafter_health import DrafterHealth, accept_length, judge
from tlt.runtime.k8s_slots import health_report, progress_report
from tlt.runtime.shard_metrics import pool_by_bucket
from tlt.spec.drafter_health import MSG_HEALTH, DrafterHealthSpec
from tlt.workers.drafter_watch import DrafterWatch

SPEC = DrafterHealthSpec()  # collapsedAt 1.05, healthyAt 1.5, minRowSteps 8


def step(health, n, *, served=1, row_steps=100, accept=2.0, spec=SPEC):
    accepted = round((accept - 1) * row_steps)
    return judge(health, step=n, served=served, row_steps=row_steps, accepted=accepted, spec=spec)


def test_accept_length_counts_the_bonus_token():
    assert accept_length(10, 15) == 2.5
    assert accept_length(0, 0) is None
    with pytest.raises(ValueError):
        accept_length(-1, 0)


def test_a_collapse_after_a_healthy_step_is_flagged_in_that_step():
    health, change = step(DrafterHealth(), 1, accept=2.4)
    assert health.healthy and change is None and health.last_accept == pytest.approx(2.4)
    health, change = step(health, 2, served=2, accept=1.0)
    assert change == "flagged" and not health.healthy
    assert (health.flagged_step, health.flagged_version) == (2, 2)
    assert health.previous_accept == pytest.approx(2.4) and health.flagged_accept == pytest.approx(1.0)
    assert not health.drafts(2), "the flagged version does not draft again"
    assert health.drafts(3), "a newer version drafts, on probation"


@pytest.mark.parametrize(
    "previous, now",
    [(1.4, 1.0), (2.0, 1.06), (1.5, 1.2)],
    ids=["previous below healthyAt", "now above collapsedAt", "a dip, not a collapse"],
)
def test_only_healthy_then_collapsed_flags(previous, now):
    health, _ = step(DrafterHealth(), 1, accept=previous)
    health, change = step(health, 2, accept=now)
    assert health.healthy and change is None


def test_the_first_judged_step_and_the_boundaries():
    health, change = step(DrafterHealth(), 1, accept=1.0)
    assert health.healthy and change is None, "nothing to compare the first step with"
    health, _ = step(DrafterHealth(), 1, accept=1.5)
    health, change = step(health, 2, accept=1.05)
    assert change == "flagged", "healthyAt and collapsedAt are inclusive"


def test_a_step_with_too_few_drafting_rows_is_not_judged():
    health, _ = step(DrafterHealth(), 1, accept=3.0)
    same, change = step(health, 2, row_steps=7, accept=1.0)
    assert same == health and change is None
    same, change = judge(health, step=2, served=1, row_steps=0, accepted=0, spec=SPEC)
    assert same == health and change is None


def test_a_newer_drafter_that_drafts_well_recovers_and_a_collapsed_one_stays_off():
    health, _ = step(DrafterHealth(), 1, accept=2.0)
    health, _ = step(health, 2, served=2, accept=1.0)
    stays, change = step(health, 3, served=3, accept=1.02)
    assert change is None and not stays.healthy and stays.flagged_version == 3
    assert not stays.drafts(3) and stays.drafts(4)
    back, change = step(stays, 4, served=4, accept=1.8)
    assert change == "recovered" and back.healthy and back.drafts(4)
    again, change = step(back, 5, served=4, accept=1.0)
    assert change == "flagged", "a recovered drafter is watched as before"


def test_the_spec_orders_its_thresholds():
    with pytest.raises(ValidationError, match=MSG_HEALTH):
        DrafterHealthSpec(collapsed_at=1.5, healthy_at=1.5)
    assert DrafterHealthSpec(collapsed_at=1.2, healthy_at=3.0, min_row_steps=1).healthy_at == 3.0


def test_the_watch_follows_the_served_version_and_reports():
    watch = DrafterWatch(SPEC)
    assert watch.drafts() and watch.served is None
    watch.serve((1, {}))
    first = watch.judge(1, 20, 30, drafted=True)
    assert first["healthy"] and first["served_version"] == 1 and first["change"] is None
    watch.serve(None)  # nothing new: keeps serving version 1
    flagged = watch.judge(2, 20, 0, drafted=True)
    assert flagged["change"] == "flagged" and flagged["flagged_version"] == 1 and not watch.drafts()
    watch.serve((2, {}))
    assert watch.drafts()
    assert watch.judge(3, 20, 20, drafted=True)["change"] == "recovered"


def test_the_progress_report_carries_each_workers_health():
    watch = DrafterWatch(SPEC)
    watch.serve((4, {}))
    watch.judge(1, 10, 10, drafted=True)
    health = watch.judge(2, 10, 0, drafted=True)
    report = progress_report({"step": 2, "drafter_version": 5, "drafter_health": {"rollout-0": health}})
    assert '"drafterHealth":{"rollout-0":{"healthy":false,"servedVersion":4' in report
    assert health_report(health) == {
        "healthy": False,
        "servedVersion": 4,
        "acceptLength": 1.0,
        "flaggedStep": 2,
        "flaggedAccept": 1.0,
        "previousAccept": 2.0,
    }


def test_per_bucket_counts_pool_over_workers():
    pooled = pool_by_bucket([{"4": [2, 6, 3], "1": [1, 3, 3]}, None, {"4": [1, 3, 0]}])
    assert pooled == {"1": [1, 3, 3], "4": [3, 9, 3]}
    assert list(pooled) == ["1", "4"]
