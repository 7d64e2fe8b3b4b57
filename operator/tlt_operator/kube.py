"""A small async facade over the `kubernetes` client that speaks plain dicts.

Every call runs the synchronous client in a worker thread with a request timeout. Failures
surface as `KubeError` with the HTTP code (0 for a timeout or a dropped connection), so the
reconciler can tell "already exists" (409 on create), "gone" (404) and "try again later" apart.
Children are applied as DESIGN.md asks: create; on 409 read the live object and, only if this run
controls it, merge-patch the fields we own with a resourceVersion precondition (no server-side apply).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import kubernetes
import urllib3

log = logging.getLogger(__name__)

_PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "PodGroup": "podgroups",
    "TLTTrainingRun": "tltrainingruns",
    "Event": "events",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "Secret": "secrets",
    "NetworkPolicy": "networkpolicies",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
}


class KubeError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: conflicts, throttling, server errors, timeouts."""
        return self.code in (0, 409, 429) or self.code >= 500


def path_of(api_version: str, kind: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    """REST path of a collection or object; `namespace` None: across all namespaces."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{_PLURALS[kind]}" if namespace else f"{base}/{_PLURALS[kind]}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


class ChildConflict(Exception):
    """An object holds a child's name but is not controlled by this run: it is never patched, used or deleted."""

    def __init__(self, kind: str, name: str, holder: str) -> None:
        super().__init__(
            f"{kind} {name} exists and is not this run's (its controller: {holder}); nothing of it was "
            "changed: delete or rename it, or give this run another name"
        )
        self.kind = kind
        self.name = name


def controller_uid(obj: dict[str, Any]) -> str | None:
    """The UID of the object's controller (the ownerReference with `controller: true`), or None."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return next((ref.get("uid") for ref in refs if ref.get("controller")), None)


def holder(obj: dict[str, Any]) -> str:
    """`Kind/name` of the object's controller, for messages."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), None)
    return f"{ref.get('kind')}/{ref.get('name')} (uid {ref.get('uid')})" if ref else "none"


def _contains(live: Any, desired: Any) -> bool:
    """True when every field of `desired` is present with the same value in `live`."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(_contains(live.get(k), v) for k, v in desired.items())
    return bool(live == desired)


class Kube:
    def __init__(self, client: kubernetes.client.ApiClient, timeout_s: float) -> None:
        self._client = client
        self._timeout_s = timeout_s

    @classmethod
    def from_environment(cls, timeout_s: float) -> Kube:
        """In-cluster service account, else the kubeconfig (`$KUBECONFIG` or ~/.kube/config)."""
        config = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=config)
        config.retries = 0
        return cls(kubernetes.client.ApiClient(config), timeout_s)

    def _call(self, method: str, path: str, body: Any, query: list[tuple[str, str]], content_type: str) -> Any:
        try:
            response = self._client.call_api(
                path,
                method,
                query_params=query,
                body=body,
                auth_settings=["BearerToken"],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                _preload_content=False,
                _request_timeout=(self._timeout_s, self._timeout_s),
                _return_http_data_only=True,
            )
        except kubernetes.client.ApiException as exc:
            try:
                message = json.loads(exc.body or "{}").get("message", exc.reason)
            except ValueError:
                message = str(exc.reason)
            raise KubeError(exc.status or 0, message) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, f"{method} {path}: {exc}") from exc
        return json.loads(response.data or b"{}")

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        return await asyncio.to_thread(self._call, method, path, body, list((query or {}).items()), content_type)

    async def get(self, path: str) -> dict[str, Any]:
        return await self.request("GET", path)

    async def list(self, path: str, label_selector: str) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else {}
        return (await self.request("GET", path, query=query))["items"]

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    async def delete(self, path: str, uid: str | None = None) -> bool:
        """Delete (background propagation); False when it was already gone or replaced (uid)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path, body)
        except KubeError as exc:
            if exc.code == 404 or (exc.code == 409 and uid):
                return False
            raise
        return True

    async def apply(self, obj: dict[str, Any]) -> str:
        """Create `obj`, or bring the live object's fields to it; returns created / patched / unchanged.
        One GET in the steady state; a create racing another writer falls back to the patch path. A live
        object that `obj`'s controller (its ownerReference with `controller: true`) does not control is
        never adopted: ChildConflict, and nothing of it is changed."""
        meta = obj["metadata"]
        collection = path_of(obj["apiVersion"], obj["kind"], meta["namespace"])
        path = f"{collection}/{meta['name']}"
        try:
            live = await self.get(path)
        except KubeError as exc:
            if exc.code != 404:
                raise
            try:
                await self.request("POST", collection, obj)
                return "created"
            except KubeError as exc_create:
                if exc_create.code != 409:
                    raise
            live = await self.get(path)
        owner = controller_uid(obj)
        if owner is not None and controller_uid(live) != owner:
            raise ChildConflict(obj["kind"], meta["name"], holder(live))
        desired = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
        if _contains(live, desired):
            return "unchanged"
        patch = {**desired, "metadata": {**meta, "resourceVersion": live["metadata"]["resourceVersion"]}}
        await self.merge_patch(path, patch)
        return "patched"
