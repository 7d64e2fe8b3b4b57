"""A collapsed drafter reported by the coordinator becomes condition DrafterHealthy False naming the worker and
the versions, a Warning event, and the versions each engine serves in the status; a healthy report turns it
back with a Normal event; malformed reports are ignored."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from tlt.spec.run import RunSpec
from tlt.spec.status import DrafterStatus, RunStatus, status_patch
from tlt_operator.drafter_health import KIND, drafter_health
from tlt_operator.lifecycle import PodView, decide

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SPEC = RunSpec.model_validate({"rollout": {"replicas": 2}, "verifier": {"replicas": 0}})
PODS = [
    PodView("r-policy-0", "u0", "policy", 0, "Running", True, True, "h"),
    PodView("r-rollout-0", "u1", "rollout", 0, "Running", True, True, "h"),
    PodView("r-rollout-1", "u2", "rollout", 1, "Running", True, True, "h"),
]
HASHES = {p.name: "h" for p in PODS}
COLLAPSED = {
    "rollout-0": {"healthy": True, "servedVersion": 5, "acceptLength": 2.3},
    "rollout-1": {
        "healthy": False,
        "servedVersion": 4,
        "acceptLength": 1.0,
        "flaggedStep": 6,
        "flaggedAccept": 1.0,
        "previousAccept": 2.25,
    },
}
HEALTHY = {w: {"healthy": True, "servedVersion": 6, "acceptLength": 2.0} for w in ("rollout-0", "rollout-1")}


def condition(status: RunStatus):
    return next((c for c in status.conditions or [] if c.type == KIND), None)


def test_a_collapse_reaches_the_status_with_the_worker_and_the_versions():
    progress = {"step": 6, "drafterVersion": 5, "drafterHealth": COLLAPSED}
    decision = decide(SPEC, RunStatus(phase="Running"), PODS, 1, NOW, HASHES, progress)
    cond = condition(decision.status)
    assert cond.status == "False" and cond.reason == "DrafterCollapsed"
    assert "rollout-1 serves drafter 4 (hub 5): accept length 1.00 after 2.25 at step 6" in cond.message
    assert "rollout-0" not in cond.message
    assert ("Warning", "DrafterCollapsed", cond.message) in decision.events
    drafter = status_patch(decision.status)["drafter"]
    assert drafter["version"] == 5 and drafter["oldestServed"] == 4
    assert drafter["served"] == [
        {"worker": "rollout-0", "version": 5, "healthy": True, "acceptLength": 2.3},
        {"worker": "rollout-1", "version": 4, "healthy": False, "acceptLength": 1.0},
    ]

    again = decide(SPEC, decision.status, PODS, 1, NOW + timedelta(seconds=5), HASHES, progress)
    assert not [e for e in again.events if e[1] == "DrafterCollapsed"], "one Warning per collapse, not per pass"
    assert condition(again.status).last_transition_time == NOW

    later = NOW + timedelta(seconds=30)
    back = decide(
        SPEC, again.status, PODS, 1, later, HASHES, {"step": 7, "drafterVersion": 6, "drafterHealth": HEALTHY}
    )
    cond = condition(back.status)
    assert cond.status == "True" and cond.reason == "DraftersHealthy" and cond.last_transition_time == later
    assert [e[1] for e in back.events if e[0] == "Normal"] == ["DrafterRecovered"]
    assert status_patch(back.status)["drafter"]["oldestServed"] == 6


def test_no_report_no_condition_and_malformed_entries_are_dropped():
    assert condition(decide(SPEC, RunStatus(phase="Running"), PODS, 1, NOW, HASHES, {"step": 1}).status) is None
    bad = {
        "rollout-0": {"healthy": "no"},
        "rollout-1": {"healthy": False, "servedVersion": "4"},
        "pod/../x": {"healthy": False},
        "rollout-2": {"healthy": True, "servedVersion": 3},
    }
    conditions, drafter, events = drafter_health([], DrafterStatus(version=3), {"drafterHealth": bad}, 1, NOW)
    assert [s.worker for s in drafter.served] == ["rollout-2"] and conditions[0].status == "True" and not events
    assert drafter_health([], None, {"drafterHealth": [1, 2]}, 1, NOW) == ([], None, [])
    json.dumps(status_patch(RunStatus(drafter=drafter)))
