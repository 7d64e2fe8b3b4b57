"""A stand-in for the scheduler and kubelets: moves pods through their phases.

With `auto_start`, every new pod becomes Running and Ready shortly after it is created (what a
healthy cluster does); tests end pods with `finish` (Succeeded / Failed with an exit code).
Status is written through the store's status subresource, as a kubelet does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .api_types import ApiError, now
from .store import Store

_START_DELAY_S = 0.05


class Kubelet:
    def __init__(self, store: Store, auto_start: bool = True) -> None:
        self.store = store
        self.auto_start = auto_start
        store.on_create.append(self._created)

    def _created(self, obj: dict[str, Any]) -> None:
        if obj["kind"] == "Pod" and self.auto_start:
            meta = obj["metadata"]
            asyncio.get_running_loop().call_later(
                _START_DELAY_S, self.start, meta["namespace"], meta["name"], meta["uid"]
            )

    def _pods(self) -> Any:
        return self.store.types[("", "v1", "pods")]

    def start(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Pending -> Running and Ready (if the pod still exists and is the same pod)."""
        try:
            pod = self.store.get(self._pods(), namespace, name)
        except ApiError:
            return
        if (uid and pod["metadata"]["uid"] != uid) or pod.get("status", {}).get("phase") != "Pending":
            return
        status = {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "startTime": now(),
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}],
        }
        self.store.replace(self._pods(), namespace, name, {**pod, "status": status}, "status")

    def finish(self, namespace: str, name: str, phase: str, exit_code: int) -> None:
        """End the pod's container: `Succeeded` (exit 0) or `Failed`."""
        pod = self.store.get(self._pods(), namespace, name)
        status = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now()}],
            "containerStatuses": [
                {
                    "name": "worker",
                    "ready": False,
                    "restartCount": 0,
                    "image": "",
                    "imageID": "",
                    "state": {"terminated": {"exitCode": exit_code}},
                }
            ],
        }
        self.store.replace(self._pods(), namespace, name, {**pod, "status": status}, "status")
