"""A core/v1 Event about a run (phase transitions), as `kubectl describe` shows them."""

from __future__ import annotations

import datetime
import uuid
from typing import Any


def build_event(
    run: dict[str, Any], level: str, reason: str, message: str, now: datetime.datetime, component: str = "tlt-operator"
) -> dict[str, Any]:
    """`level` is Normal or Warning. Events are the one child with a unique (not fixed) name."""
    meta = run["metadata"]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name'][:200]}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": run["apiVersion"],
            "kind": run["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "type": level,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
