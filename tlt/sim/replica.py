"""One rollout replica decoding its shard: prefill, then rounds with a batch that shrinks as
responses finish.

Event-driven: between two finishing responses the running batch is constant, so the replica advances
in chunks of at most `decision_tokens` tokens per row instead of round by round (a 1024-GPU step then
costs thousands of events, not millions of rounds). Before each chunk the engine's own decision runs:
`tlt.rollout.draft_switch.sd_bucket` (threshold and buckets) says plain or SD, the replica's
`BucketedBandit` chooses the arm, and the chunk's tokens per row over its seconds are the reward, as in
`tlt.adaptive.adaptive_stepper`. A chunk of N tokens takes N / accept_length rounds of the arm's cost (the
target verifying `verify_width` tokens per row plus its drafter steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlt.adaptive.arms import arm_label, verify_width
from tlt.adaptive.bandit import BucketedBandit
from tlt.rollout.draft_switch import sd_bucket
from tlt.sim.accept import accept_length, drafter_steps
from tlt.sim.cost_model import CostModel
from tlt.spec.run import ArmSpec


@dataclass(frozen=True)
class Segment:
    """A stretch of one replica's timeline. kind: prefill, decode (no draft: SD off, or the plain arm),
    sd, idle, train, update, sync; arm: the bandit's arm label while SD is on."""

    start: float
    end: float
    kind: str
    batch: int = 0
    arm: str | None = None


@dataclass(frozen=True)
class Drafting:
    """What SD can do on this replica this step: the usable arms (engine order, at least one), the
    engine's switch settings, the replica's bandit, and the drafter's per-token acceptance now."""

    arms: tuple[ArmSpec, ...]
    threshold: int
    buckets: tuple[int, ...]
    bandit: BucketedBandit
    alpha: float
    ngram_alpha: float


@dataclass(frozen=True)
class ReplicaRollout:
    """finish: seconds at which each response of the shard finished (shard order); end: the last."""

    finish: list[float]
    segments: list[Segment]
    end: float


def round_seconds(cost: CostModel, arm: ArmSpec, running: int, context: int) -> float:
    """Seconds of one speculative round of `arm` over `running` rows: the verify forward over its width
    and the drafter's passes (each over `running` x its fan-out rows)."""
    passes, fan = drafter_steps(arm)
    return cost.target_seconds(running, verify_width(arm), context) + passes * cost.drafter_seconds(
        running * fan, context
    )


def _round(
    cost: CostModel, drafting: Drafting | None, running: int, context: float
) -> tuple[int | None, int | None, float, float]:
    """(bucket, arm, tokens per row per round, seconds per round) of the next chunk; bucket and arm are
    None for a plain step (no drafting, or SD off at this batch)."""
    bucket = None if drafting is None else sd_bucket(running, drafting.threshold, drafting.buckets)
    if drafting is None or bucket is None:
        return None, None, 1.0, cost.target_seconds(running, 1, int(context))
    arm = drafting.bandit.choose(bucket)
    spec = drafting.arms[arm]
    return (
        bucket,
        arm,
        accept_length(spec, drafting.alpha, drafting.ngram_alpha),
        round_seconds(cost, spec, running, int(context)),
    )


def decode_shard(
    lengths: list[int], cost: CostModel, *, prompt_len: int, drafting: Drafting | None, decision_tokens: int
) -> ReplicaRollout:
    """Simulate one replica generating `lengths` (response tokens per request, all admitted at once);
    drafting None: plain decoding throughout (vanilla)."""
    if decision_tokens < 1:
        raise ValueError(f"decision_tokens must be >= 1, got {decision_tokens}")
    if not lengths:
        return ReplicaRollout([], [], 0.0)
    finish = [0.0] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    now = cost.target_seconds(len(lengths), prompt_len, 0)
    segments = [Segment(0.0, now, "prefill", len(lengths))]
    pos, done = 0, 0
    while done < len(lengths):
        running = len(lengths) - done
        target = lengths[order[done]]
        while pos < target:
            chunk = min(target - pos, decision_tokens)
            bucket, arm, tokens, per_round = _round(cost, drafting, running, prompt_len + pos + chunk / 2)
            seconds = chunk / tokens * per_round
            label = None
            if drafting is not None and bucket is not None and arm is not None:
                drafting.bandit.update(bucket, arm, chunk, seconds)
                label = arm_label(drafting.arms[arm])
            kind = "decode" if label in (None, "plain") else "sd"
            last = segments[-1]
            if (last.kind, last.batch, last.arm) == (kind, running, label):
                segments[-1] = Segment(last.start, now + seconds, kind, running, label)
            else:
                segments.append(Segment(now, now + seconds, kind, running, label))
            now += seconds
            pos += chunk
        while done < len(lengths) and lengths[order[done]] == pos:
            finish[order[done]] = now
            done += 1
    return ReplicaRollout(finish, segments, now)
