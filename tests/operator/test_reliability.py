"""Reconcile survives what a run's own pods and the API throw at it: hostile progress and worker-state
reports, children the API rejects, failures counted per group restart (JobSet's
failurePolicy), disruptions not counted, pods of others left alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from _operator_harness import NAMESPACE, Cluster, wait_for

from tlt.spec.run import RunSpec
from tlt.spec.status import RunStatus, status_patch
from tlt_operator.idleness import parse_worker_state
from tlt_operator.lifecycle import PodView, decide, view_pod
from tlt_operator.reports import parse_reports, state_of_pod

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SPEC = RunSpec.model_validate(
    {"rollout": {"replicas": 4}, "verifier": {"replicas": 0}, "runPolicy": {"backoffLimit": 3}}
)
NAMES = ["r-policy-0", *(f"r-rollout-{i}" for i in range(4))]
HASHES = {n: "h" for n in NAMES}
DEEP = "[" * 100_000 + "]" * 100_000


def _pod(name: str, phase: str = "Running", disrupted: bool = False) -> PodView:
    _, role, rank = name.split("-")
    return PodView(name, f"uid-{name}", role, int(rank), phase, True, True, "h", disrupted)


def _raw_pod(status: dict, annotations: dict | None = None) -> dict:
    return {
        "metadata": {
            "name": "r-rollout-0",
            "uid": "u",
            "labels": {"tlt.dev/role": "rollout", "tlt.dev/rank": "0"},
            "annotations": annotations or {},
            "ownerReferences": [{"uid": "run"}],
        },
        "status": status,
    }


def test_a_head_crash_is_one_restart_of_the_whole_group() -> None:
    pods = [_pod("r-policy-0", "Failed"), *(_pod(f"r-rollout-{i}") for i in range(4))]
    d = decide(SPEC, RunStatus(restarts=0), pods, 1, NOW, HASHES)
    assert d.status.restarts == 1 and d.status.phase == "Restarting"
    assert {p.name for p in d.restart} == set(NAMES), "the workers go with their head"
    later = [_pod("r-policy-0", "Failed"), *(_pod(f"r-rollout-{i}", "Failed") for i in range(4))]
    assert decide(SPEC, RunStatus(restarts=2), later, 1, NOW, HASHES).status.phase == "Restarting", (
        "five failed pods in one pass are one restart (3 <= backoffLimit 3)"
    )


def test_disruptions_are_replaced_without_counting() -> None:
    pods = [
        _pod("r-policy-0"),
        _pod("r-rollout-0", "Failed", disrupted=True),
        *(_pod(f"r-rollout-{i}") for i in (1, 2, 3)),
    ]
    d = decide(SPEC, RunStatus(restarts=3), pods, 1, NOW, HASHES)
    assert d.status.restarts == 3 and d.status.phase == "Restarting" and [p.name for p in d.restart] == ["r-rollout-0"]
    assert view_pod(_raw_pod({"phase": "Failed", "reason": "Evicted"}), "run").disrupted
    preempted = {
        "phase": "Failed",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    }
    assert view_pod(_raw_pod(preempted), "run").disrupted
    assert not view_pod(_raw_pod({"phase": "Failed", "reason": "Error"}), "run").disrupted


def test_progress_outside_the_status_bounds_still_gives_a_writable_status() -> None:
    for progress in (
        {"step": 10**15, "acceptLength": 1e9, "drafterVersion": 2.5, "lastStepSeconds": "x"},
        {"step": True, "activeTrainers": -1},
    ):
        pods = [_pod("r-policy-0"), *(_pod(f"r-rollout-{i}") for i in range(4))]
        status = decide(SPEC, RunStatus(), pods, 1, NOW, HASHES, progress).status
        RunStatus.model_validate(status_patch(status))  # what the status write sends
        assert status.phase == "Running" and status.step is not None and status.step.current == 0


def test_deeply_nested_reports_are_unreadable_not_fatal() -> None:
    configmap = {
        "metadata": {"ownerReferences": [{"uid": "run", "controller": True}]},
        "data": {"progress": DEEP, "state.rollout-0": DEEP},
    }
    reports = parse_reports(configmap, "run")
    assert reports.progress == {}
    assert parse_worker_state("r-rollout-0", state_of_pod(reports, 0, "u")) is None


def _condition(cluster: Cluster, run: str, kind: str) -> dict | None:
    status = cluster.run(run).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def test_a_child_the_api_rejects_is_recorded_as_created_false(cluster: Cluster, operator) -> None:
    cluster.fake.faults.add("POST", r"/namespaces/tlt-test/pods$", status=422, times=1000)
    cluster.create_run("r1", {"rollout": {"replicas": 1}, "verifier": {"replicas": 0}})
    wait_for("Created=False", lambda: (_condition(cluster, "r1", "Created") or {}).get("status") == "False")
    created = _condition(cluster, "r1", "Created")
    assert created["reason"] == "ChildRejected" and "was rejected by the API (422)" in created["message"]
    assert cluster.phase("r1") == "Pending"
    cluster.fake.faults.clear()
    wait_for(
        "Created=True once the pods are made",
        lambda: cluster.phase("r1") == "Running" and _condition(cluster, "r1", "Created")["status"] == "True",
    )


def test_a_hostile_progress_report_does_not_stop_restarts_being_counted(cluster: Cluster, operator) -> None:
    cluster.create_run("r1", {"rollout": {"replicas": 1}, "verifier": {"replicas": 0}})
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    progress = json.dumps({"step": 10**15, "acceptLength": 1e9})
    cluster.core.patch_namespaced_config_map("r1-reports", NAMESPACE, {"data": {"progress": progress}})
    cluster.fail_pod("r1-rollout-0")
    wait_for("the restart is written", lambda: (cluster.run("r1").get("status") or {}).get("restarts") == 1)


def test_a_spec_the_crd_accepts_but_the_operator_cannot_read_is_reported(cluster: Cluster, operator) -> None:
    """The CRD cannot check pod-template label keys (CEL cost); the operator's own check says why."""
    cluster.create_run("r1", {"rollout": {"podTemplate": {"labels": {"bad key": "x"}}}})
    wait_for("ValidSpec=False", lambda: (_condition(cluster, "r1", "ValidSpec") or {}).get("status") == "False")
    condition = _condition(cluster, "r1", "ValidSpec")
    assert condition["reason"] == "InvalidSpec" and "qualified names" in condition["message"]
    assert not cluster.pod_names("r1")
    cluster.replace_spec("r1", lambda spec: spec["rollout"]["podTemplate"].update(labels={"good-key": "x"}))
    wait_for(
        "fixed: Running, ValidSpec=True",
        lambda: cluster.phase("r1") == "Running" and _condition(cluster, "r1", "ValidSpec")["status"] == "True",
    )


