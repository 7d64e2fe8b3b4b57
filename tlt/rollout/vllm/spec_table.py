"""TLT's threshold and buckets as vLLM's dynamic speculative decoding table (pure; imports no vLLM).

vLLM v1 picks the draft length per scheduler step from `speculative_config.num_speculative_tokens_per_batch_size`:
rows `(first, last, K)` over inclusive running-batch ranges, starting at 1, K = 0 drafting nothing, K capped by
`num_speculative_tokens`. TLT's rule maps onto it bucket by bucket: bucket i covers the batches
(buckets[i-1], buckets[i]] and drafts the depth its bandit chose; batches above the threshold or past the
last bucket draft nothing (`tlt.rollout.draft_switch.sd_bucket`, the same rule as this engine's).
"""

from __future__ import annotations

from collections.abc import Sequence

from tlt.rollout.draft_switch import sd_bucket

Table = list[tuple[int, int, int]]


def k_table(threshold: int, buckets: Sequence[int], depths: Sequence[int], max_batch: int) -> Table:
    """The table for batches 1..max_batch: bucket i's batches (clipped at the threshold) draft depths[i] tokens,
    every other batch 0; neighbouring batches with the same K share a row.

    >>> k_table(8, [1, 2, 4, 8, 16], [4, 4, 3, 2, 2], 32)
    [(1, 2, 4), (3, 4, 3), (5, 8, 2), (9, 32, 0)]
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    if len(depths) != len(buckets):
        raise ValueError(f"one depth per bucket: {len(buckets)} buckets, {len(depths)} depths")
    if any(k < 0 for k in depths):
        raise ValueError(f"depths must be >= 0, got {list(depths)}")
    rows: Table = []
    for batch in range(1, max_batch + 1):
        bucket = sd_bucket(batch, threshold, buckets) if buckets else None
        k = 0 if bucket is None else depths[bucket]
        if rows and rows[-1][2] == k:
            rows[-1] = (rows[-1][0], batch, k)
        else:
            rows.append((batch, batch, k))
    return rows


def off_table(max_batch: int) -> Table:
    """No batch drafts (a flagged drafter, `tlt.adaptive.drafter_health`)."""
    return [(1, max_batch, 0)]


def k_at(table: Table, batch: int) -> int:
    """K the table gives a step of `batch` running requests (0 outside every row)."""
    return next((k for first, last, k in table if first <= batch <= last), 0)


def drafts_anywhere(table: Table) -> bool:
    return any(k > 0 for _, _, k in table)
