"""The fake API behaves as a real apiserver where the operator depends on it (see its docstring)."""

from __future__ import annotations

import json
import threading
from typing import Any

import kubernetes
import pytest
from _operator_harness import NAMESPACE, Cluster, wait_for

from tlt.spec.run import API_GROUP, API_VERSION, PLURAL

ApiException = kubernetes.client.ApiException


def _cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


def _error(exc: pytest.ExceptionInfo[ApiException]) -> tuple[int, str, str]:
    body = json.loads(exc.value.body)
    return exc.value.status, body["reason"], body["message"]


def test_metadata_is_assigned_and_resource_versions_increase(cluster: Cluster) -> None:
    a = cluster.core.create_namespaced_config_map(NAMESPACE, _cm("a"))
    b = cluster.core.create_namespaced_config_map(NAMESPACE, _cm("b"))
    assert a.metadata.uid != b.metadata.uid and a.metadata.creation_timestamp is not None
    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    assert a.metadata.namespace == NAMESPACE, "namespace comes from the URL"
    with pytest.raises(ApiException) as exc:
        cluster.core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "c", "namespace": "other"}})
    assert exc.value.status == 400
    with pytest.raises(ApiException) as exc:
        cluster.core.create_namespaced_config_map(NAMESPACE, _cm("a"))
    assert _error(exc) == (409, "AlreadyExists", 'configmaps "a" already exists')
    generated = cluster.core.create_namespaced_config_map(NAMESPACE, {"metadata": {"generateName": "x-"}})
    assert generated.metadata.name.startswith("x-") and len(generated.metadata.name) > 2


def test_label_selectors(cluster: Cluster) -> None:
    cluster.core.create_namespaced_config_map(NAMESPACE, _cm("a", app="x", tier="1"))
    cluster.core.create_namespaced_config_map(NAMESPACE, _cm("b", app="y"))
    cluster.core.create_namespaced_config_map(NAMESPACE, _cm("c"))

    def names(selector: str) -> set[str]:
        items = cluster.core.list_namespaced_config_map(NAMESPACE, label_selector=selector).items
        return {i.metadata.name for i in items}

    assert names("app=x") == {"a"}
    assert names("app!=x") == {"b", "c"}
    assert names("app in (x, y)") == {"a", "b"}
    assert names("app notin (x)") == {"b", "c"}
    assert names("app") == {"a", "b"}
    assert names("!app") == {"c"}
    assert names("app=x,tier=1") == {"a"}


def test_status_subresource_split_and_generation(cluster: Cluster) -> None:
    custom = cluster.custom
    run = cluster.create_run("g", {})
    assert run["metadata"]["generation"] == 1 and "status" not in run
    with_status = custom.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, NAMESPACE, PLURAL, "g", {"status": {"phase": "Running"}}
    )
    assert with_status["status"]["phase"] == "Running" and with_status["metadata"]["generation"] == 1
    ignored = custom.patch_namespaced_custom_object(
        API_GROUP,
        API_VERSION,
        NAMESPACE,
        PLURAL,
        "g",
        {"status": {"phase": "Failed"}, "metadata": {"labels": {"a": "b"}}},
    )
    assert ignored["status"]["phase"] == "Running", "the main resource ignores status"
    assert ignored["metadata"]["generation"] == 1, "metadata changes do not bump generation"
    changed = cluster.patch_spec("g", {"suspend": True})
    assert changed["metadata"]["generation"] == 2
    assert changed["spec"]["algorithm"]["steps"] == 20, "schema defaults applied"


def test_put_and_patch_preconditions(cluster: Cluster) -> None:
    cm = cluster.core.create_namespaced_config_map(NAMESPACE, _cm("a"))
    cm.data = {"k": "w"}
    updated = cluster.core.replace_namespaced_config_map("a", NAMESPACE, cm)
    assert updated.data == {"k": "w"}
    cm.data = {"k": "stale"}
    with pytest.raises(ApiException) as exc:
        cluster.core.replace_namespaced_config_map("a", NAMESPACE, cm)
    code, reason, message = _error(exc)
    assert (code, reason) == (409, "Conflict") and "the object has been modified" in message
    with pytest.raises(ApiException) as exc:
        cluster.core.patch_namespaced_config_map(
            "a", NAMESPACE, {"metadata": {"resourceVersion": cm.metadata.resource_version}, "data": {"k": "x"}}
        )
    assert exc.value.status == 409
    with pytest.raises(ApiException) as exc:
        cluster.core.patch_namespaced_config_map(
            "a",
            NAMESPACE,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
                {"op": "replace", "path": "/data/k", "value": "y"},
            ],
        )
    assert exc.value.status == 422, "a failed JSON-patch test is 422, as kopf expects"


def test_watch_resumes_from_a_resource_version(cluster: Cluster) -> None:
    first = cluster.core.create_namespaced_config_map(NAMESPACE, _cm("a"))
    cluster.core.patch_namespaced_config_map("a", NAMESPACE, {"data": {"k": "2"}})
    cluster.core.delete_namespaced_config_map("a", NAMESPACE)
    threading.Timer(0.3, lambda: cluster.core.create_namespaced_config_map(NAMESPACE, _cm("b"))).start()
    stream = kubernetes.watch.Watch().stream(
        cluster.core.list_namespaced_config_map,
        NAMESPACE,
        resource_version=first.metadata.resource_version,
        timeout_seconds=1,
    )
    seen = [(e["type"], e["object"].metadata.name) for e in stream]
    assert seen == [("MODIFIED", "a"), ("DELETED", "a"), ("ADDED", "b")]
    cluster.fake.call(cluster.fake.store.compact)
    with pytest.raises(ApiException) as exc:
        list(
            kubernetes.watch.Watch().stream(
                cluster.core.list_namespaced_config_map,
                NAMESPACE,
                resource_version=first.metadata.resource_version,
                timeout_seconds=1,
            )
        )
    assert exc.value.status == 410


