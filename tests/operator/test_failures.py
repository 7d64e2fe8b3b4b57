"""runPolicy: failed pods are replaced until backoffLimit, the deadline fails the run, cleanPodPolicy."""

from __future__ import annotations

from _operator_harness import Cluster, wait_for

SMALL = {"policy": {"replicas": 1}, "rollout": {"replicas": 1}, "verifier": {"replicas": 1}}
PODS = {"r1-policy-0", "r1-rollout-0", "r1-verifier-0"}


def test_failed_pod_is_replaced_then_backoff_limit_fails_the_run(cluster: Cluster, operator) -> None:
    cluster.create_run("r1", {**SMALL, "runPolicy": {"backoffLimit": 1, "cleanPodPolicy": "All"}})
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    first = cluster.pods("r1")["r1-rollout-0"].metadata.uid
    cluster.fail_pod("r1-rollout-0")
    wait_for(
        "failed pod replaced and Running again",
        lambda: cluster.phase("r1") == "Running" and cluster.pods("r1")["r1-rollout-0"].metadata.uid != first,
    )
    status = cluster.run("r1")["status"]
    assert status["restarts"] == 1
    assert "PodFailed" in {e.reason for e in cluster.events()}
    cluster.fail_pod("r1-verifier-0")
    wait_for("Failed", lambda: cluster.phase("r1") == "Failed")
    status = cluster.run("r1")["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "BackoffLimitExceeded")
    assert status["completionTime"]
    wait_for("cleanPodPolicy All removes every pod", lambda: not cluster.pod_names("r1"))
    assert "ConfigMap/r1-spec" in cluster.children("r1")


def test_active_deadline_fails_the_run_and_cleans_running_pods(cluster: Cluster, operator) -> None:
    cluster.create_run("r1", {**SMALL, "runPolicy": {"activeDeadlineSeconds": 2}})
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    wait_for("Failed after the deadline", lambda: cluster.phase("r1") == "Failed", timeout=15)
    reason = next(c["reason"] for c in cluster.run("r1")["status"]["conditions"] if c["type"] == "Failed")
    assert reason == "DeadlineExceeded"
    wait_for("running pods removed (cleanPodPolicy Running)", lambda: not cluster.pod_names("r1"))


def test_final_run_is_not_restarted(cluster: Cluster, operator) -> None:
    cluster.create_run("r1", {**SMALL, "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "None"}})
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    cluster.fail_pod("r1-policy-0")
    wait_for("Failed at the first failure", lambda: cluster.phase("r1") == "Failed")
    wait_for("a few timer passes", lambda: cluster.run("r1")["status"]["completionTime"])
    pods = cluster.pods("r1")
    assert pods.keys() == PODS, "cleanPodPolicy None keeps every pod"
    assert pods["r1-policy-0"].status.phase == "Failed", "a final run's failed pod is not replaced"
