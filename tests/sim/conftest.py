"""A cost model with closed-form costs, for checking the simulator against hand-computed step times."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class LinearCost:
    """target: base + per_token * batch * width seconds (context-free); drafter: constant; update: per token."""

    base: float = 0.01
    per_token: float = 0.001
    drafter: float = 0.002
    update_per_token: float = 1e-4
    sync: float = 0.5
    name: str = "linear"

    def target_seconds(self, batch: int, width: int, context: int) -> float:
        return self.base + self.per_token * batch * width

    def drafter_seconds(self, batch: int, context: int) -> float:
        return self.drafter

    def update_seconds(self, tokens: int, gpus: int) -> float:
        return self.update_per_token * tokens / gpus

    def sync_seconds(self) -> float:
        return self.sync


@pytest.fixture
def linear_cost() -> LinearCost:
    return LinearCost()
