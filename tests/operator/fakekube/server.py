"""HTTP front of the fake API: discovery, CRUD, subresources, watch streams and fault injection."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from . import selectors
from .api_types import ApiError, WatchEvent
from .resources import ResourceType
from .store import Store

_TRUE = ("true", "1", "True")
log = logging.getLogger(__name__)


@dataclass
class Fault:
    """An injected failure: `status` answers with that code, `delay` stalls first (a timeout)."""

    method: str
    path: re.Pattern[str]
    status: int | None
    delay: float
    times: int


class Faults:
    """Thread-safe list of injected faults, consumed by matching requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self.hits = 0

    def add(
        self, method: str, path_regex: str, *, status: int | None = None, delay: float = 0.0, times: int = 1
    ) -> None:
        with self._lock:
            self._faults.append(Fault(method.upper(), re.compile(path_regex), status, delay, times))

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.method in (method, "*") and fault.path.search(path) and fault.times > 0:
                    fault.times -= 1
                    self.hits += 1
                    return fault
        return None


def _filtered_type(ev: WatchEvent, labels_ok: Callable[..., bool], fields_ok: Callable[..., bool]) -> str | None:
    """The event a selector-filtered watch sees: an object that starts matching is ADDED, one that
    stops matching is DELETED (as the apiserver's watch cache does), others pass or vanish."""

    def matches(obj: dict[str, Any] | None) -> bool:
        return (
            obj is not None
            and labels_ok(obj["metadata"].get("labels") or {})
            and fields_ok(selectors.field_values(obj))
        )

    now, before = matches(ev.obj), matches(ev.previous)
    if ev.type != "MODIFIED" or now == before:
        return ev.type if now else None
    return "ADDED" if now else "DELETED"


def _error(exc: ApiError) -> web.Response:
    return web.json_response(exc.status(), status=exc.code)


@dataclass(frozen=True)
class Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


