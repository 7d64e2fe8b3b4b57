"""The tests' view of the real cluster through kubectl (as a user has it): runs, their children, polling."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from controlplane import ControlPlane

CHILD_KINDS = (
    "pods",
    "configmaps",
    "services",
    "secrets",
    "serviceaccounts",
    "roles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    "networkpolicies.networking.k8s.io",
)


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 60.0,
    poll: float = 0.5,
    describe: Callable[[], Any] | None = None,
) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` and the last value (or what
    `describe` says then)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what} (last: {describe() if describe else last!r})")


class KubeView:
    def __init__(self, plane: ControlPlane, namespace: str | None = None) -> None:
        self.plane = plane
        self.namespace = namespace or f"t-{uuid.uuid4().hex[:8]}"
        self.agent: Any = None  # the node agent, where a test wants its errors

    def create_namespace(self) -> KubeView:
        self.plane.kubectl("create", "namespace", self.namespace)
        return self

    def delete_namespace(self) -> None:
        self.plane.kubectl("delete", "namespace", self.namespace, "--wait=false")

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.plane.kubectl(*args, "-n", self.namespace, stdin=stdin)

    def apply(self, doc: dict[str, Any]) -> str:
        return self.kubectl("apply", "-f", "-", stdin=json.dumps(doc))

    def get(self, *what: str) -> Any:
        return json.loads(self.kubectl("get", *what, "-o", "json"))

    def run(self, name: str) -> dict[str, Any]:
        return self.get("tltrun", name)

    def status(self, name: str) -> dict[str, Any]:
        return self.run(name).get("status") or {}

    def pods(self, run: str) -> dict[str, dict[str, Any]]:
        items = self.get("pods", "-l", f"tlt.dev/run={run}")["items"]
        return {p["metadata"]["name"]: p for p in items}

    def children(self, run_uid: str) -> dict[str, list[dict[str, Any]]]:
        """Every object of the child kinds in the namespace that names the run as an owner."""
        found: dict[str, list[dict[str, Any]]] = {}
        for kind in CHILD_KINDS:
            for item in self.get(kind)["items"]:
                if any(ref.get("uid") == run_uid for ref in item["metadata"].get("ownerReferences") or []):
                    found.setdefault(kind, []).append(item)
        return found

    def labelled(self, run: str) -> list[str]:
        """`kind/name` of every object of the child kinds labelled with the run."""
        out = []
        for kind in CHILD_KINDS:
            out += [f"{kind}/{i['metadata']['name']}" for i in self.get(kind, "-l", f"tlt.dev/run={run}")["items"]]
        return out

    def wait_phase(self, name: str, phase: str, timeout: float = 90.0) -> dict[str, Any]:
        return wait_for(
            f"{name} in phase {phase}", lambda: (s := self.status(name)).get("phase") == phase and s, timeout
        )
