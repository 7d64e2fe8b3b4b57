"""No adoption: an object that holds one of a run's child names but is not controlled by the run is never
patched, used, made the run's or deleted; the run stops with condition ChildConflict naming it, creates no
pod, and goes on once the object is gone. The Ray token Secret cannot be planted at all: the server names
it. Each case on the fake API server and on the real one."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
from _operator_harness import NAMESPACE, Cluster, wait_for

from tlt_operator import names

SMALL = {"policy": {"replicas": 1}, "rollout": {"replicas": 1}, "verifier": {"replicas": 0}}


def _apis(cluster: Cluster) -> tuple[Any, Any, Any]:
    return (
        cluster.core,
        kubernetes.client.RbacAuthorizationV1Api(cluster.client),
        kubernetes.client.NetworkingV1Api(cluster.client),
    )


def _planted(kind: str, name: str) -> dict[str, Any]:
    """An object a tenant or an admin made before the run, with no owner."""
    meta = {"name": name, "labels": {"planted": "yes"}}
    return {
        "ServiceAccount": {"metadata": meta},
        "Role": {"metadata": meta, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]},
        "RoleBinding": {
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "someone-elses"},
            "subjects": [{"kind": "User", "name": "alice"}],
        },
        "ConfigMap": {"metadata": meta, "data": {"run.yaml": "not the run's"}},
        "NetworkPolicy": {"metadata": meta, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}},
        "Service": {"metadata": meta, "spec": {"selector": {"app": "db"}, "ports": [{"port": 5432}]}},
        "Secret": {"metadata": meta, "stringData": {"token": "the planter knows this"}},
    }[kind]


def _calls(cluster: Cluster, kind: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """create, read and delete of one kind in the test namespace."""
    core, rbac, net = _apis(cluster)
    api, suffix = {
        "ServiceAccount": (core, "service_account"),
        "Role": (rbac, "role"),
        "RoleBinding": (rbac, "role_binding"),
        "ConfigMap": (core, "config_map"),
        "NetworkPolicy": (net, "network_policy"),
        "Service": (core, "service"),
        "Secret": (core, "secret"),
    }[kind]
    return (
        lambda body: getattr(api, f"create_namespaced_{suffix}")(NAMESPACE, body),
        lambda name: getattr(api, f"read_namespaced_{suffix}")(name, NAMESPACE),
        lambda name: getattr(api, f"delete_namespaced_{suffix}")(name, NAMESPACE),
    )


CHILDREN = [
    ("ServiceAccount", names.worker_account_name),
    ("Role", names.worker_account_name),
    ("RoleBinding", names.worker_account_name),
    ("ConfigMap", names.configmap_name),
    ("ConfigMap", names.reports_name),
    ("NetworkPolicy", names.network_policy_name),
    ("Service", names.service_name),
]


def _condition(cluster: Cluster, run: str, kind: str) -> dict[str, Any] | None:
    conditions = (cluster.run(run).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


@pytest.mark.parametrize(("kind", "child_name"), CHILDREN, ids=[f"{k}-{f.__name__}" for k, f in CHILDREN])
def test_a_name_held_by_another_object_is_a_conflict_never_an_adoption(cluster: Cluster, kind, child_name):
    create, read, delete = _calls(cluster, kind)
    name = child_name("r1")
    create(_planted(kind, name))
    before = cluster.client.sanitize_for_serialization(read(name))
    cluster.create_run("r1", SMALL)
    conflict = wait_for(
        "ChildConflict", lambda: (c := _condition(cluster, "r1", "ChildConflict")) and c["status"] == "True" and c
    )
    assert f"{kind} {name} exists and is not this run's" in conflict["message"], conflict
    assert not cluster.pod_names("r1"), "no pod while a child's name is held by another object"
    after = cluster.client.sanitize_for_serialization(read(name))
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "the object was changed"
    assert not after["metadata"].get("ownerReferences")
    wait_for("a ChildConflict event", lambda: any(e.reason == "ChildConflict" for e in cluster.events()))

    delete(name)
    wait_for(
        "the run goes on once the object is gone", lambda: cluster.pod_names("r1") == {"r1-policy-0", "r1-rollout-0"}
    )
    wait_for("ChildConflict False", lambda: _condition(cluster, "r1", "ChildConflict")["status"] == "False")
    cluster.delete_run("r1")
    wait_for("children gone", lambda: not cluster.children("r1"), timeout=90)


def test_deleting_a_run_leaves_a_conflicting_object_alone(cluster: Cluster):
    create, read, delete = _calls(cluster, "ConfigMap")
    create(_planted("ConfigMap", "r2-spec"))
    cluster.create_run("r2", SMALL)
    wait_for("ChildConflict", lambda: (_condition(cluster, "r2", "ChildConflict") or {}).get("status") == "True")
    cluster.delete_run("r2")
    wait_for("the run gone", lambda: not cluster.runs())
    assert read("r2-spec").data == {"run.yaml": "not the run's"}
    delete("r2-spec")


def test_a_planted_token_secret_is_never_used(cluster: Cluster):
    create, read, delete = _calls(cluster, "Secret")
    planted = ["r3-ray-token", "r3-ray-token-aaaaa"]
    for name in planted:
        create(_planted("Secret", name))
    cluster.create_run("r3", SMALL)
    wait_for("pods", lambda: cluster.pod_names("r3") == {"r3-policy-0", "r3-rollout-0"})
    recorded = cluster.run("r3")["status"]["rayTokenSecret"]
    assert recorded.startswith("r3-ray-token-") and recorded not in planted
    for pod in cluster.pods("r3").values():
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["RAY_AUTH_TOKEN"].value_from.secret_key_ref.name == recorded
    assert not (_condition(cluster, "r3", "ChildConflict") or {}).get("status") == "True"
    for name in planted:
        secret = read(name)
        assert base64.b64decode(secret.data["token"]) == b"the planter knows this"
        assert not secret.metadata.owner_references
        delete(name)


@pytest.mark.parametrize(
    "template",
    [
        {"env": [{"name": "T", "secretKeyRef": {"name": "victim-ray-token-ab12c", "key": "token"}}]},
        {"serviceAccountName": "namespace-admin"},
    ],
    ids=["another-runs-secret", "borrowed-identity"],
)
def test_a_reference_the_run_may_not_make_creates_nothing(cluster: Cluster, template):
    """The API server cannot know the admin's lists, so it accepts the run: the operator refuses it, with
    the field path in `ValidSpec=False`, and creates no child at all."""
    cluster.create_run("r4", {**SMALL, "rollout": {"replicas": 1, "podTemplate": template}})
    condition = wait_for(
        "ValidSpec=False", lambda: (c := _condition(cluster, "r4", "ValidSpec")) and c["status"] == "False" and c
    )
    assert "spec.rollout.podTemplate." in condition["message"], condition
    time.sleep(2.0)  # two more passes of the operator
    assert not cluster.pod_names("r4") and not cluster.children("r4")
    cluster.delete_run("r4")