class Api:
    """aiohttp handlers over one `Store`."""

    def __init__(self, store: Store, faults: Faults) -> None:
        self.store, self.faults = store, faults
        self.requests: list[tuple[str, str]] = []  # (method, path?query) of every request, in order
        self.agents: list[str] = []  # their User-Agent headers

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._inject], client_max_size=3 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    @web.middleware
    async def _inject(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        self.agents.append(request.headers.get("User-Agent", ""))
        fault = self.faults.take(request.method, request.path)
        if fault is not None:
            await asyncio.sleep(fault.delay)
            if fault.status is not None:
                return _error(
                    ApiError(
                        fault.status,
                        "InternalError" if fault.status >= 500 else "Conflict",
                        f"injected fault {fault.status}",
                    )
                )
        return await handler(request)

    # -- discovery -----------------------------------------------------------------------------
    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for group, version, _ in self.store.types:
            if group and version not in groups.setdefault(group, []):
                groups[group].append(version)
        return groups

    def _group(self, name: str, versions: list[str]) -> dict[str, Any]:
        listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": listed, "preferredVersion": listed[0]}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = []
        for (g, v, _), rt in sorted(self.store.types.items()):
            if (g, v) != (group, version):
                continue
            resources.append(
                {
                    "name": rt.plural,
                    "singularName": rt.kind.lower(),
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "shortNames": list(rt.short_names),
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
            )
            for sub in sorted(rt.subresources):
                kind = "Scale" if sub == "scale" else rt.kind
                resources.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}".lstrip("/"),
            "resources": resources,
        }

    def _discovery(self, parts: list[str]) -> dict[str, Any] | None:
        if parts == ["version"]:
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0-tlt-fake", "platform": "linux/amd64"}
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if parts == ["api", "v1"]:
            return self._resource_list("", "v1")
        if parts == ["apis"]:
            groups = [self._group(g, vs) for g, vs in sorted(self._groups().items())]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in self._groups():
            return {"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1], self._groups()[parts[1]])}
        if len(parts) == 3 and parts[0] == "apis" and parts[2] in self._groups().get(parts[1], []):
            return self._resource_list(parts[1], parts[2])
        return None

    # -- routing -------------------------------------------------------------------------------
    def _target(self, parts: list[str]) -> Target:
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and not (group == "" and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        rt = self.store.lookup(group, version, rest[0])
        if rt.namespaced and namespace is None and len(rest) > 1:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return Target(rt, namespace, name, sub)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        try:
            found = self._discovery(parts) if request.method == "GET" else None
            if found is not None:
                return web.json_response(found)
            target = self._target(parts)
            return await self._serve(request, target)
        except ApiError as exc:
            return _error(exc)
        except Exception as exc:  # the fake's own bug: answer as the apiserver does to a panic
            log.exception("fake API failed on %s %s", request.method, request.path)
            return _error(ApiError(500, "InternalError", f"Internal error occurred: {exc}"))

    async def _body(self, request: web.Request) -> Any:
        try:
            return json.loads(await request.read() or b"{}")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from exc

    async def _serve(self, request: web.Request, t: Target) -> web.StreamResponse:
        store, q, ns = self.store, request.query, t.namespace or ""
        strict = q.get("fieldValidation") == "Strict"
        if request.method == "GET" and t.name is None:
            if q.get("watch", "") in _TRUE:
                return await self._watch(request, t)
            items = store.list(t.rt, t.namespace, q.get("labelSelector"), q.get("fieldSelector"))
            return web.json_response(
                {
                    "kind": f"{t.rt.kind}List",
                    "apiVersion": t.rt.api_version,
                    "metadata": {"resourceVersion": str(store.resource_version)},
                    "items": items,
                }
            )
        if t.name is None and request.method == "POST":
            return web.json_response(store.create(t.rt, ns, await self._body(request), strict), status=201)
        if t.name is None:
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on {t.rt.qualified}")
        if t.subresource == "scale":
            return await self._scale(request, t)
        if request.method == "GET":
            return web.json_response(store.get(t.rt, ns, t.name))
        if request.method == "PUT":
            body = await self._body(request)
            return web.json_response(store.replace(t.rt, ns, t.name, body, t.subresource, strict))
        if request.method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            body = await self._body(request)
            return web.json_response(store.patch(t.rt, ns, t.name, content_type, body, t.subresource, strict))
        if request.method == "DELETE":
            options = await self._body(request)
            if "propagationPolicy" in q:
                options["propagationPolicy"] = q["propagationPolicy"]
            return web.json_response(store.delete(t.rt, ns, t.name, options))
        raise ApiError(405, "MethodNotAllowed", f"method {request.method} is not allowed")

    async def _scale(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.rt.scale_paths is not None and t.name is not None
        spec_path, status_path = (p.lstrip(".").split(".") for p in t.rt.scale_paths)
        ns = t.namespace or ""
        if request.method in ("PUT", "PATCH"):
            body = await self._body(request)
            replicas = body.get("spec", {}).get("replicas")
            if not isinstance(replicas, int):
                raise ApiError(422, "Invalid", "spec.replicas: Required value")
            patch: dict[str, Any] = {}
            node = patch
            for key in spec_path[:-1]:
                node = node.setdefault(key, {})
            node[spec_path[-1]] = replicas
            self.store.patch(t.rt, ns, t.name, "application/merge-patch+json", patch, None)
        obj = self.store.get(t.rt, ns, t.name)

        def dig(path: list[str]) -> Any:
            node: Any = obj
            for key in path:
                node = node.get(key, {}) if isinstance(node, dict) else {}
            return node if isinstance(node, int) else 0

        meta = {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")}
        return web.json_response(
            {
                "kind": "Scale",
                "apiVersion": "autoscaling/v1",
                "metadata": meta,
                "spec": {"replicas": dig(spec_path)},
                "status": {"replicas": dig(status_path)},
            }
        )

    async def _watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        store, q = self.store, request.query
        labels_ok = selectors.parse(q.get("labelSelector"))
        fields_ok = selectors.parse(q.get("fieldSelector"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(q.get("timeoutSeconds") or 1800)
        since = q.get("resourceVersion")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(event_type: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": event_type, "object": obj}).encode() + b"\n")

        try:
            if since in (None, "", "0"):
                for obj in store.list(t.rt, t.namespace, q.get("labelSelector"), q.get("fieldSelector")):
                    await send("ADDED", obj)
                cursor = store.resource_version
                if q.get("sendInitialEvents") in _TRUE:
                    await send(
                        "BOOKMARK",
                        {
                            "kind": t.rt.kind,
                            "apiVersion": t.rt.api_version,
                            "metadata": {
                                "resourceVersion": str(cursor),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    )
            else:
                cursor = int(since)
            while loop.time() < deadline:
                changed, latest = store.changed(), store.resource_version
                try:
                    events = store.events_since(cursor, t.rt.key, t.namespace)
                except ApiError as exc:
                    await send("ERROR", exc.status())
                    break
                for ev in events:
                    event_type = _filtered_type(ev, labels_ok, fields_ok)
                    if event_type is not None:
                        await send(event_type, ev.obj)
                cursor = latest
                try:
                    await asyncio.wait_for(changed.wait(), timeout=max(0.0, deadline - loop.time()))
                except TimeoutError:
                    break
            await response.write_eof()
        except ConnectionResetError:
            pass
        return response
