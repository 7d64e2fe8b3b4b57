"""A run's isolation: its Ray token Secret injected by reference into every container,
its NetworkPolicy, its least-privilege worker identity, and the operator RBAC that goes with them;
then the same children made by the operator on the fake API (the token is never rotated)."""

from __future__ import annotations

import base64
import pathlib
from typing import Any

import pytest
import yaml
from _operator_harness import NAMESPACE, Cluster, wait_for
from test_builders import FULL, RUN, TOKEN_SECRET, check_against_model

from tlt.spec.run import POD_OWN_MOUNTS, RunSpec
from tlt_operator import names
from tlt_operator.builders import (
    build_network_policy,
    build_pod,
    build_ray_token_secret,
    build_reports_configmap,
    build_worker_identity,
)
from tlt_operator.lifecycle import desired_pods

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIDECAR = RunSpec.model_validate(
    {"rollout": {"replicas": 2}, "drafter": {"placement": "sidecar", "deviceClassName": "gpu.nvidia.com"}}
)


def _pods(spec: RunSpec) -> list[dict[str, Any]]:
    return [build_pod(RUN, spec, role, rank, TOKEN_SECRET) for role, rank in sorted(desired_pods(spec))]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["spec"]["containers"] + pod["spec"].get("initContainers", [])


@pytest.mark.parametrize("spec", [FULL, SIDECAR])
def test_every_container_uses_token_auth_with_the_runs_secret_by_reference(spec: RunSpec) -> None:
    for pod in _pods(spec):
        for container in _containers(pod):
            env = {e["name"]: e for e in container["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token", pod["metadata"]["name"]
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": TOKEN_SECRET, "key": "token"}, (
                "by reference, never the token itself"
            )


def test_a_pod_template_cannot_turn_token_auth_off() -> None:
    spec = RunSpec.model_validate(
        {
            "verifier": {
                "podTemplate": {
                    "env": [
                        {"name": "RAY_AUTH_MODE", "value": "disabled"},
                        {"name": "RAY_AUTH_TOKEN", "value": "guessable"},
                    ]
                }
            }
        }
    )
    pod = build_pod(RUN, spec, "verifier", 0, TOKEN_SECRET)
    env = [e for e in pod["spec"]["containers"][0]["env"] if e["name"].startswith("RAY_AUTH")]
    assert [e["name"] for e in env] == ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN"]
    assert env[0]["value"] == "token" and "valueFrom" in env[1]


def test_the_token_secret_holds_the_given_token() -> None:
    secret = build_ray_token_secret(RUN, FULL, "s3cr3t")
    assert check_against_model(secret, "V1Secret", "Secret") == []
    assert "name" not in secret["metadata"], "the server names it: no one can plant it under that name first"
    assert secret["metadata"]["generateName"] == names.ray_token_secret_prefix("demo") == "demo-ray-token-"
    assert base64.b64decode(secret["data"]["token"]).decode() == "s3cr3t"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == RUN.uid


def test_network_policy_admits_only_the_runs_pods_and_the_operators_metrics_scrape() -> None:
    policy = build_network_policy(RUN, FULL, "tlt-system")
    assert check_against_model(policy, "V1NetworkPolicy", "NetworkPolicy") == []
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"tlt.dev/run": "demo"}}
    assert spec["policyTypes"] == ["Ingress"]
    own, operator = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"tlt.dev/run": "demo"}}}]}, "no namespaceSelector: same ns"
    assert operator["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert operator["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tlt-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "tlt-operator"}},
        }
    ]