def test_selector_watch_sees_objects_enter_and_leave(cluster: Cluster) -> None:
    start = cluster.core.create_namespaced_config_map(NAMESPACE, _cm("a", app="y"))
    cluster.core.patch_namespaced_config_map("a", NAMESPACE, {"metadata": {"labels": {"app": "x"}}})
    cluster.core.patch_namespaced_config_map("a", NAMESPACE, {"data": {"k": "2"}})
    cluster.core.patch_namespaced_config_map("a", NAMESPACE, {"metadata": {"labels": {"app": "z"}}})
    stream = kubernetes.watch.Watch().stream(
        cluster.core.list_namespaced_config_map,
        NAMESPACE,
        label_selector="app=x",
        resource_version=start.metadata.resource_version,
        timeout_seconds=1,
    )
    assert [e["type"] for e in stream] == ["ADDED", "MODIFIED", "DELETED"]


def test_finalizers_hold_deletion(cluster: Cluster) -> None:
    cluster.core.create_namespaced_config_map(NAMESPACE, {**_cm("a"), "metadata": {"name": "a", "finalizers": ["x/y"]}})
    cluster.core.delete_namespaced_config_map("a", NAMESPACE)
    held = cluster.core.read_namespaced_config_map("a", NAMESPACE)
    assert held.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as exc:
        cluster.core.patch_namespaced_config_map("a", NAMESPACE, {"metadata": {"finalizers": ["x/y", "x/z"]}})
    assert exc.value.status == 422
    cluster.core.patch_namespaced_config_map("a", NAMESPACE, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as exc:
        cluster.core.read_namespaced_config_map("a", NAMESPACE)
    assert exc.value.status == 404


def test_owner_reference_cascade_and_delete_preconditions(cluster: Cluster) -> None:
    owner = cluster.core.create_namespaced_config_map(NAMESPACE, _cm("owner"))
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    cluster.core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    cluster.core.create_namespaced_config_map(
        NAMESPACE,
        {
            "metadata": {
                "name": "grandchild",
                "ownerReferences": [
                    {
                        **ref,
                        "name": "child",
                        "uid": cluster.core.read_namespaced_config_map("child", NAMESPACE).metadata.uid,
                    }
                ],
            }
        },
    )
    with pytest.raises(ApiException) as exc:
        cluster.core.delete_namespaced_config_map("owner", NAMESPACE, body={"preconditions": {"uid": "other"}})
    assert exc.value.status == 409
    cluster.core.delete_namespaced_config_map("owner", NAMESPACE)
    wait_for(
        "dependents collected",
        lambda: {c.metadata.name for c in cluster.core.list_namespaced_config_map(NAMESPACE).items} == set(),
    )


def test_crd_validation_on_update_too(cluster: Cluster) -> None:
    cluster.create_run("v", {})
    with pytest.raises(ApiException) as exc:
        cluster.patch_spec("v", {"speculative": {"buckets": [4, 2]}})
    code, reason, message = _error(exc)
    assert (code, reason) == (422, "Invalid") and message.startswith('TLTTrainingRun.tlt.dev "v" is invalid: ')
    assert cluster.run("v")["metadata"]["generation"] == 1, "a refused update changes nothing"


def test_unknown_fields_pruned_or_refused_when_strict(cluster: Cluster) -> None:
    body = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "TLTTrainingRun",
        "metadata": {"name": "u"},
        "spec": {"algorithm": {"stepz": 3}},
    }
    with pytest.raises(ApiException) as exc:
        cluster.client.call_api(
            f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{NAMESPACE}/{PLURAL}",
            "POST",
            query_params=[("fieldValidation", "Strict")],
            body=body,
            header_params={"Content-Type": "application/json"},
            _preload_content=False,
        )
    code, reason, message = _error(exc)
    assert (code, reason) == (400, "BadRequest") and 'unknown field "spec.algorithm.stepz"' in message
    stored = cluster.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NAMESPACE, PLURAL, body)
    assert "stepz" not in stored["spec"]["algorithm"], "pruned without strict validation"


def test_injected_timeout_times_the_client_out(cluster: Cluster) -> None:
    cluster.fake.faults.add("GET", r"/configmaps$", delay=1.0, times=10)
    with pytest.raises(Exception) as exc:
        cluster.core.list_namespaced_config_map(NAMESPACE, _request_timeout=(0.2, 0.2))
    assert "timed out" in str(exc.value).lower()


def test_names_and_secrets_as_the_apiserver_has_them(cluster: Cluster) -> None:
    """Held to kube-apiserver 1.36 (tests/cluster runs the same cases there): a name must be a DNS-1123
    subdomain, and a Secret's write-only stringData is folded into data."""
    with pytest.raises(kubernetes.client.ApiException) as caught:
        cluster.core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "ends-with-"}})
    assert caught.value.status == 422
    message = json.loads(caught.value.body)["message"]
    assert 'metadata.name: Invalid value: "ends-with-": a lowercase RFC 1123 subdomain' in message
    cluster.core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    secret = cluster.core.read_namespaced_secret("s", NAMESPACE)
    assert secret.data == {"k": "dg=="} and secret.string_data is None
