"""A run's life through the operator: create -> children -> status -> delete, and the spec's knobs; each
case on the fake API server and on the real control plane (the `cluster` fixture runs both)."""

from __future__ import annotations

import json
import time

from _operator_harness import NAMESPACE, Cluster, wait_for

SMALL = {"policy": {"replicas": 1}, "rollout": {"replicas": 2}, "verifier": {"replicas": 1}}
PODS = {"r1-policy-0", "r1-rollout-0", "r1-rollout-1", "r1-verifier-0"}


def test_create_makes_owned_children_and_reaches_running(cluster: Cluster) -> None:
    run = cluster.create_run("r1", SMALL)
    wait_for("4 pods", lambda: cluster.pod_names("r1") == PODS)
    assert cluster.children("r1") == {f"Pod/{p}" for p in PODS} | {
        "ConfigMap/r1-spec",
        "ConfigMap/r1-reports",
        "Service/r1",
    }
    for pod in cluster.pods("r1").values():
        (ref,) = pod.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("TLTTrainingRun", "r1", run["metadata"]["uid"], True)
    status = wait_for(
        "phase Running",
        lambda: cluster.run("r1").get("status", {}).get("phase") == "Running" and cluster.run("r1")["status"],
    )
    assert status["observedGeneration"] == 1
    assert status["rollout"] == {"desired": 2, "ready": 2, "failed": 0}
    assert status["replicas"] == 2 and status["step"]["total"] == 20
    assert any(c["type"] == "Running" and c["status"] == "True" for c in status["conditions"])
    reasons = wait_for("a Running event", lambda: {e.reason for e in cluster.events()} >= {"AllPodsRunning"})
    assert reasons


def test_delete_removes_children(cluster: Cluster) -> None:
    cluster.create_run("r1", SMALL)
    wait_for("pods", lambda: cluster.pod_names("r1") == PODS)
    cluster.delete_run("r1")
    wait_for("children gone", lambda: not cluster.children("r1"))
    assert not cluster.runs(NAMESPACE)


def test_scale_converges_both_ways(cluster: Cluster) -> None:
    cluster.create_run("r1", SMALL)
    before = wait_for("4 pods", lambda: (p := cluster.pods("r1")).keys() == PODS and p)
    cluster.patch_spec("r1", {"rollout": {"replicas": 3}})
    wait_for("a third rollout pod", lambda: "r1-rollout-2" in cluster.pod_names("r1"))
    after = cluster.pods("r1")
    assert all(after[n].metadata.uid == before[n].metadata.uid for n in PODS), "scaling replaces no pod"
    cluster.custom.patch_namespaced_custom_object_scale(
        "tlt.dev", "v1alpha1", NAMESPACE, "tltrainingruns", "r1", {"spec": {"replicas": 1}}
    )
    wait_for("rollout scaled to 1", lambda: cluster.pod_names("r1") == {"r1-policy-0", "r1-rollout-0", "r1-verifier-0"})
    status = wait_for(
        "status follows the scale",
        lambda: (s := cluster.run("r1")["status"])["replicas"] == 1 and s["observedGeneration"] == 3 and s,
    )
    assert status["rollout"]["desired"] == 1


def test_drift_is_repaired(cluster: Cluster) -> None:
    cluster.create_run("r1", SMALL)
    pods = wait_for("4 pods", lambda: (p := cluster.pods("r1")).keys() == PODS and p)
    cluster.core.delete_namespaced_pod("r1-rollout-1", NAMESPACE)
    cluster.core.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": "r1-rollout-9", "labels": {"tlt.dev/run": "r1", "tlt.dev/role": "rollout"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    wait_for(
        "deleted pod back",
        lambda: (
            cluster.pod_names("r1") == PODS | {"r1-rollout-9"}
            and cluster.pods("r1")["r1-rollout-1"].metadata.uid != pods["r1-rollout-1"].metadata.uid
        ),
    )
    wait_for(
        "Running: a pod the run does not own is neither touched nor counted",
        lambda: cluster.phase("r1") == "Running" and "r1-rollout-9" in cluster.pod_names("r1"),
    )
    cluster.core.delete_namespaced_config_map("r1-spec", NAMESPACE)
    wait_for("ConfigMap back", lambda: "ConfigMap/r1-spec" in cluster.children("r1"))


def test_suspend_removes_pods_and_resume_brings_them_back(cluster: Cluster) -> None:
    cluster.create_run("r1", SMALL)
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    cluster.patch_spec("r1", {"suspend": True})
    wait_for("Suspended without pods", lambda: cluster.phase("r1") == "Suspended" and not cluster.pod_names("r1"))
    conditions = {c["type"]: c["status"] for c in cluster.run("r1")["status"]["conditions"]}
    assert conditions["Suspended"] == "True" and conditions["Running"] == "False"
    assert "ConfigMap/r1-spec" in cluster.children("r1"), "suspend keeps the run's ConfigMap and Service"
    cluster.patch_spec("r1", {"suspend": False})
    wait_for("Running again", lambda: cluster.phase("r1") == "Running" and cluster.pod_names("r1") == PODS)
    conditions = {c["type"]: c["status"] for c in cluster.run("r1")["status"]["conditions"]}
    assert conditions["Suspended"] == "False"