def test_worker_role_grants_a_patch_of_the_runs_reports_and_nothing_on_pods() -> None:
    account, role, binding = build_worker_identity(RUN, FULL)
    for obj, model in ((account, "V1ServiceAccount"), (role, "V1Role"), (binding, "V1RoleBinding")):
        assert check_against_model(obj, model, obj["kind"]) == []
        assert obj["metadata"]["name"] == "demo-worker"
    reports, status = role["rules"]
    assert reports == {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["patch"],
        "resourceNames": ["demo-reports"],
    }
    reports_map = build_reports_configmap(RUN, FULL)
    assert check_against_model(reports_map, "V1ConfigMap", "ConfigMap") == []
    assert reports_map["metadata"]["name"] == "demo-reports" and "data" not in reports_map, (
        "the operator never writes the workers' data (apply merges only what it sends)"
    )
    assert status == {
        "apiGroups": ["tlt.dev"],
        "resources": ["tltrainingruns/status"],
        "verbs": ["get"],
        "resourceNames": ["demo"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-worker", "namespace": "ml"}]


def test_every_pod_runs_as_the_runs_identity_and_only_api_callers_mount_a_token() -> None:
    spec = RunSpec.model_validate({"policy": {"replicas": 2}, "rollout": {"replicas": 2}, "verifier": {"replicas": 1}})
    mounted = {
        p["metadata"]["name"]: (p["spec"]["automountServiceAccountToken"], p["spec"].get("serviceAccountName"))
        for p in _pods(spec)
    }
    assert mounted == {
        "demo-policy-0": (True, "demo-worker"),
        "demo-policy-1": (False, "demo-worker"),
        "demo-rollout-0": (True, "demo-worker"),
        "demo-rollout-1": (True, "demo-worker"),
        "demo-verifier-0": (False, "demo-worker"),
    }
    (policy0,) = [p for p in _pods(FULL) if p["metadata"]["name"] == "demo-policy-0"]
    assert policy0["spec"]["serviceAccountName"] == "tlt-worker", "the template's own account is kept"


def _manifest_docs() -> list[dict[str, Any]]:
    paths = [*(ROOT / "manifests").rglob("*.yaml")]
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict)]


def test_no_shipped_role_patches_every_pod_of_a_namespace() -> None:
    roles = [d for d in _manifest_docs() if d.get("kind") == "Role"]
    for role in roles:
        for rule in role["rules"]:
            namespace_wide = "pods" in rule["resources"] and "patch" in rule["verbs"] and not rule.get("resourceNames")
            assert not namespace_wide, role


def test_operator_may_set_block_owner_deletion() -> None:
    (role,) = [d for d in _manifest_docs() if d.get("kind") == "ClusterRole"]
    assert any("tltrainingruns/finalizers" in r["resources"] and "update" in r["verbs"] for r in role["rules"])


def _secret_token(cluster: Cluster, name: str) -> str:
    return cluster.core.read_namespaced_secret(name, NAMESPACE).data["token"]


def test_operator_makes_the_isolation_children_and_never_rotates_the_token(cluster: Cluster, operator) -> None:
    cluster.create_run("r1", {"rollout": {"replicas": 1}})
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    secret_name = cluster.run("r1")["status"]["rayTokenSecret"]
    assert secret_name.startswith("r1-ray-token-") and len(secret_name) == len("r1-ray-token-") + 5
    token = _secret_token(cluster, secret_name)
    assert len(base64.b64decode(token)) >= 32
    policy = cluster.client.call_api(
        f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies/r1-ray",
        "GET",
        response_type="object",
        _return_http_data_only=True,
    )
    assert policy["spec"]["podSelector"] == {"matchLabels": {"tlt.dev/run": "r1"}}
    role = cluster.client.call_api(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/r1-worker",
        "GET",
        response_type="object",
        _return_http_data_only=True,
    )
    assert role["rules"][0]["resourceNames"] == ["r1-reports"]
    cluster.report("r1", "progress", '{"step": 2}')
    cluster.patch_spec("r1", {"rollout": {"replicas": 2}})
    wait_for("scaled", lambda: "r1-rollout-1" in cluster.pod_names("r1"))
    assert cluster.core.read_namespaced_config_map("r1-reports", NAMESPACE).data == {"progress": '{"step": 2}'}, (
        "reconcile passes leave the workers' reports alone"
    )
    cluster.fail_pod("r1-rollout-0")
    wait_for("restarted", lambda: (cluster.run("r1").get("status") or {}).get("restarts") == 1)
    assert cluster.run("r1")["status"]["rayTokenSecret"] == secret_name
    assert _secret_token(cluster, secret_name) == token, "a later pass must not rotate the run's token"


def test_admission_knows_every_mount_of_the_pod() -> None:
    """checkpoint.claimName may not be mounted over these (tlt.spec.run.POD_OWN_MOUNTS keeps the list)."""
    for pod in _pods(SIDECAR):
        for container in _containers(pod):
            assert {m["mountPath"] for m in container["volumeMounts"]} <= set(POD_OWN_MOUNTS)
