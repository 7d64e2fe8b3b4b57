"""Harness of the operator tests: the cluster view, polling, and the operator under `KopfRunner`.

The operator and the tests both reach the fake over HTTP through a kubeconfig: kopf logs in
with the `kubernetes` client's kubeconfig loader, and the operator's own client loads it too.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from fakekube import FakeKube
from fakekube.validation import crd_validator
from kopf.testing import KopfRunner

from tlt.spec.crd import build_crd
from tlt.spec.run import API_GROUP, API_VERSION, PLURAL

# Read once when the handlers module is imported (the timer period is fixed at decoration).
os.environ.setdefault("TLT_OPERATOR_RECONCILE_SECONDS", "1")
os.environ.setdefault("TLT_OPERATOR_REQUEST_TIMEOUT", "2")
os.environ.setdefault("TLT_OPERATOR_WATCH_SECONDS", "20")

NAMESPACE = "tlt-test"
WAIT_S = 30.0


def podgroup_crd(group: str, version: str) -> dict[str, Any]:
    """The PodGroup CRD a cluster with scheduler-plugins or Volcano has installed (schema elided)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"podgroups.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup"},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


class Cluster:
    """The tests' view of the fake cluster, through the `kubernetes` client over HTTP."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        config = kubernetes.client.Configuration()
        config.host = fake.url
        self.client = kubernetes.client.ApiClient(config)
        self.client.user_agent = "tests/operator"  # tells the tests' requests from the operator's
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        self.crds = kubernetes.client.ApiextensionsV1Api(self.client)

    # -- runs ----------------------------------------------------------------------------------
    def create_run(self, name: str, spec: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> dict[str, Any]:
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "TLTTrainingRun",
            "metadata": {"name": name},
            "spec": spec or {},
        }
        return self.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, body)

    def run(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)

    def patch_spec(self, name: str, spec: dict[str, Any], namespace: str = NAMESPACE) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, PLURAL, name, {"spec": spec}
        )

    def replace_spec(
        self, name: str, edit: Callable[[dict[str, Any]], None], namespace: str = NAMESPACE, attempts: int = 10
    ) -> dict[str, Any]:
        """Read-modify-write of the run's spec, as `kubectl edit` does: `edit` changes the spec in
        place, and a 409 (the operator wrote status or annotations in between) means read again."""
        for attempt in range(attempts):
            run = self.run(name, namespace)
            edit(run["spec"])
            try:
                return self.custom.replace_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, PLURAL, name, run
                )
            except kubernetes.client.ApiException as error:
                if error.status != 409 or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def delete_run(self, name: str, namespace: str = NAMESPACE) -> None:
        self.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)

    def runs(self, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL)["items"]

    def phase(self, name: str) -> str | None:
        return (self.run(name).get("status") or {}).get("phase")

    # -- children ------------------------------------------------------------------------------
    def pods(self, run: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        items = self.core.list_namespaced_pod(namespace, label_selector=f"tlt.dev/run={run}").items
        return {p.metadata.name: p for p in items}

    def pod_names(self, run: str) -> set[str]:
        return set(self.pods(run))

    def children(self, run: str, namespace: str = NAMESPACE) -> set[str]:
        """`Kind/name` of every object labelled with the run (pods, ConfigMap, Service, PodGroup)."""
        selector = f"tlt.dev/run={run}"
        found = {f"Pod/{n}" for n in self.pod_names(run)}
        found |= {
            f"ConfigMap/{c.metadata.name}"
            for c in self.core.list_namespaced_config_map(namespace, label_selector=selector).items
        }
        found |= {
            f"Service/{s.metadata.name}"
            for s in self.core.list_namespaced_service(namespace, label_selector=selector).items
        }
        return found

    def fail_pod(self, name: str, namespace: str = NAMESPACE) -> None:
        self.fake.call(lambda: self.fake.kubelet.finish(namespace, name, "Failed", 1))

    def succeed_pod(self, name: str, namespace: str = NAMESPACE) -> None:
        self.fake.call(lambda: self.fake.kubelet.finish(namespace, name, "Succeeded", 0))

    def report(self, run: str, key: str, value: str, namespace: str = NAMESPACE) -> None:
        """What a worker does: one key of the run's reports ConfigMap (`progress`, `state.rollout-<rank>`)."""
        self.core.patch_namespaced_config_map(f"{run}-reports", namespace, {"data": {key: value}})

    def events(self, namespace: str = NAMESPACE) -> list[Any]:
        return self.core.list_namespaced_event(namespace).items


@contextlib.contextmanager
def fake_server(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    """The fake API server (validating as the real one does), reached over a kubeconfig by every client."""
    server = FakeKube(validator_factory=crd_validator).start()
    try:
        kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE))
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        # The client reads $KUBECONFIG once, at import: point its default at this server's file.
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
        yield server
    finally:
        server.stop()


def installed_cluster(server: FakeKube) -> Cluster:
    """The fake with TLT's CRD, the two PodGroup CRDs and the test namespace."""
    cluster = Cluster(server)
    cluster.crds.create_custom_resource_definition(build_crd())
    cluster.crds.create_custom_resource_definition(podgroup_crd("scheduling.x-k8s.io", "v1alpha1"))
    cluster.crds.create_custom_resource_definition(podgroup_crd("scheduling.volcano.sh", "v1beta1"))
    cluster.core.create_namespace({"metadata": {"name": NAMESPACE}})
    return cluster


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`. A check
    that raises KeyError, an API error (an object not there yet) or OSError (a server not
    listening yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(kubernetes.client.ApiException, KeyError, OSError):
            last = check()
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what} (last: {last!r})")


@contextlib.contextmanager
def running_operator() -> Iterator[KopfRunner]:
    """The operator as `kopf run -m tlt_operator.handlers --standalone -A` runs it."""
    args = ["run", "--standalone", "--all-namespaces", "-m", "tlt_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    if runner.exception is not None:
        raise runner.exception
