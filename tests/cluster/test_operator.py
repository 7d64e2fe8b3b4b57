"""The operator on a real API server, holding a token of its own ServiceAccount (RBAC as installed by
manifests/base is the real check: a missing verb is a Forbidden in its log), with the real scheduler
placing pods on GPU mock nodes and the garbage collector of kube-controller-manager deleting children."""

from __future__ import annotations

import json
from typing import Any

from kube_view import KubeView, wait_for

GPU_NODES = {"gpu-0", "gpu-1"}


def gpu_run(name: str) -> dict[str, Any]:
    """A run whose policy and rollout pods each ask for a GPU and whose verifier asks for none."""
    gpu = {"cpu": "1", "memory": "1Gi", "gpus": 1}
    return {
        "apiVersion": "tlt.dev/v1alpha1",
        "kind": "TLTTrainingRun",
        "metadata": {"name": name},
        "spec": {
            "policy": {"replicas": 1, "resources": gpu},
            "rollout": {"replicas": 2, "resources": gpu},
            "verifier": {"replicas": 1, "resources": {"cpu": "500m", "memory": "512Mi", "gpus": 0}},
        },
    }


def _bound_and_running(view: KubeView, run: str, count: int) -> dict[str, dict[str, Any]] | None:
    pods = view.pods(run)
    ok = len(pods) == count and all(
        p["spec"].get("nodeName") and p["status"].get("phase") == "Running" for p in pods.values()
    )
    return pods if ok else None


def _pods_state(view: KubeView, run: str) -> list[tuple[str, str, str]]:
    """Each pod's name, phase and deletion time (what a failure shows)."""
    pods = [(n, p["status"].get("phase"), p["metadata"].get("deletionTimestamp")) for n, p in view.pods(run).items()]
    return [*pods, *view.agent.errors[-5:]]


def test_run_reconciles_into_owned_children_that_the_scheduler_places_by_gpu(view):
    view.apply(gpu_run("placed"))
    pods = wait_for("4 pods bound and running", lambda: _bound_and_running(view, "placed", 4), timeout=90)
    status = view.wait_phase("placed", "Running")
    uid = view.run("placed")["metadata"]["uid"]
    for name, pod in pods.items():
        node = pod["spec"]["nodeName"]
        if "-verifier-" in name:
            assert node == "cpu-0", f"{name} asks for no GPU and must stay off the GPU nodes, got {node}"
        else:
            assert node in GPU_NODES, f"{name} asks for a GPU, got node {node}"
        assert pod["spec"]["serviceAccountName"] == "placed-worker"
    children = view.children(uid)
    assert set(children) == {
        "pods",
        "configmaps",
        "services",
        "secrets",
        "serviceaccounts",
        "roles.rbac.authorization.k8s.io",
        "rolebindings.rbac.authorization.k8s.io",
        "networkpolicies.networking.k8s.io",
    }, sorted(children)
    for items in children.values():
        for item in items:
            (ref,) = item["metadata"]["ownerReferences"]
            assert ref["controller"] is True and ref["kind"] == "TLTTrainingRun" and ref["name"] == "placed"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions.get("Running") == "True", status
    assert status["observedGeneration"] == view.run("placed")["metadata"]["generation"]


def test_kubectl_scale_suspend_resume_and_delete_with_garbage_collection(view):
    view.apply(gpu_run("life"))
    wait_for("4 pods running", lambda: _bound_and_running(view, "life", 4), timeout=90)

    view.kubectl("scale", "tltrun/life", "--replicas=3")
    wait_for("3 rollout pods", lambda: _bound_and_running(view, "life", 5), timeout=60)
    assert wait_for("status.replicas 3", lambda: view.status("life").get("replicas") == 3)
    assert view.get("tltrun", "life")["spec"]["rollout"]["replicas"] == 3

    view.kubectl("patch", "tltrun/life", "--type=merge", "-p", json.dumps({"spec": {"suspend": True}}))
    status = view.wait_phase("life", "Suspended")
    assert {c["type"]: c["status"] for c in status["conditions"]}.get("Suspended") == "True"
    wait_for(
        "no pods while suspended", lambda: not view.pods("life"), timeout=60, describe=lambda: _pods_state(view, "life")
    )

    view.kubectl("patch", "tltrun/life", "--type=merge", "-p", json.dumps({"spec": {"suspend": False}}))
    wait_for("5 pods again after resume", lambda: _bound_and_running(view, "life", 5), timeout=90)
    view.wait_phase("life", "Running")

    uid = view.run("life")["metadata"]["uid"]
    view.kubectl("delete", "tltrun/life", "--wait=true", "--timeout=60s")
    wait_for(
        "every child garbage-collected",
        lambda: not view.children(uid) and not view.labelled("life"),
        timeout=120,
        poll=1.0,
    )


def test_the_operators_identity_reads_no_secret(operator_process, installed):
    """The installed RBAC is least privilege where it matters most: the operator creates Secrets (the Ray
    token) but can read none, in any namespace (what a real server answers `kubectl auth can-i`)."""
    config = operator_process.root / "kubeconfig"
    for verb in ("get", "list", "watch"):
        answer = installed.kubectl_result("auth", "can-i", verb, "secrets", "--all-namespaces", kubeconfig_file=config)
        assert answer.stdout.strip() == "no", (verb, answer.stdout, answer.stderr)
    assert (
        installed.kubectl_result(
            "auth", "can-i", "create", "secrets", "-n", "any", kubeconfig_file=config
        ).stdout.strip()
        == "yes"
    )
