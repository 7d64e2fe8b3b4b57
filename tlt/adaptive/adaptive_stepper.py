"""The adaptive rollout stepper: per engine step, plain decoding or speculative decoding with the arm
the bucketed bandit picks for the running batch.

Per step with B running rows:
  1. bucket = `sd_bucket(B, threshold, buckets)`: None (B above the threshold or past the last
     bucket) means a plain step;
  2. otherwise the bandit chooses an arm for that bucket (untried arms first, then epsilon-greedy
     on the median reward of a sliding window) and the arm's `SpeculativeStepper` runs the step
     (a `plain` arm runs a plain step: the bandit learns where drafting does not pay);
  3. reward = tokens the rows gained in the step (accepted drafts + the target's own next token)
     per second of the step and per running row, recorded for (bucket, arm). Per row, because a
     bucket spans several batch sizes (9-16 rows, say) and a step with more rows gains more tokens
     whatever the arm: without it the arm tried while the batch was larger would look better.

Switching SD on (the batch shrank past the threshold) or switching arms never re-runs the target
over tokens it has processed: the EAGLE drafter catches up from the target's saved hidden states
(`EagleCache.catch_up`), the n-gram drafter reads token ids only. `log` records every step, so the
target's token count can be checked: prompt tokens + the tokens each step verified, nothing else.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tlt.adaptive.arms import Arm, build_arms
from tlt.adaptive.bandit import BucketedBandit
from tlt.models.block_drafter import BlockDrafter
from tlt.models.drafter import EagleDrafter
from tlt.rollout.batch import RunningBatch
from tlt.rollout.decode_step import PlainStepper
from tlt.rollout.draft_switch import sd_bucket
from tlt.rollout.history import HistoryStore
from tlt.rollout.runner import ModelRunner
from tlt.rollout.speculative import AcceptanceStats, SpeculativeStepper
from tlt.spec.plan import speculates
from tlt.spec.run import SpeculativeSpec

Clock = Callable[[], float]


@dataclass(frozen=True)
class StepRecord:
    """One decode step: rows running, bucket and arm (None for plain), tokens gained by the rows,
    tokens the target forwarded, wall seconds."""

    running: int
    bucket: int | None
    arm: str | None
    new_tokens: int
    target_tokens: int
    seconds: float


class AdaptiveStepper:
    """A `Stepper`: plain above the threshold, bandit-chosen speculative arms at or below it.

    arms: from `tlt.adaptive.arms.build_arms` (may be empty: always plain). bandit: one arm per
    entry of `arms`, one bucket per entry of `buckets`; it outlives the stepper when shared
    across rollouts (the rewards it learned carry over). `stats` pools acceptance over all arms.
    """

    def __init__(
        self,
        runner: ModelRunner,
        arms: list[Arm],
        bandit: BucketedBandit,
        *,
        threshold: int,
        buckets: list[int],
        clock: Clock = time.perf_counter,
    ) -> None:
        if arms and bandit.num_arms != len(arms):
            raise ValueError(f"bandit has {bandit.num_arms} arms, the stepper {len(arms)}: build both from one spec")
        if bandit.num_buckets != len(buckets):
            raise ValueError(f"bandit has {bandit.num_buckets} buckets, buckets lists {len(buckets)}")
        self.arms = arms
        self.bandit = bandit
        self.threshold = threshold
        self.buckets = list(buckets)
        self.clock = clock
        self.stats = AcceptanceStats()
        self.plain = PlainStepper(runner)
        self.speculative: list[SpeculativeStepper | PlainStepper] = [
            self.plain if arm.drafter is None else SpeculativeStepper(runner, arm.drafter) for arm in arms
        ]
        for stepper in self.speculative:
            if isinstance(stepper, SpeculativeStepper):
                stepper.stats = self.stats
        self.log: list[StepRecord] = []
        # bucket upper bound -> [row-steps that drafted, draft tokens proposed, draft tokens accepted]
        self.by_bucket: dict[int, list[int]] = {}

    def bucket(self, running: int) -> int | None:
        """The bandit bucket of a step with `running` rows, or None for a plain step."""
        if not self.arms:
            return None
        return sd_bucket(running, self.threshold, self.buckets)

    def step(self, batch: RunningBatch) -> int:
        running = batch.num_rows
        bucket = self.bucket(running)
        arm = None if bucket is None else self.bandit.choose(bucket)
        stepper = self.plain if arm is None else self.speculative[arm]
        before = _generated(batch)
        counted = (self.stats.row_steps, self.stats.drafted, self.stats.accepted)
        started = self.clock()
        fed = stepper.step(batch)
        seconds = self.clock() - started
        new = _generated(batch) - before
        if bucket is not None and self.stats.row_steps > counted[0]:
            cell = self.by_bucket.setdefault(self.buckets[bucket], [0, 0, 0])
            for i, now in enumerate((self.stats.row_steps, self.stats.drafted, self.stats.accepted)):
                cell[i] += now - counted[i]
        if bucket is not None and arm is not None:
            # per running row: a bucket spans several batch sizes, and a step with more rows gains
            # more tokens whatever the arm; per row, arms tried at different sizes compare fairly
            self.bandit.update(bucket, arm, new / running, max(seconds, 1e-9))
        label = None if arm is None else self.arms[arm].label
        self.log.append(StepRecord(running, bucket, label, new, fed, seconds))
        return fed

    def summary(self) -> dict[str, Any]:
        """Metrics of the steps so far: step counts, arms chosen (the plain arm included), accept length,
        seconds by running size. sd_* count the steps that drafted; plain_* the others."""
        chosen = Counter(r.arm for r in self.log if r.arm is not None)
        sd = [r for r in self.log if r.arm is not None and r.arm != "plain"]
        by_running: dict[int, float] = {}
        for r in self.log:
            by_running[r.running] = by_running.get(r.running, 0.0) + r.seconds
        return {
            "arm_rates": arm_rates(self.log, self.buckets),
            "sd_steps": len(sd),
            "plain_steps": len(self.log) - len(sd),
            "sd_seconds": sum(r.seconds for r in sd),
            "plain_seconds": sum(r.seconds for r in self.log if r.arm is None or r.arm == "plain"),
            "arms_chosen": dict(sorted(chosen.items())),
            "accept_length": self.stats.accept_length if self.stats.row_steps else None,
            "seconds_by_running": dict(sorted(by_running.items())),
        }


def arm_rates(log: list[StepRecord], buckets: list[int]) -> dict[str, dict[str, dict[str, float]]]:
    """Measured throughput of every arm in every bucket: {bucket upper bound: {arm label: {"steps",
    "seconds", "tokens"}}} over the bandit's steps (tokens = rows' tokens gained, as its reward)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for r in log:
        if r.bucket is None or r.arm is None:
            continue
        cell = out.setdefault(str(buckets[r.bucket]), {}).setdefault(r.arm, {"steps": 0, "seconds": 0.0, "tokens": 0})
        cell["steps"] += 1
        cell["seconds"] += r.seconds
        cell["tokens"] += r.new_tokens
    return out


