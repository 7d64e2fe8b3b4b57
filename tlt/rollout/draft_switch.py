"""When speculative decoding runs, and which bandit bucket a running batch belongs to.

SD pays only while decoding is memory-bound, i.e. while few requests are running: verifying
k draft tokens then costs about as much as decoding one. The engine asks `sd_bucket` before
each decode round: None means plain decoding; an int names the BEG-MAB bucket whose bandit
picks the SD strategy for this round.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


def sd_enabled(running_batch: int, threshold: int) -> bool:
    """True when SD should run for a round of `running_batch` requests.

    SD is on for 1 <= running_batch <= threshold; an empty batch has nothing to draft and a
    threshold of 0 turns SD off for good.
    """
    if running_batch < 0:
        raise ValueError(f"running_batch must be >= 0, got {running_batch}")
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    return 1 <= running_batch <= threshold


def bucket_of(running_batch: int, buckets: Sequence[int]) -> int | None:
    """Index of the first bucket whose upper bound is >= running_batch; None above the last.

    buckets: strictly ascending upper bounds, each >= 1 (`speculative.buckets`), e.g. [1, 2, 4, 8]
    maps a batch of 1 to bucket 0, 3 to bucket 2 and 9 to None (no bucket: SD off).
    """
    if running_batch < 1:
        raise ValueError(f"running_batch must be >= 1 to have a bucket, got {running_batch}")
    if not buckets:
        raise ValueError("buckets must name at least one upper bound")
    if buckets[0] < 1 or any(b <= a for a, b in zip(buckets, buckets[1:])):
        raise ValueError(f"buckets must be strictly ascending and >= 1, got {list(buckets)}")
    index = bisect_left(buckets, running_batch)
    return index if index < len(buckets) else None


def sd_bucket(running_batch: int, threshold: int, buckets: Sequence[int]) -> int | None:
    """Bucket to draft with for this round, or None for plain decoding.

    SD runs only when the batch is within the threshold AND falls in a bucket: a threshold
    above the last bucket bound does not switch SD on for batches no bandit covers.
    """
    if not sd_enabled(running_batch, threshold):
        return None
    return bucket_of(running_batch, buckets)


def drafts_at_some_batch(threshold: int, buckets: Sequence[int]) -> bool:
    """Whether `sd_bucket` says SD for any running batch: the question a runtime that cannot switch per
    round (vLLM: one speculative config for the whole engine) asks of the same rule."""
    return sd_bucket(1, threshold, buckets) is not None
