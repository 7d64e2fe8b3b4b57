"""The operator survives what clusters do to it: downtime, restarts mid-pass, API errors, load."""

from __future__ import annotations

import json

import kubernetes
import pytest
from _operator_harness import NAMESPACE, Cluster, running_operator, wait_for

SMALL = {"policy": {"replicas": 1}, "rollout": {"replicas": 2}, "verifier": {"replicas": 1}}
PODS = {"r1-policy-0", "r1-rollout-0", "r1-rollout-1", "r1-verifier-0"}
POD_CREATE = r"^/api/v1/namespaces/[^/]+/pods$"


def _creations(cluster: Cluster, kind: str) -> dict[str, int]:
    """How many times each object of `kind` was created (ADDED events in the fake's history)."""

    def count() -> dict[str, int]:
        seen: dict[str, int] = {}
        for event in cluster.fake.store._history:
            if event.type == "ADDED" and event.obj["kind"] == kind:
                seen[event.obj["metadata"]["name"]] = seen.get(event.obj["metadata"]["name"], 0) + 1
        return seen

    return cluster.fake.call(count)


def test_deleting_a_run_while_the_operator_is_down_completes(cluster: Cluster) -> None:
    with running_operator():
        cluster.create_run("r1", SMALL)
        wait_for("Running", lambda: cluster.phase("r1") == "Running")
    assert not cluster.run("r1")["metadata"].get("finalizers"), "no finalizer may hold the run"
    cluster.delete_run("r1")
    wait_for("run and children gone without an operator", lambda: not cluster.runs() and not cluster.children("r1"))


def test_restart_mid_reconcile_converges_without_duplicates(cluster: Cluster) -> None:
    cluster.fake.faults.add("POST", POD_CREATE, delay=4.0, times=1)
    with running_operator():
        cluster.create_run("r1", SMALL)
        wait_for("a pod creation stuck in flight", lambda: cluster.fake.faults.hits == 1)
    with running_operator():
        wait_for(
            "Running after the restart", lambda: cluster.phase("r1") == "Running" and cluster.pod_names("r1") == PODS
        )
        wait_for("the stuck request landed", lambda: len(_creations(cluster, "Pod")) == 4, timeout=10)
    assert _creations(cluster, "Pod") == {p: 1 for p in PODS}, "each pod created exactly once"
    assert _creations(cluster, "ConfigMap").get("r1-spec") == 1


def test_api_errors_and_timeouts_are_survived(cluster: Cluster, operator) -> None:
    faults = cluster.fake.faults
    faults.add("POST", POD_CREATE, status=500, times=3)
    faults.add("POST", POD_CREATE, status=409, times=1)
    faults.add("PATCH", r"/tltrainingruns/r1/status$", status=500, times=2)
    faults.add("PATCH", r"/tltrainingruns/r1/status$", status=409, times=2)
    faults.add("GET", r"/tltrainingruns/r1$", delay=3.0, times=2)
    faults.add("GET", r"/configmaps/r1-spec$", status=503, times=2)
    faults.add("GET", r"/namespaces/tlt-test/pods$", status=500, times=2)
    cluster.create_run("r1", SMALL)
    wait_for(
        "Running despite the faults",
        lambda: cluster.phase("r1") == "Running" and cluster.pod_names("r1") == PODS,
        timeout=45,
    )
    assert faults.hits == 14, "every injected fault was hit"
    assert cluster.run("r1")["status"]["restarts"] == 0
    assert _creations(cluster, "Pod") == {p: 1 for p in PODS}


def test_invalid_run_is_refused_by_the_api_with_the_servers_message(cluster: Cluster) -> None:
    with pytest.raises(kubernetes.client.ApiException) as caught:
        cluster.create_run("bad", {"drafter": {"minTrainers": 4, "maxTrainers": 2}})
    status = json.loads(caught.value.body)
    assert (caught.value.status, status["reason"]) == (422, "Invalid")
    assert status["message"] == (
        'TLTTrainingRun.tlt.dev "bad" is invalid: spec.drafter: Invalid value: '
        "drafter.minTrainers must be <= drafter.maxTrainers"
    )


@pytest.mark.slow
def test_fifty_runs_created_at_once_all_reach_running(cluster: Cluster, operator) -> None:
    one = {"policy": {"replicas": 1}, "rollout": {"replicas": 1}, "verifier": {"replicas": 1}}
    names = [f"run-{i:02d}" for i in range(50)]
    for name in names:
        cluster.create_run(name, one)
    wait_for(
        "all 50 Running",
        lambda: sum((r.get("status") or {}).get("phase") == "Running" for r in cluster.runs(NAMESPACE)) == 50,
        timeout=120,
    )
    assert len(cluster.core.list_namespaced_pod(NAMESPACE).items) == 150
    assert all(count == 1 for count in _creations(cluster, "Pod").values())
