"""`algorithm.rollout`: how a step's rollout ends — on-policy (`sync`) or with partial rollouts (`partial`).

sync: every step starts `promptsPerStep` groups and waits for the last response (the lossless step).
partial: a step starts `promptsPerStep x (1 + overProvision)` groups (the kept ones first), ends its rollout
once `promptsPerStep` groups have all their responses, and keeps the unfinished responses (tokens, behaviour
log-probs, the step that sampled each token) to continue them under the next step's weights. A response whose
oldest token is more than `maxStaleness` steps old is dropped with its group and the prompt queued again.
The update corrects for the older tokens with the decoupled PPO objective, its behaviour weight truncated at
`importanceCap` (`tlt.rl.grpo.behaviour_weights`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from tlt.spec.base import Spec

MSG_OVER_PROVISION = (
    "algorithm.rollout.overProvision is for mode: partial (a sync step starts exactly promptsPerStep groups): "
    "set mode: partial or remove overProvision"
)
MSG_STALENESS = (
    "algorithm.rollout.maxStaleness must be >= 1 with mode: partial (0 keeps no response across steps: that is "
    "mode: sync)"
)


class RolloutModeSpec(Spec):
    """Parameters that control when a step's rollout ends and what it keeps for the next step."""

    mode: Literal["sync", "partial"] = Field(
        "sync",
        description="sync: a step waits for every response (on-policy, lossless); partial: a step ends once "
        "promptsPerStep groups are complete and continues the unfinished responses in later steps (off-policy "
        "tokens, corrected in the update).",
    )
    over_provision: float = Field(
        0.0,
        ge=0,
        le=4.0,
        description="partial: extra groups started each step, as a fraction of promptsPerStep (0.25: 10 groups "
        "for 8 prompts), the kept groups among them.",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        le=1000,
        description="partial: the oldest token a trained response may carry, in steps before the update that "
        "trains it; a response past it is dropped with its group and the prompt queued again.",
    )
    importance_cap: float = Field(
        2.0,
        ge=1.0,
        le=100.0,
        description="partial: the truncation of the behaviour importance weight pi_prox / pi_behaviour of an "
        "off-policy token (decoupled PPO).",
    )

    @model_validator(mode="after")
    def _mode_fields(self) -> RolloutModeSpec:
        if self.mode == "sync" and self.over_provision > 0:
            raise ValueError(MSG_OVER_PROVISION)
        if self.mode == "partial" and self.max_staleness < 1:
            raise ValueError(MSG_STALENESS)
        return self

    @property
    def partial(self) -> bool:
        return self.mode == "partial"

    def groups_started(self, prompts_per_step: int) -> int:
        """Groups a step runs: promptsPerStep, or promptsPerStep x (1 + overProvision) rounded up in partial."""
        if not self.partial:
            return prompts_per_step
        return math.ceil(prompts_per_step * (1.0 + self.over_provision) - 1e-9)
