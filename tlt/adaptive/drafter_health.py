"""Whether an engine's served drafter still drafts, judged from one step's accept length (pure).

The field's most reported failure is silent: a sync (policy weights every step, a new drafter from the
hub) loses or leaves stale the drafter's weights inside the engine; verification keeps the output exact and
only the speed collapses. Each rollout worker judges its own engine after every step, from the drafts the
engine itself counted (vLLM's spec-decode counters, this engine's `AcceptanceStats`):

- healthy: a step whose accept length is <= `collapsedAt` right after a judged step >= `healthyAt` flags
  the drafter (`drafter.health`);
- flagged: the engine decodes plainly while it is served the drafter version it was flagged with; a newer
  version drafts again on probation, and its first judged step brings the drafter back when its accept
  length is above `collapsedAt` (else that version is flagged in turn);
- a step with fewer than `minRowSteps` drafting row-steps is not judged (the batch stayed above the
  threshold, or SD was off).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from tlt.spec.drafter_health import DrafterHealthSpec

Change = Literal["flagged", "recovered"]


@dataclass(frozen=True)
class DrafterHealth:
    """One engine's drafter: healthy or not, the last judged accept length; when flagged, the step, the
    version served then and the two accept lengths that flagged it."""

    healthy: bool = True
    last_accept: float | None = None
    flagged_step: int | None = None
    flagged_version: int | None = None
    flagged_accept: float | None = None
    previous_accept: float | None = None

    def drafts(self, served: int | None) -> bool:
        """Whether the engine may draft with drafter version `served`: healthy, or a newer version on probation."""
        return self.healthy or served != self.flagged_version

    def report(self) -> dict[str, Any]:
        """The worker's health as its rollout result carries it (JSON-safe)."""
        return {
            "healthy": self.healthy,
            "accept_length": self.last_accept,
            "flagged_step": self.flagged_step,
            "flagged_version": self.flagged_version,
            "flagged_accept": self.flagged_accept,
            "previous_accept": self.previous_accept,
        }


def accept_length(row_steps: int, accepted: int) -> float | None:
    """Tokens a drafting row gained per verification (accepted drafts + the target's own token); None
    without a drafting row-step."""
    if row_steps < 0 or accepted < 0:
        raise ValueError(f"row_steps and accepted must be >= 0, got {row_steps}, {accepted}")
    return (row_steps + accepted) / row_steps if row_steps else None


def judge(
    health: DrafterHealth, *, step: int, served: int | None, row_steps: int, accepted: int, spec: DrafterHealthSpec
) -> tuple[DrafterHealth, Change | None]:
    """`health` after step `step`, in which the engine served drafter version `served` and drafted
    `row_steps` row-steps that accepted `accepted` draft tokens; and what changed ("flagged", "recovered")."""
    accept = accept_length(row_steps, accepted)
    if accept is None or row_steps < spec.min_row_steps:
        return health, None
    if not health.healthy:
        if accept > spec.collapsed_at:
            return DrafterHealth(healthy=True, last_accept=accept), "recovered"
        return replace(health, last_accept=accept, flagged_version=served, flagged_accept=accept), None
    previous = health.last_accept
    if previous is not None and previous >= spec.healthy_at and accept <= spec.collapsed_at:
        flagged = DrafterHealth(False, accept, step, served, accept, previous)
        return flagged, "flagged"
    return replace(health, last_accept=accept), None
