"""What a run's workers reported, read from the ConfigMap `<run>-reports` (`builders.reports`).

Written by the workers, so read as untrusted: a ConfigMap under that name that this run does not
control is ignored (it is someone else's object, and the apply of the run's children reports the
conflict), unreadable values are logged and dropped, and a rollout worker's state counts only for
the pod incarnation that wrote it (`uid`): a replaced pod starts with no reported state, as it would
with no annotation.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from . import names
from .kube import controller_uid

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reports:
    """progress: the coordinator's last report (`{"step": 3, ...}`); states: raw state value per
    rollout worker name (`rollout-<rank>`)."""

    progress: dict[str, Any] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)


def _json_object(raw: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        log.warning("unreadable %s report %.200r: ignored", what, raw)
        return {}
    return value if isinstance(value, dict) else {}


def parse_reports(configmap: dict[str, Any] | None, run_uid: str) -> Reports:
    """The reports in `configmap` (the live object, or None when it does not exist yet)."""
    if configmap is None or controller_uid(configmap) != run_uid:
        return Reports()
    data = configmap.get("data") or {}
    progress = _json_object(data[names.PROGRESS_KEY], "progress") if names.PROGRESS_KEY in data else {}
    states = {
        key.removeprefix(names.STATE_KEY_PREFIX): value
        for key, value in data.items()
        if key.startswith(names.STATE_KEY_PREFIX) and isinstance(value, str)
    }
    return Reports(progress, states)


def state_of_pod(reports: Reports, rank: int, pod_uid: str) -> str | None:
    """Raw state value the rollout worker of `rank` reported from this pod (`pod_uid`), else None.
    A report naming another uid was written by an earlier pod of the same name."""
    raw = reports.states.get(f"rollout-{rank}")
    if raw is None:
        return None
    uid = _json_object(raw, "worker state").get("uid")
    return raw if uid in (None, pod_uid) else None
