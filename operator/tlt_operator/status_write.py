"""What a reconcile pass writes about its run: the status, as the smallest merge patch with a
resourceVersion precondition, and events (best effort)."""

from __future__ import annotations

import logging
from typing import Any

from tlt.spec.run import API_GROUP, API_VERSION, KIND
from tlt.spec.status import RunStatus, status_patch

from .kube import Kube, KubeError, path_of

log = logging.getLogger(__name__)
RUN_API = f"{API_GROUP}/{API_VERSION}"


def merge_diff(old: Any, new: Any) -> Any:
    """The smallest JSON merge patch turning `old` into `new` (None: nothing to change)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None if old == new else new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif (sub := merge_diff(old[key], value)) is not None:
            patch[key] = sub
    return patch or None


async def write_status(kube: Kube, run: dict[str, Any], new: RunStatus, restarts_added: int) -> None:
    """Merge-patch only the status fields this pass changed, with a resourceVersion precondition, so
    fields other writers own survive. On a conflict, re-read the run and send the same change again,
    with the restart count re-added on top of the fresh one (the counter that must not be lost)."""
    meta = run["metadata"]
    path = path_of(RUN_API, KIND, meta["namespace"], meta["name"], "status")
    before = status_patch(RunStatus.model_validate(run.get("status") or {}))
    patch = merge_diff(before, status_patch(new))
    for _ in range(3):
        if patch is None:
            return
        try:
            await kube.merge_patch(path, {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": patch})
            return
        except KubeError as exc:
            if exc.code != 409:
                raise
        run = await kube.get(path_of(RUN_API, KIND, meta["namespace"], meta["name"]))
        meta = run["metadata"]
        if restarts_added:
            fresh = RunStatus.model_validate(run.get("status") or {})
            patch = {**patch, "restarts": (fresh.restarts or 0) + restarts_added}
    raise KubeError(409, f"status of {meta['name']} kept changing under the operator")


async def post_event(kube: Kube, event: dict[str, Any]) -> None:
    """Events are best effort: a lost one is logged, never a reason to redo the pass."""
    try:
        await kube.request("POST", path_of("v1", "Event", event["metadata"]["namespace"]), event)
    except KubeError as exc:
        log.warning("event %s not posted: %s", event["reason"], exc)
