"""A rollout worker's watch over its engine's served drafter (`tlt.adaptive.drafter_health`), both engines.

The worker tells it which drafter version it loaded (`serve`), asks before each rollout whether the engine
may draft (`drafts`), and hands it the rollout's own draft counts afterwards (`judge`): the result's
`sd_health` is what the coordinator merges into the step's `drafter_health` metrics and the operator into
the run's DrafterHealthy condition. A replaced worker starts healthy: its engine loads every weight anew.
"""

from __future__ import annotations

from typing import Any

from tlt.adaptive.drafter_health import DrafterHealth, judge
from tlt.spec.drafter_health import DrafterHealthSpec


class DrafterWatch:
    """The health of one engine's drafter and the version it serves (None before the first drafter)."""

    def __init__(self, spec: DrafterHealthSpec) -> None:
        self.spec = spec
        self.health = DrafterHealth()
        self.served: int | None = None

    def serve(self, drafter: tuple[int, Any] | None) -> None:
        """The engine was given `drafter` (version, parameters); None keeps the one it serves."""
        if drafter is not None:
            self.served = int(drafter[0])

    def drafts(self) -> bool:
        """Whether the engine may draft this rollout (False: it decodes plainly, its drafter is flagged)."""
        return self.health.drafts(self.served)

    def judge(self, step: int, row_steps: int, accepted: int, *, drafted: bool) -> dict[str, Any]:
        """Judge `step`'s rollout (`row_steps` drafting row-steps, `accepted` draft tokens accepted; `drafted`:
        whether SD was allowed); the result's `sd_health` (JSON-safe)."""
        self.health, change = judge(
            self.health, step=step, served=self.served, row_steps=row_steps, accepted=accepted, spec=self.spec
        )
        return {**self.health.report(), "served_version": self.served, "drafted": drafted, "change": change}
