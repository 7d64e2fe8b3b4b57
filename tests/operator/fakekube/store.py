"""The object store behind the fake API: what etcd plus the apiserver's registry logic do.

Every write goes through `_commit`, which bumps the one cluster-wide resourceVersion, appends a
watch event to the history and wakes the watchers, so reads, lists and watches agree on ordering.
Garbage collection (the controller-manager's job on a real cluster) runs here asynchronously:
dependents of a removed owner are deleted a moment later, as the real collector does.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from tlt.spec.crd_lint import crd_problems
from tlt.spec.crd_validate import DNS_SUBDOMAIN, DNS_SUBDOMAIN_MSG

from . import selectors
from .api_types import ApiError, WatchEvent, now
from .patching import PatchError, json_patch, merge_patch
from .resources import BUILTIN, ResourceType, from_crd

Obj = dict[str, Any]
_IMMUTABLE_META = (
    "uid",
    "creationTimestamp",
    "name",
    "namespace",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generateName",
)
_GC_DELAY_S = 0.05


def _content(obj: Mapping[str, Any]) -> Obj:
    """What counts for `metadata.generation`: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Store:
    def __init__(self, validator_factory: Any = None) -> None:
        self._validator_factory = validator_factory
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._uids: dict[str, tuple[ResourceType, str, str]] = {}
        self._rv = 0
        self._history: list[WatchEvent] = []
        self._compacted_rv = 0
        self._tick: asyncio.Event | None = None
        self.on_create: list[Callable[[Obj], None]] = []
        for rt in BUILTIN:
            self.register(rt)
        for ns in ("default", "kube-system"):
            self.create(self.types[("", "v1", "namespaces")], "", {"metadata": {"name": ns}})

    # -- registry ------------------------------------------------------------------------------
    def register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt
        self._objects.setdefault(rt.key, {})

    def lookup(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt

    @property
    def resource_version(self) -> int:
        return self._rv

    # -- reads ---------------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self._objects[rt.key].get((namespace, name))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{rt.qualified} "{name}" not found',
                {"name": name, "group": rt.group, "kind": rt.plural},
            )
        return copy.deepcopy(obj)

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        labels_ok = selectors.parse(label_selector)
        fields_ok = selectors.parse(field_selector)
        items = [
            obj
            for (ns, _), obj in sorted(self._objects[rt.key].items())
            if (namespace is None or ns == namespace)
            and labels_ok(obj["metadata"].get("labels") or {})
            and fields_ok(selectors.field_values(obj))
        ]
        return copy.deepcopy(items)

    # -- writes --------------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str, body: Obj, strict: bool = False) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            if ("", namespace) not in self._objects[("", "namespaces")]:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
            meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422,
                    "Invalid",
                    f'{rt.kind} in version "{rt.version}" cannot be handled: '
                    "metadata.name: Required value: name or generateName is required",
                )
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        name = meta["name"]
        if rt.validator is None and (len(name) > 253 or not DNS_SUBDOMAIN.match(name)):  # built-in kinds
            raise ApiError(
                422,
                "Invalid",
                f'{rt.kind} "{name}" is invalid: metadata.name: Invalid value: "{name}": {DNS_SUBDOMAIN_MSG}',
            )
        if (namespace if rt.namespaced else "", name) in self._objects[rt.key]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rt.qualified} "{name}" already exists',
                {"name": name, "group": rt.group, "kind": rt.plural},
            )
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        for transient in ("resourceVersion", "deletionTimestamp", "selfLink", "managedFields"):
            meta.pop(transient, None)
        if "status" in rt.subresources and rt.group not in ("", "apiextensions.k8s.io"):
            obj.pop("status", None)
        if rt.kind == "Pod":
            obj["status"] = {"phase": "Pending"}
        if rt.kind == "Secret" and "stringData" in obj:  # write-only: the server folds it into data
            strings = obj.pop("stringData") or {}
            obj["data"] = {
                **(obj.get("data") or {}),
                **{k: base64.b64encode(v.encode()).decode() for k, v in strings.items()},
            }
        stored = self._commit(rt, self._validate(rt, obj, None, strict), "ADDED")
        if rt.kind == "CustomResourceDefinition":
            self._establish(stored)
        if meta.get("ownerReferences"):
            self._schedule_gc()
        for hook in self.on_create:
            hook(copy.deepcopy(stored))
        return copy.deepcopy(stored)

    def replace(
        self, rt: ResourceType, namespace: str, name: str, body: Obj, subresource: str | None, strict: bool = False
    ) -> Obj:
        old = self.get(rt, namespace, name)
        return self._update(rt, old, copy.deepcopy(body), subresource, strict)

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str | None,
        strict: bool = False,
    ) -> Obj:
        old = self.get(rt, namespace, name)
        try:
            if content_type == "application/json-patch+json":
                if not isinstance(patch, list):
                    raise PatchError("a JSON patch must be a list of operations")
                new = json_patch(old, patch)
            elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                new = merge_patch(old, patch)
            else:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown "
                    f"format - accepted media types include: application/json-patch+json, "
                    f"application/merge-patch+json (got {content_type})",
                )
        except PatchError as exc:
            raise ApiError(
                422 if exc.test_failed else 400,
                "Invalid" if exc.test_failed else "BadRequest",
                f"the server rejected our request due to an error in our request: {exc}",
            ) from exc
        return self._update(rt, old, new, subresource, strict)

    def delete(self, rt: ResourceType, namespace: str, name: str, options: Mapping[str, Any]) -> Obj:
        obj = self.get(rt, namespace, name)
        meta = obj["metadata"]
        pre = options.get("preconditions") or {}
        for field in ("uid", "resourceVersion"):
            if pre.get(field) and pre[field] != meta.get(field):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {rt.qualified} "{name}": '
                    f"Precondition failed: {field} in precondition: {pre[field]}, "
                    f"{field} in object meta: {meta.get(field)}",
                )
        if options.get("propagationPolicy") == "Orphan":
            self._orphan(meta["uid"])
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta.update(deletionTimestamp=now(), deletionGracePeriodSeconds=0)
                obj = self._commit(rt, obj, "MODIFIED")
            return copy.deepcopy(obj)
        return self._remove(rt, obj)

    # -- internals -----------------------------------------------------------------------------
    def _update(self, rt: ResourceType, old: Obj, new: Obj, subresource: str | None, strict: bool = False) -> Obj:
        name = old["metadata"]["name"]
        new_meta = new.setdefault("metadata", {})
        sent_rv = new_meta.get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.qualified} "{name}": the '
                "object has been modified; please apply your changes to the latest version and try again",
                {"name": name, "group": rt.group, "kind": rt.plural},
            )
        if subresource == "status":
            new = {**copy.deepcopy(old), "status": new.get("status")}
            if new["status"] is None:
                new.pop("status")
        else:
            if "status" in rt.subresources:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
            for key in _IMMUTABLE_META:
                if key in old["metadata"]:
                    new_meta[key] = old["metadata"][key]
                else:
                    new_meta.pop(key, None)
            new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        new_meta = new["metadata"]
        new_meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new_meta.get("deletionTimestamp"):
            added = set(new_meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
            if added:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{rt.kind} "{name}" is invalid: metadata.finalizers: Forbidden: '
                    "no new finalizers can be added if the object is being deleted",
                )
        if new == old:
            return old
        if _content(new) != _content(old):
            new_meta["generation"] = old["metadata"].get("generation", 1) + 1
        new = self._validate(rt, new, old, strict)
        new_meta = new["metadata"]
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            return self._remove(rt, new)
        stored = self._commit(rt, new, "MODIFIED")
        if rt.kind == "CustomResourceDefinition":
            self._establish(stored)
        return copy.deepcopy(stored)

    def _validate(self, rt: ResourceType, obj: Obj, old: Obj | None, strict: bool) -> Obj:
        """The object as stored (defaulted, pruned) or ApiError with the apiserver's Status;
        `strict`: the request's `fieldValidation=Strict` (unknown fields refused, not pruned)."""
        if rt.kind == "CustomResourceDefinition" and self._validator_factory is not None:
            problems = crd_problems(obj)
            if problems:
                raise ApiError(
                    422, "Invalid", f'{rt.qualified} "{obj["metadata"]["name"]}" is invalid: ' + "; ".join(problems)
                )
        if rt.validator is None:
            return obj
        stored, status = rt.validator(obj, old, strict)
        if status is not None:
            raise ApiError(status["code"], status["reason"], status["message"], status.get("details"))
        return stored

    def _commit(self, rt: ResourceType, obj: Obj, event_type: str) -> Obj:
        self._rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv)
        namespace = meta.get("namespace", "") if rt.namespaced else ""
        previous = self._objects[rt.key].get((namespace, meta["name"]))
        self._objects[rt.key][(namespace, meta["name"])] = obj
        self._uids[meta["uid"]] = (rt, namespace, meta["name"])
        self._history.append(
            WatchEvent(
                self._rv,
                rt.key,
                namespace,
                event_type,
                copy.deepcopy(obj),
                copy.deepcopy(previous) if event_type == "MODIFIED" else None,
            )
        )
        self._wake()
        return obj

    def _remove(self, rt: ResourceType, obj: Obj) -> Obj:
        self._rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv)
        namespace = meta.get("namespace", "") if rt.namespaced else ""
        self._objects[rt.key].pop((namespace, meta["name"]), None)
        self._uids.pop(meta["uid"], None)
        self._history.append(WatchEvent(self._rv, rt.key, namespace, "DELETED", copy.deepcopy(obj)))
        self._wake()
        self._schedule_gc()
        return copy.deepcopy(obj)

    def _establish(self, crd: Obj) -> None:
        for rt in from_crd(crd, self._validator_factory):
            self.register(rt)

    def _orphan(self, owner_uid: str) -> None:
        for rt, namespace, name in list(self._uids.values()):
            obj = self._objects[rt.key][(namespace, name)]
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == owner_uid for ref in refs):
                kept = [ref for ref in refs if ref.get("uid") != owner_uid]
                self._update(rt, copy.deepcopy(obj), merge_patch(obj, {"metadata": {"ownerReferences": kept}}), None)

    # -- garbage collection (background propagation) ---------------------------------------------
    def _schedule_gc(self) -> None:
        try:
            asyncio.get_running_loop().call_later(_GC_DELAY_S, self.collect_garbage)
        except RuntimeError:
            return

    def collect_garbage(self) -> None:
        """Delete every object whose owners are all gone; drop references to gone owners otherwise."""
        for rt, namespace, name in list(self._uids.values()):
            obj = self._objects[rt.key].get((namespace, name))
            refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
            if not refs:
                continue
            alive = [ref for ref in refs if ref.get("uid") in self._uids]
            if not alive:
                self.delete(rt, namespace, name, {})
            elif len(alive) < len(refs):
                self._update(rt, copy.deepcopy(obj), merge_patch(obj, {"metadata": {"ownerReferences": alive}}), None)

    # -- watching ------------------------------------------------------------------------------
    def _wake(self) -> None:
        if self._tick is not None:
            self._tick.set()
        self._tick = None

    def changed(self) -> asyncio.Event:
        """An event set at the next write."""
        if self._tick is None:
            self._tick = asyncio.Event()
        return self._tick

    def compact(self) -> None:
        """Forget the watch history (etcd compaction): watches from older versions get 410 Gone."""
        self._compacted_rv = self._rv
        self._history.clear()

    def events_since(self, rv: int, key: tuple[str, str], namespace: str | None) -> list[WatchEvent]:
        if rv < self._compacted_rv:
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self._compacted_rv})")
        lo, hi = 0, len(self._history)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._history[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        return [ev for ev in self._history[lo:] if ev.key == key and (namespace is None or ev.namespace == namespace)]
