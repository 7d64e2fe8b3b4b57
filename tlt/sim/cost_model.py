"""The cost model a simulation runs on: what one engine forward, one drafter step, the policy update
and the weight sync cost on some hardware. Two kinds implement it: `roofline.RooflineCost` (a GPU's
published bandwidth and FLOPs and a model's shape) and `measured.MeasuredCost` (`tlt bench engine`'s
timings on this machine); `profiles.load_cost_model` reads either from a data file."""

from __future__ import annotations

from typing import Protocol


class CostModel(Protocol):
    """Seconds of the operations one RL step is made of, on one rollout replica or the update GPUs."""

    name: str

    def target_seconds(self, batch: int, width: int, context: int) -> float:
        """One target forward of `width` tokens for each of `batch` rows after `context` cached tokens
        (width 1: a plain decode step; width k + 1: verifying k draft tokens; width = prompt: prefill)."""
        ...

    def drafter_seconds(self, batch: int, context: int) -> float:
        """One drafter step (one token for each of `batch` rows)."""
        ...

    def update_seconds(self, tokens: int, gpus: int) -> float:
        """The policy update (log-prob recompute, forward and backward) over `tokens` on `gpus` GPUs."""
        ...

    def sync_seconds(self) -> float:
        """Copying the updated weights into the rollout engines."""
        ...