def test_held_out_results_stay_in_status_between_evaluations() -> None:
    pods = [_pod("r-policy-0"), *(_pod(f"r-rollout-{i}") for i in range(4))]
    evaluated = decide(SPEC, RunStatus(), pods, 1, NOW, HASHES, {"step": 2, "evalAccuracy": 0.5, "evalReward": 0.6})
    assert (evaluated.status.step.eval_accuracy, evaluated.status.step.eval_reward) == (0.5, 0.6)
    later = decide(SPEC, evaluated.status, pods, 1, NOW, HASHES, {"step": 3})
    assert later.status.step.current == 3 and later.status.step.eval_accuracy == 0.5, "kept until the next one"
    hostile = decide(SPEC, later.status, pods, 1, NOW, HASHES, {"step": 4, "evalAccuracy": 7})
    assert hostile.status.step.eval_accuracy == 0.5, "a value the status cannot take is ignored"


def test_off_policy_fraction_reaches_the_step_status_and_zero_is_kept_as_zero() -> None:
    pods = [_pod("r-policy-0"), *(_pod(f"r-rollout-{i}") for i in range(4))]
    partial = decide(SPEC, RunStatus(), pods, 1, NOW, HASHES, {"step": 2, "offPolicyFraction": 0.3})
    assert partial.status.step.off_policy_fraction == 0.3
    assert status_patch(partial.status)["step"]["offPolicyFraction"] == 0.3
    sync = decide(SPEC, partial.status, pods, 1, NOW, HASHES, {"step": 3, "offPolicyFraction": 0.0})
    assert sync.status.step.off_policy_fraction == 0.0, "a sync step's 0 is a value, not a missing one"
    silent = decide(SPEC, sync.status, pods, 1, NOW, HASHES, {"step": 4})
    assert silent.status.step.off_policy_fraction == 0.0, "kept while a report lacks it"
    hostile = decide(SPEC, partial.status, pods, 1, NOW, HASHES, {"step": 5, "offPolicyFraction": 1.5})
    assert hostile.status.step.off_policy_fraction == 0.3, "a value the status cannot take is ignored"