def merge_arm_rates(tables: list[dict[str, dict[str, dict[str, float]]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Sum `tlt.adaptive.adaptive_stepper.arm_rates` tables (per bucket, per arm: steps, seconds, tokens)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for table in tables:
        for bucket, arms in table.items():
            for arm, cell in arms.items():
                into = out.setdefault(bucket, {}).setdefault(arm, {"steps": 0, "seconds": 0.0, "tokens": 0})
                for key in ("steps", "seconds", "tokens"):
                    into[key] += cell[key]
    return out


def _generated(batch: RunningBatch) -> int:
    return sum(len(s.tokens) for s in batch.sequences)


def new_bandit(spec: SpeculativeSpec, num_arms: int, seed: int) -> BucketedBandit:
    """A bandit for `num_arms` arms over `spec.buckets`, with the spec's epsilon, window and exploration."""
    return BucketedBandit(
        max(num_arms, 1), len(spec.buckets), spec.epsilon, spec.window, random.Random(seed), spec.exploration
    )


def build_adaptive_stepper(
    spec: SpeculativeSpec,
    runner: ModelRunner,
    drafter: EagleDrafter | None,
    *,
    rows: int,
    context: int,
    bandit: BucketedBandit | None = None,
    seed: int = 0,
    history: HistoryStore | None = None,
    block: BlockDrafter | None = None,
) -> AdaptiveStepper:
    """The engine's adaptive stepper for `spec` (arms of `spec.mode`, threshold, buckets).

    Pass the previous rollout's `bandit` to keep what it learned; a new one is seeded with `seed`; pass the
    engine's rollout-history store (`history`) to keep earlier rollouts' responses for history drafts.
    The engine must keep hidden states (`Engine(return_hidden=True)`) for the EAGLE and block arms; `block`:
    the block drafter of arms of kind block.
    """
    arms = build_arms(
        spec,
        embed=runner.model.get_input_embeddings(),
        drafter=drafter,
        max_batch_size=rows,
        max_context=context,
        compile=runner.compiled is not None,
        history=history,
        block=block,
    )
    bandit = bandit if bandit is not None else new_bandit(spec, len(arms), seed)
    return AdaptiveStepper(runner, arms, bandit, threshold=spec.threshold, buckets=spec.buckets)


def rollout_stepper(
    spec: SpeculativeSpec,
    runner: ModelRunner,
    drafter: EagleDrafter | None,
    *,
    rows: int,
    context: int,
    bandit: BucketedBandit | None,
    seed: int,
    history: HistoryStore | None = None,
    block: BlockDrafter | None = None,
) -> PlainStepper | AdaptiveStepper:
    """The stepper of one rollout for `spec.mode` (build a fresh one per rollout; pass the previous one's bandit).

    off: plain decoding. ngram / static / tlt: the adaptive stepper, whose n-gram arms cover the time before
    the learned drafter is useful; the learned arms draft with `drafter` (the block arms with `block`), the
    rollout worker's copies its spot trainer trains. A worker keeps its bandit across rollouts, so what it
    learned carries over."""
    if not speculates(spec):
        return PlainStepper(runner)
    return build_adaptive_stepper(
        spec, runner, drafter, rows=rows, context=context, bandit=bandit, seed=seed, history=history, block=block
    )
