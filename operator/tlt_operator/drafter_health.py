"""The run's DrafterHealthy condition, its events and the versions each engine serves, from the coordinator's
progress report (`drafterHealth`: per rollout worker, `tlt.runtime.k8s_slots.health_report`).

Written by the workers, so read as untrusted: an entry that is not {healthy: bool, ...} with numbers where
numbers belong is dropped (logged). A run without a learned drafter reports nothing and gets no condition.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from tlt.spec.status import Condition, DrafterStatus, ServedDrafter, set_condition

log = logging.getLogger(__name__)

KIND = "DrafterHealthy"
_WORKER = re.compile(r"^rollout-[0-9]{1,6}$")


def served_drafters(report: Mapping[str, Any]) -> list[tuple[ServedDrafter, dict[str, Any]]]:
    """Each well-formed worker entry of the report's `drafterHealth`, as its status entry and the raw entry."""
    raw = report.get("drafterHealth")
    if raw is None:
        return []
    if not isinstance(raw, dict):
        log.warning("progress report drafterHealth=%.80r is not an object: ignored", raw)
        return []
    out = []
    for worker, entry in sorted(raw.items()):
        try:
            if not (_WORKER.match(str(worker)) and isinstance(entry, dict) and isinstance(entry.get("healthy"), bool)):
                raise ValueError("not {healthy: bool, ...}")
            for key in ("servedVersion", "acceptLength", "flaggedStep", "flaggedAccept", "previousAccept"):
                value = entry.get(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                    raise ValueError(f"{key} is not a number")
            served = ServedDrafter(
                worker=worker,
                version=entry.get("servedVersion"),
                healthy=entry["healthy"],
                accept_length=entry.get("acceptLength"),
            )
        except (ValueError, ValidationError):
            log.warning("progress report drafterHealth[%.40r]=%.120r is malformed: ignored", worker, entry)
            continue
        out.append((served, entry))
    return out


def _unhealthy_line(served: ServedDrafter, entry: dict[str, Any], hub: int | None) -> str:
    hub_said = f" (hub {hub})" if hub is not None else ""
    accept = entry.get("flaggedAccept", served.accept_length)
    previous = entry.get("previousAccept")
    since = f" after {previous:.2f}" if isinstance(previous, int | float) else ""
    step = f" at step {entry['flaggedStep']}" if isinstance(entry.get("flaggedStep"), int) else ""
    accepted = f"accept length {accept:.2f}" if isinstance(accept, int | float) else "accept length collapsed"
    return f"{served.worker} serves drafter {served.version}{hub_said}: {accepted}{since}{step}"


def drafter_health(
    conditions: list[Condition],
    drafter: DrafterStatus | None,
    report: Mapping[str, Any],
    generation: int,
    now: datetime,
) -> tuple[list[Condition], DrafterStatus | None, list[tuple[str, str, str]]]:
    """`conditions` with DrafterHealthy set from the report, `drafter` with the served versions, and the
    events of a change (Warning DrafterCollapsed, Normal DrafterRecovered); unchanged without a report."""
    entries = served_drafters(report)
    if not entries:
        return conditions, drafter, []
    hub = drafter.version if drafter is not None else None
    versions = [s.version for s, _ in entries if s.version is not None]
    drafter = (drafter or DrafterStatus()).model_copy(
        update={"served": [s for s, _ in entries], "oldest_served": min(versions) if versions else None}
    )
    sick = [(s, e) for s, e in entries if not s.healthy]
    if sick:
        reason = "DrafterCollapsed"
        message = "; ".join(_unhealthy_line(s, e, hub) for s, e in sick)
        message += ": speculative decoding is off on those engines until a newer drafter drafts again"
    else:
        reason = "DraftersHealthy"
        message = f"{len(entries)} engines draft; drafter versions served: " + ", ".join(
            f"{s.worker}={s.version}" for s, _ in entries
        )
    old = next((c for c in conditions if c.type == KIND), None)
    status = "False" if sick else "True"
    new = Condition(
        type=KIND,
        status=status,
        reason=reason,
        message=message[:32768],
        observed_generation=generation,
        last_transition_time=now,
    )
    events: list[tuple[str, str, str]] = []
    if sick and (old is None or old.status != "False" or old.message != new.message):
        events.append(("Warning", reason, message[:1024]))
    elif not sick and old is not None and old.status == "False":
        events.append(("Normal", "DrafterRecovered", message[:1024]))
    return set_condition(conditions, new), drafter, events
