"""The run spec's `drafter.health`: when a served drafter counts as collapsed (`tlt.adaptive.drafter_health`).

A drafter whose weights were lost or left stale by a sync keeps the output exact (verification is
lossless) and only the speed collapses, with no error: the accept length of the step after the sync
falls to about 1 token a verification. These thresholds say when that is flagged and when a later sync
counts as having brought the drafter back.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from tlt.spec.base import Spec

MSG_HEALTH = "drafter.health.collapsedAt must be below drafter.health.healthyAt"


class DrafterHealthSpec(Spec):
    """Accept lengths (tokens a drafting row gains per verification, the bonus token included)."""

    collapsed_at: float = Field(
        1.05,
        ge=1,
        le=64,
        description="A step whose accept length is at or below this, after a step at or above healthyAt, "
        "flags the engine's drafter: a Warning event, condition DrafterHealthy False, SD off on that engine "
        "until a newer drafter brings the accept length back above it.",
    )
    healthy_at: float = Field(
        1.5, ge=1, le=64, description="Accept length at or above which a step counts as a healthy drafter's."
    )
    min_row_steps: int = Field(
        8,
        ge=1,
        le=1_000_000,
        description="Drafting row-steps a worker's step needs before its accept length is judged at all.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> DrafterHealthSpec:
        if self.collapsed_at >= self.healthy_at:
            raise ValueError(MSG_HEALTH)
        return self
