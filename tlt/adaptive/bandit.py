"""BEG-MAB: a bucketed epsilon-greedy bandit that picks the speculative-decoding strategy.

One table of arm statistics per running-batch bucket (see `tlt.adaptive.switch.bucket_of`):
the best draft depth / top-k / verify budget at batch 1 is not the best at batch 8. A round of
an arm yields accepted tokens (per running row, as the adaptive stepper records it) in some
seconds. An arm's estimate over its last `window` rounds in that bucket is its throughput:
the window's tokens / the window's seconds. Tokens are bursty (a draft chain is accepted whole
or not at all), so a median of per-round rates undervalues every drafting arm against plain
decoding's constant one token a round (in countdown-deep-v3 the median-based bandit chose plain
decoding in 38% of batch-1 rounds while a chain arm made 163 tokens/s to plain's 119); the
window's throughput is what a rollout gets, and with rounds of unequal length (the simulator's
chunks) it stays exact. A single slow round (a GC pause) counts as the seconds it took, diluted
by the window (64 rounds by default). forgets, since the online drafter keeps changing which arm is best.

Unlike the public TLT default, the bandit explores with probability epsilon forever: with a
drafter that improves every RL step, an arm judged bad early must get a second look.

Plain-Python bookkeeping, no torch; the RNG is passed in so runs are reproducible.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from tlt.config import SpeculativeSpec


@dataclass(frozen=True)
class ArmStats:
    """What the bandit knows about one arm in one bucket.

    pulls: rounds recorded in total (not only those still in the window).
    estimate: the window's tokens / its seconds (tokens per second); None if untried.
    """

    pulls: int
    estimate: float | None


class BucketedBandit:
    """Epsilon-greedy over `num_arms` arms, with an independent table per bucket."""

    def __init__(
        self, num_arms: int, num_buckets: int, epsilon: float, window: int, rng: random.Random
    ) -> None:
        if num_arms < 1:
            raise ValueError(f"num_arms must be >= 1, got {num_arms}")
        if num_buckets < 1:
            raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.num_arms = num_arms
        self.num_buckets = num_buckets
        self.epsilon = epsilon
        self.window = window
        self.rng = rng
        self._rounds: list[list[deque[tuple[float, float]]]] = [  # (tokens, seconds) per round
            [deque(maxlen=window) for _ in range(num_arms)] for _ in range(num_buckets)
        ]
        self._pulls = [[0] * num_arms for _ in range(num_buckets)]

    @classmethod
    def from_spec(cls, spec: SpeculativeSpec, rng: random.Random) -> BucketedBandit:
        """One arm per `speculative.arms` entry, one bucket per `speculative.buckets` bound."""
        return cls(len(spec.arms), len(spec.buckets), spec.epsilon, spec.window, rng)

    def choose(self, bucket: int) -> int:
        """Arm to run next in `bucket`: an untried arm (lowest index) first; then with probability
        epsilon a uniformly random arm; otherwise the arm with the best estimate (lowest index on ties).
        """
        self._check_bucket(bucket)
        for arm, rounds in enumerate(self._rounds[bucket]):
            if not rounds:
                return arm
        if self.rng.random() < self.epsilon:
            return self.rng.randrange(self.num_arms)
        return self.best(bucket)

    def best(self, bucket: int) -> int:
        """The greedy arm of `bucket` (untried arms count as worst; lowest index wins ties)."""
        self._check_bucket(bucket)
        estimates = [self.estimate(bucket, arm) for arm in range(self.num_arms)]
        scored = [(-math.inf if e is None else e, -arm) for arm, e in enumerate(estimates)]
        return -max(scored)[1]

    def update(self, bucket: int, arm: int, accepted_tokens: float, seconds: float) -> float:
        """Record one round of `arm` in `bucket`; returns the round's rate, accepted_tokens / seconds."""
        self._check_bucket(bucket)
        self._check_arm(arm)
        if not (accepted_tokens >= 0 and math.isfinite(accepted_tokens)):
            raise ValueError(f"accepted_tokens must be finite and >= 0, got {accepted_tokens}")
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"seconds must be finite and > 0, got {seconds}")
        self._rounds[bucket][arm].append((float(accepted_tokens), float(seconds)))
        self._pulls[bucket][arm] += 1
        return accepted_tokens / seconds

    def estimate(self, bucket: int, arm: int) -> float | None:
        """Throughput of `arm` over its window in `bucket`: the rounds' tokens / their seconds; None if
        it was never tried there."""
        self._check_bucket(bucket)
        self._check_arm(arm)
        rounds = self._rounds[bucket][arm]
        if not rounds:
            return None
        return sum(t for t, _ in rounds) / sum(s for _, s in rounds)

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
        self.window = int(state["window"])
        if "rounds" in state:
            rounds = [[[(float(t), float(s)) for t, s in r] for r in bucket] for bucket in state["rounds"]]
        else:
            rounds = [[[(float(x), 1.0) for x in r] for r in bucket] for bucket in state["rewards"]]
        self._rounds = [[deque(r, maxlen=self.window) for r in bucket] for bucket in rounds]
        self._pulls = [[int(p) for p in bucket] for bucket in state["pulls"]]
        version, internal, gauss = state["rng_state"]
        self.rng.setstate((version, tuple(internal), gauss))

    def _check_bucket(self, bucket: int) -> None:
        if not 0 <= bucket < self.num_buckets:
            raise ValueError(f"bucket must be in [0, {self.num_buckets}), got {bucket}")

    def _check_arm(self, arm: int) -> None:
        if not 0 <= arm < self.num_arms:
            raise ValueError(f"arm must be in [0, {self.num_arms}), got {arm}")
