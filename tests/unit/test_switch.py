"""SD on/off threshold and running-batch buckets (tlt.rollout.draft_switch)."""

from __future__ import annotations

import pytest

from tlt.rollout.draft_switch import bucket_of, sd_bucket, sd_enabled
from tlt.spec.run import SpeculativeSpec


def test_sd_is_on_up_to_and_including_the_threshold():
    assert [sd_enabled(b, 4) for b in range(7)] == [False, True, True, True, True, False, False]


def test_threshold_zero_turns_sd_off_for_every_batch():
    assert not any(sd_enabled(b, 0) for b in range(10))


def test_buckets_map_each_batch_to_the_first_bound_that_covers_it():
    buckets = [1, 2, 4, 8]
    assert [bucket_of(b, buckets) for b in range(1, 10)] == [0, 1, 2, 2, 3, 3, 3, 3, None]


def test_batches_above_the_last_bucket_get_no_bucket_and_no_sd():
    spec = SpeculativeSpec(threshold=32, buckets=[1, 2, 4, 8])
    assert bucket_of(9, spec.buckets) is None
    assert sd_bucket(9, spec.threshold, spec.buckets) is None
    assert sd_bucket(8, spec.threshold, spec.buckets) == 3


def test_threshold_below_a_bucket_bound_turns_sd_off_inside_that_bucket():
    assert sd_bucket(3, 2, [1, 4]) is None
    assert sd_bucket(2, 2, [1, 4]) == 1


@pytest.mark.parametrize("buckets", [[], [2, 2], [4, 1], [0, 3]])
def test_bad_buckets_are_refused(buckets):
    with pytest.raises(ValueError, match="bucket"):
        bucket_of(1, buckets)


def test_negative_batches_are_refused():
    with pytest.raises(ValueError, match="running_batch"):
        sd_enabled(-1, 8)
    with pytest.raises(ValueError, match="running_batch"):
        bucket_of(0, [1, 2])


def test_one_rule_answers_whether_a_runtime_ever_drafts():
    from tlt.rollout.draft_switch import drafts_at_some_batch

    assert drafts_at_some_batch(4, (1, 2, 4))
    assert not drafts_at_some_batch(0, (1, 2, 4)), "threshold 0: the drafter trains, never drafts"
    assert drafts_at_some_batch(1, (2, 4)), "a batch of one falls in the first bucket"
