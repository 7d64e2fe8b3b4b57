"""BEG-MAB: a bucketed epsilon-greedy bandit that picks the speculative-decoding strategy.

One table of arm statistics per running-batch bucket (see `tlt.rollout.draft_switch.bucket_of`):
the best draft depth / top-k / verify budget at batch 1 is not the best at batch 8. A round of
an arm yields accepted tokens (per running row, as the adaptive stepper records it) in some
seconds. An arm's estimate over its last `window` rounds in that bucket is its throughput:
the window's tokens / the window's seconds. Tokens are bursty (a draft chain is accepted whole
or not at all), so a median of per-round rates undervalues every drafting arm against plain
decoding's constant one token a round (measured: docs/measurements-history.md); the window's
throughput is what a rollout gets, and with rounds of unequal length (the simulator's chunks) it
stays exact. A single slow round (a GC pause) counts as the seconds it took, diluted by the window
(64 rounds by default). The window forgets, since the online drafter keeps changing which arm is best.

Unlike the public TLT default, the bandit explores with probability epsilon forever: with a
drafter that improves every RL step, an arm judged bad early must get a second look. Which arm an
exploring round tries (`exploration`):
- "uniform": any arm, equally likely (the paper's BEG-MAB). With many arms most of these rounds go to
  arms the window already knows are far behind, a measurable share of the decode time (plus the EAGLE
  drafter's catch-up after each non-EAGLE round).
- "weighted" (default): arm a with weight max(FLOOR, exp(-gap_a / SCALE)), gap_a = 1 - estimate_a /
  best estimate (0 for the best arm). The window's throughput estimate carries ~5% of noise at 64
  rounds of bursty drafts, so arms within a few SCALEs of the best are the plausible winners and are
  re-tried often; an arm 40% behind is still re-tried, FLOOR times as often as the best, so a drafter
  that improves gets its second look.

Plain-Python bookkeeping, no torch; the RNG is passed in so runs are reproducible.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, get_args

from tlt.spec.run import SpeculativeSpec
from tlt.spec.speculative import Exploration

EXPLORATIONS: tuple[str, ...] = get_args(Exploration)
SCALE = 0.1  # weighted exploration: an arm 10% behind the best is tried e^-1 as often as the best
FLOOR = 0.05  # ... and none less than 1/20 as often


@dataclass(frozen=True)
class ArmStats:
    """What the bandit knows about one arm in one bucket.

    pulls: rounds recorded in total (not only those still in the window).
    estimate: the window's tokens / its seconds (tokens per second); None if untried.
    """

    pulls: int
    estimate: float | None


class BucketedBandit:
    """Epsilon-greedy over `num_arms` arms, with an independent table per bucket; `exploration` picks
    the arm of an exploring round ("weighted" by its shortfall behind the best, or "uniform")."""

    def __init__(
        self,
        num_arms: int,
        num_buckets: int,
        epsilon: float,
        window: int,
        rng: random.Random,
        exploration: Exploration = "weighted",
    ) -> None:
        if num_arms < 1:
            raise ValueError(f"num_arms must be >= 1, got {num_arms}")
        if num_buckets < 1:
            raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if exploration not in EXPLORATIONS:
            raise ValueError(f"exploration must be one of {list(EXPLORATIONS)}, got {exploration!r}")
        self.exploration = exploration
        self.num_arms = num_arms
        self.num_buckets = num_buckets
        self.epsilon = epsilon
        self.window = window
        self.rng = rng
        self._rounds: list[list[deque[tuple[float, float]]]] = [  # (tokens, seconds) per round
            [deque(maxlen=window) for _ in range(num_arms)] for _ in range(num_buckets)
        ]
        self._pulls = [[0] * num_arms for _ in range(num_buckets)]
        self._sums = [[(0.0, 0.0)] * num_arms for _ in range(num_buckets)]  # the window's (tokens, seconds):
        # kept per update, so that choosing (every SD step) reads each arm's estimate in O(1)

    @classmethod
    def from_spec(cls, spec: SpeculativeSpec, rng: random.Random) -> BucketedBandit:
        """One arm per `speculative.arms` entry, one bucket per `speculative.buckets` bound."""
        return cls(len(spec.arms), len(spec.buckets), spec.epsilon, spec.window, rng, spec.exploration)

    def choose(self, bucket: int) -> int:
        """Arm to run next in `bucket`: an untried arm (lowest index) first; then with probability
        epsilon an exploring round (an arm drawn with `exploration_weights`); otherwise the arm with the
        best estimate (lowest index on ties).
        """
        self._check_bucket(bucket)
        for arm, rounds in enumerate(self._rounds[bucket]):
            if not rounds:
                return arm
        if self.rng.random() < self.epsilon:
            if self.exploration == "uniform":
                return self.rng.randrange(self.num_arms)
            return self.rng.choices(range(self.num_arms), weights=self.exploration_weights(bucket))[0]
        return self.best(bucket)

    def exploration_weights(self, bucket: int) -> list[float]:
        """Relative chance of each arm in an exploring round of `bucket` (see the module docstring):
        all 1.0 for "uniform"; for "weighted", max(FLOOR, exp(-gap / SCALE)) by the arm's shortfall
        behind the best estimate (untried arms 1.0)."""
        self._check_bucket(bucket)
        if self.exploration == "uniform":
            return [1.0] * self.num_arms
        estimates = self._estimates(bucket)
        best = max((e for e in estimates if e is not None), default=0.0)
        if best <= 0.0:
            return [1.0] * self.num_arms
        return [1.0 if e is None else max(FLOOR, math.exp(-(1.0 - e / best) / SCALE)) for e in estimates]

    def best(self, bucket: int) -> int:
        """The greedy arm of `bucket` (untried arms count as worst; lowest index wins ties)."""
        self._check_bucket(bucket)
        scored = [(-math.inf if e is None else e, -arm) for arm, e in enumerate(self._estimates(bucket))]
        return -max(scored)[1]

    def update(self, bucket: int, arm: int, accepted_tokens: float, seconds: float) -> float:
        """Record one round of `arm` in `bucket`; returns the round's rate, accepted_tokens / seconds."""
        self._check_bucket(bucket)
        self._check_arm(arm)
        if not (accepted_tokens >= 0 and math.isfinite(accepted_tokens)):
            raise ValueError(f"accepted_tokens must be finite and >= 0, got {accepted_tokens}")
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"seconds must be finite and > 0, got {seconds}")
        rounds = self._rounds[bucket][arm]
        rounds.append((float(accepted_tokens), float(seconds)))
        self._pulls[bucket][arm] += 1
        self._sums[bucket][arm] = _window_sums(rounds)  # exact (fsum), so that a restored state continues alike
        return accepted_tokens / seconds

    def estimate(self, bucket: int, arm: int) -> float | None:
        """Throughput of `arm` over its window in `bucket`: the rounds' tokens / their seconds; None if
        it was never tried there."""
        self._check_bucket(bucket)
        self._check_arm(arm)
        return self._estimates(bucket)[arm]

    def _estimates(self, bucket: int) -> list[float | None]:
        """Every arm's `estimate` in `bucket` (checked bucket)."""
        return [t / s if rounds else None for rounds, (t, s) in zip(self._rounds[bucket], self._sums[bucket])]

    def stats(self, bucket: int) -> list[ArmStats]:
        """Per-arm pulls and estimates of `bucket`, for metrics and logs."""
        self._check_bucket(bucket)
        return [ArmStats(pulls, self.estimate(bucket, arm)) for arm, pulls in enumerate(self._pulls[bucket])]

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: settings, windows ((tokens, seconds) rounds), pull counts, the RNG's state."""
        version, internal, gauss = self.rng.getstate()
        return {
            "num_arms": self.num_arms,
            "num_buckets": self.num_buckets,
            "epsilon": self.epsilon,
            "exploration": self.exploration,
            "window": self.window,
            "rounds": [[[list(x) for x in r] for r in bucket] for bucket in self._rounds],
            "pulls": [list(p) for p in self._pulls],
            "rng_state": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output; the arm and bucket counts must match this bandit's.

        A state saved before rounds were kept (its "rewards" hold per-round rates) loads each rate as a
        round of that many tokens in one second."""
        shape = (state.get("num_arms"), state.get("num_buckets"))
        if shape != (self.num_arms, self.num_buckets):
            raise ValueError(
                f"bandit state has (num_arms, num_buckets) = {shape}, this bandit has "
                f"{(self.num_arms, self.num_buckets)}: the arms or buckets of the run changed"
            )
        self.epsilon = float(state["epsilon"])
        if state.get("exploration", self.exploration) not in EXPLORATIONS:
            raise ValueError(
                f"bandit state: exploration must be one of {list(EXPLORATIONS)}, got {state['exploration']!r}"
            )
        self.exploration = state.get("exploration", self.exploration)  # a state saved before it: the spec's
        self.window = int(state["window"])
        if "rounds" in state:
            rounds = [[[(float(t), float(s)) for t, s in r] for r in bucket] for bucket in state["rounds"]]
        else:
            rounds = [[[(float(x), 1.0) for x in r] for r in bucket] for bucket in state["rewards"]]
        self._rounds = [[deque(r, maxlen=self.window) for r in bucket] for bucket in rounds]
        self._pulls = [[int(p) for p in bucket] for bucket in state["pulls"]]
        self._sums = [[_window_sums(r) for r in bucket] for bucket in self._rounds]
        version, internal, gauss = state["rng_state"]
        self.rng.setstate((version, tuple(internal), gauss))

    def _check_bucket(self, bucket: int) -> None:
        if not 0 <= bucket < self.num_buckets:
            raise ValueError(f"bucket must be in [0, {self.num_buckets}), got {bucket}")

    def _check_arm(self, arm: int) -> None:
        if not 0 <= arm < self.num_arms:
            raise ValueError(f"arm must be in [0, {self.num_arms}), got {arm}")


def _window_sums(rounds: deque[tuple[float, float]]) -> tuple[float, float]:
    """(tokens, seconds) summed over a window's rounds."""
    return math.fsum(t for t, _ in rounds), math.fsum(s for _, s in rounds)
