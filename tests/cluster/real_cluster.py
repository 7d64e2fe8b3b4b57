"""The operator tests' `Cluster` view (tests/operator/_operator_harness.py) over the real control plane, so
one test body runs against the fake API server and the real one: where they disagree, a test fails."""

from __future__ import annotations

import time
from typing import Any

import kubernetes
from _operator_harness import NAMESPACE, Cluster

from tlt.spec.run import API_GROUP, API_VERSION, PLURAL


class RealCluster(Cluster):
    """`Cluster` with the kubelet's part played through the API (status writes, as the node agent does)."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.fake = None
        self.client = api
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.crds = kubernetes.client.ApiextensionsV1Api(api)

    def _finish(self, name: str, namespace: str, phase: str, code: int) -> None:
        status = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "worker",
                    "ready": False,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {"terminated": {"exitCode": code}},
                }
            ],
        }
        self.core.patch_namespaced_pod_status(name, namespace, {"status": status})

    def fail_pod(self, name: str, namespace: str = NAMESPACE) -> None:
        self._finish(name, namespace, "Failed", 1)

    def succeed_pod(self, name: str, namespace: str = NAMESPACE) -> None:
        self._finish(name, namespace, "Succeeded", 0)

    def report(self, run: str, key: str, value: str, namespace: str = NAMESPACE) -> None:
        """What a worker does: one key of the run's reports ConfigMap (`progress`, `state.rollout-<rank>`)."""
        self.core.patch_namespaced_config_map(f"{run}-reports", namespace, {"data": {key: value}})

    def clean(self, timeout: float = 120.0) -> None:
        """Delete every run and pod of the test namespace and wait until nothing of them is left."""
        for run in self.runs():
            self.custom.delete_namespaced_custom_object(
                API_GROUP, API_VERSION, NAMESPACE, PLURAL, run["metadata"]["name"]
            )
        self.core.delete_collection_namespaced_pod(NAMESPACE)
        deadline = time.monotonic() + timeout
        while self.runs() or self.core.list_namespaced_pod(NAMESPACE).items or self._labelled():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the test namespace did not empty: {self._labelled()}")
            time.sleep(0.5)

    def _labelled(self) -> list[Any]:
        selector = "tlt.dev/run"
        return [
            *self.core.list_namespaced_config_map(NAMESPACE, label_selector=selector).items,
            *self.core.list_namespaced_service(NAMESPACE, label_selector=selector).items,
        ]