def test_pod_template_change_replaces_pods(cluster: Cluster) -> None:
    cluster.create_run("r1", SMALL)
    wait_for("4 pods", lambda: cluster.pod_names("r1") == PODS)
    cluster.patch_spec("r1", {"rollout": {"image": "registry.example/tlt-worker:0.2.0"}})
    wait_for(
        "rollout pods on the new image",
        lambda: (
            {p.spec.containers[0].image for n, p in cluster.pods("r1").items() if "rollout" in n}
            == {"registry.example/tlt-worker:0.2.0"}
            and cluster.pod_names("r1") == PODS
        ),
    )
    policy_image = cluster.pods("r1")["r1-policy-0"].spec.containers[0].image
    assert policy_image == "ghcr.io/tlt-dev/tlt-worker:0.1.0", "only the changed role's pods are replaced"


def test_progress_reported_by_the_coordinator_reaches_status(cluster: Cluster) -> None:
    cluster.create_run("r1", SMALL)
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    report = (
        '{"step": 3, "lastStepSeconds": 41.5, "offPolicyFraction": 0.25, "drafterVersion": 2, "acceptLength": 3.25, '
        '"activeTrainers": 1}'
    )
    cluster.report("r1", "progress", report)
    status = wait_for("step 3 in status", lambda: (s := cluster.run("r1")["status"])["step"]["current"] == 3 and s)
    assert status["step"] == {"current": 3, "total": 20, "lastStepSeconds": 41.5, "offPolicyFraction": 0.25}
    assert status["drafter"] == {"version": 2, "acceptLength": 3.25, "activeTrainers": 1}


def test_a_collapsed_drafter_reaches_the_status_as_a_condition_with_the_versions(cluster: Cluster) -> None:
    cluster.create_run("r1", SMALL)
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    sick = {"healthy": False, "servedVersion": 3, "acceptLength": 1.0, "flaggedStep": 4, "previousAccept": 2.5}
    health = {"rollout-0": {"healthy": True, "servedVersion": 4, "acceptLength": 2.4}, "rollout-1": sick}
    cluster.report("r1", "progress", json.dumps({"step": 4, "drafterVersion": 4, "drafterHealth": health}))

    def healthy_condition() -> dict | None:
        conditions = (cluster.run("r1").get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "DrafterHealthy"), None)

    cond = wait_for("DrafterHealthy False", lambda: (c := healthy_condition()) and c["status"] == "False" and c)
    assert cond["reason"] == "DrafterCollapsed" and "rollout-1 serves drafter 3 (hub 4)" in cond["message"]
    drafter = cluster.run("r1")["status"]["drafter"]
    assert drafter["version"] == 4 and drafter["oldestServed"] == 3
    assert [(s["worker"], s["version"], s["healthy"]) for s in drafter["served"]] == [
        ("rollout-0", 4, True),
        ("rollout-1", 3, False),
    ]
    wait_for("a DrafterCollapsed Warning", lambda: any(e.reason == "DrafterCollapsed" for e in cluster.events()))
    health["rollout-1"] = {"healthy": True, "servedVersion": 5, "acceptLength": 2.0}
    cluster.report("r1", "progress", json.dumps({"step": 5, "drafterVersion": 5, "drafterHealth": health}))
    wait_for("DrafterHealthy True", lambda: (c := healthy_condition()) and c["status"] == "True")
    wait_for("a DrafterRecovered event", lambda: any(e.reason == "DrafterRecovered" for e in cluster.events()))


def test_succeeded_when_the_coordinator_exits_zero_then_ttl_deletes(cluster: Cluster) -> None:
    cluster.create_run("r1", {**SMALL, "runPolicy": {"ttlSecondsAfterFinished": 2, "cleanPodPolicy": "Running"}})
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    cluster.succeed_pod("r1-policy-0")
    wait_for("Succeeded", lambda: cluster.phase("r1") == "Succeeded")
    wait_for("unfinished pods cleaned, finished one kept", lambda: cluster.pod_names("r1") == {"r1-policy-0"})
    assert cluster.run("r1")["status"]["completionTime"]
    wait_for("run deleted after its TTL", lambda: not cluster.runs())
    wait_for("children gone with it", lambda: not cluster.children("r1"))


def test_another_manager_is_left_alone(cluster: Cluster) -> None:
    cluster.create_run("other", {**SMALL, "managedBy": "kueue.x-k8s.io/multikueue"})
    cluster.create_run("mine", SMALL)
    wait_for("own run Running", lambda: cluster.phase("mine") == "Running")
    wait_for(
        "kopf done with the own run (created after the other)",
        lambda: "tlt.dev/last-handled-configuration" in cluster.run("mine")["metadata"]["annotations"],
    )
    if cluster.fake is not None:
        wait_for(
            "a periodic resync pass",
            lambda: cluster.fake.api.requests.count(("GET", "/apis/tlt.dev/v1alpha1/tltrainingruns")) >= 3,
        )
    else:
        time.sleep(3.0)  # three resync periods of the operator process (TLT_OPERATOR_RECONCILE_SECONDS=1)
    assert not cluster.children("other")
    other = cluster.run("other")
    assert "status" not in other
    assert not [k for k in other["metadata"].get("annotations") or {} if k.startswith("tlt.dev/")]
