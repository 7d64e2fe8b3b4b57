"""manifests/ and images/: the operator's Deployment, least-privilege RBAC (checked against every
request the operator made in a full scenario), the samples (valid runs) and the Dockerfiles."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from _operator_harness import Cluster, wait_for

from tlt.spec.crd_validate import validate_run

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = ROOT / "manifests" / "base"


def _docs(path: pathlib.Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _rules() -> list[dict[str, Any]]:
    (role,) = [d for d in _docs(BASE / "rbac.yaml") if d["kind"] == "ClusterRole"]
    return role["rules"]


def _verb(method: str, path: str) -> tuple[str, str, str] | None:
    """(apiGroup, resource[/subresource], verb) of one request, as the apiserver's RBAC sees it;
    None for discovery (non-resource URLs every authenticated client may read)."""
    url = urlsplit(path)
    parts = [p for p in url.path.split("/") if p]
    group, rest = ("", parts[2:]) if parts[:1] == ["api"] else (parts[1] if len(parts) > 1 else "", parts[3:])
    if not rest:
        return None
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    watch = parse_qs(url.query).get("watch", [""])[0].lower() in ("true", "1")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "get" if len(rest) > 1 else ("watch" if watch else "list")
    return group, resource, verb


def _allowed(group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in _rules())


def test_deployment_is_one_recreated_nonroot_replica() -> None:
    (deployment,) = _docs(BASE / "deployment.yaml")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert isinstance(pod["securityContext"]["runAsUser"], int) and pod["securityContext"]["runAsNonRoot"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_rbac_has_no_wildcards() -> None:
    for rule in _rules():
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule


def test_rbac_allows_every_request_of_a_full_scenario(cluster: Cluster, operator) -> None:
    spec = {
        "rollout": {"replicas": 2},
        "runPolicy": {"ttlSecondsAfterFinished": 1},
        "schedulingPolicy": {"gang": {}},
    }  # no Kueue queue: replicas are immutable under one
    cluster.create_run("r1", spec)
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    cluster.fail_pod("r1-rollout-1")
    wait_for("restarted", lambda: cluster.run("r1")["status"]["restarts"] == 1 and cluster.phase("r1") == "Running")
    cluster.patch_spec("r1", {"rollout": {"replicas": 1}})
    wait_for("scaled", lambda: "r1-rollout-1" not in cluster.pod_names("r1"))
    cluster.succeed_pod("r1-policy-0")
    wait_for("deleted after its TTL", lambda: not cluster.runs())
    api = cluster.fake.api
    operator_requests = [
        (m, p) for (m, p), agent in zip(api.requests, api.agents, strict=True) if not agent.startswith("tests")
    ]
    used = {v for m, p in operator_requests if (v := _verb(m, p)) is not None}
    assert {v for v in used if not _allowed(*v)} == set()
    assert ("tlt.dev", "tltrainingruns", "delete") in used and ("", "pods", "create") in used
    assert ("scheduling.x-k8s.io", "podgroups", "create") in used, "gang scheduling made its PodGroup"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_kustomize_base_builds() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(BASE)], check=True, capture_output=True, text=True).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out) if d)
    assert kinds == sorted(
        [
            "Namespace",
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Service",
        ]
    )


@pytest.mark.parametrize("sample", ["gang-kueue.yaml", "run.yaml"])
def test_samples_are_valid_runs(sample: str) -> None:
    (run,) = [d for d in _docs(ROOT / "manifests" / "samples" / sample) if d["kind"] == "TLTTrainingRun"]
    result = validate_run(run)
    assert result.ok, result.messages()


@pytest.mark.parametrize("image", ["operator", "worker-cpu", "worker-cuda"])
def test_images_run_as_a_numeric_non_root_user(image: str) -> None:
    text = (ROOT / "images" / f"{image}.Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users and re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", users[-1]), users
