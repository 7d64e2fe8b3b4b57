"""What one SD round of an arm yields: its expected accept length, from the drafter's per-token
acceptance rate, which rises with the drafter's training (TLT's idle-time training).

The curve: alpha(t) = alpha_max - (alpha_max - alpha0) * exp(-t / tau), t the drafter's accumulated
training in GPU-seconds (a static drafter stays at alpha0). With i.i.d. acceptance a chain of depth d
yields 1 + alpha + ... + alpha^d tokens per round (the target's own token included); a tree with top-k
children per level accepts a level with 1 - (1 - alpha)^k; the n-gram drafter has its own fixed rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tlt.spec.run import ArmSpec


@dataclass(frozen=True)
class AcceptCurve:
    """Per-token acceptance of the learned drafter vs its training; `ngram` is the n-gram drafter's rate."""

    alpha0: float = 0.5
    alpha_max: float = 0.8
    tau: float = 600.0
    ngram: float = 0.3

    def __post_init__(self) -> None:
        for name in ("alpha0", "alpha_max", "ngram"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"accept curve {name} must be in [0, 1), got {getattr(self, name)}")
        if self.alpha_max < self.alpha0:
            raise ValueError(f"accept curve alpha_max ({self.alpha_max}) must be >= alpha0 ({self.alpha0})")
        if self.tau <= 0:
            raise ValueError(f"accept curve tau must be > 0 GPU-seconds, got {self.tau}")

    def alpha(self, trained_seconds: float) -> float:
        return self.alpha_max - (self.alpha_max - self.alpha0) * math.exp(-trained_seconds / self.tau)


def _geometric(alpha: float, depth: int) -> float:
    return sum(alpha**i for i in range(depth + 1))


def accept_length(arm: ArmSpec, alpha: float, ngram_alpha: float) -> float:
    """Expected tokens a row gains in one round of `arm` (>= 1: the target's own token counts)."""
    if arm.kind == "plain":
        return 1.0
    if arm.kind == "ngram":
        return _geometric(ngram_alpha, arm.depth)
    if arm.kind == "tree":
        return _geometric(1.0 - (1.0 - alpha) ** arm.topk, arm.depth)
    return _geometric(alpha, arm.depth)


def drafter_steps(arm: ArmSpec) -> tuple[int, int]:
    """(drafter forwards per round, rows per forward as a multiple of the batch) of `arm`."""
    if arm.kind in ("chain", "tree"):
        return arm.depth, arm.topk if arm.kind == "tree" else 1
    if arm.kind == "block":  # one forward over the anchor and depth masks
        return 1, 1
    return 0, 1


def alpha_for_accept(arm: ArmSpec, target: float) -> float:
    """The per-token acceptance at which `arm` yields `target` tokens per round (bisection; the accept
    length rises with alpha). Raises ValueError for a target the arm cannot reach."""
    if arm.kind in ("plain", "ngram"):
        raise ValueError(f"arm kind {arm.kind!r} does not depend on the learned drafter's acceptance")
    low, high = 0.0, 1.0 - 1e-12
    if not accept_length(arm, low, 0.0) <= target <= accept_length(arm, high, 0.0):
        raise ValueError(
            f"accept length {target} is outside what a {arm.kind} of depth {arm.depth} yields "
            f"({accept_length(arm, low, 0.0):.2f} .. {accept_length(arm, high, 0.0):.2f})"
        )
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if accept_length(arm, mid, 0.0) < target else (low, mid)
    return (low + high) / 2
