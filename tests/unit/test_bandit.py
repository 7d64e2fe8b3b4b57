"""BEG-MAB (tlt.adaptive.bandit): per-bucket epsilon-greedy over windowed throughput (the window's tokens / seconds)."""

from __future__ import annotations

import json
import math
import random

import pytest

from tlt.adaptive.bandit import FLOOR, BucketedBandit
from tlt.spec.run import SpeculativeSpec


def _reward(noise: random.Random, mean: float) -> tuple[float, float]:
    """One synthetic SD round: (accepted tokens, seconds) with noisy throughput around `mean`."""
    seconds = 0.01
    return max(0.0, noise.gauss(mean, mean * 0.2)) * seconds, seconds


def _run(bandit: BucketedBandit, bucket: int, means: list[float], rounds: int, noise: random.Random) -> list[int]:
    chosen = []
    for _ in range(rounds):
        arm = bandit.choose(bucket)
        bandit.update(bucket, arm, *_reward(noise, means[arm]))
        chosen.append(arm)
    return chosen


def test_untried_arms_are_tried_first_in_index_order():
    bandit = BucketedBandit(num_arms=4, num_buckets=1, epsilon=1.0, window=8, rng=random.Random(0))
    chosen = _run(bandit, 0, [1.0, 2.0, 3.0, 4.0], 4, random.Random(1))
    assert chosen == [0, 1, 2, 3]


def test_converges_to_the_best_arm_of_each_bucket():
    bandit = BucketedBandit(num_arms=4, num_buckets=2, epsilon=0.1, window=16, rng=random.Random(0))
    noise = random.Random(1)
    means = {0: [100.0, 150.0, 300.0, 120.0], 1: [250.0, 90.0, 60.0, 200.0]}
    for bucket in (0, 1):
        chosen = _run(bandit, bucket, means[bucket], 600, noise)
        best = means[bucket].index(max(means[bucket]))
        assert bandit.best(bucket) == best
        late = chosen[-300:]
        assert late.count(best) / len(late) > 0.85


def test_buckets_keep_separate_statistics():
    bandit = BucketedBandit(num_arms=3, num_buckets=2, epsilon=0.0, window=4, rng=random.Random(0))
    _run(bandit, 0, [1.0, 5.0, 2.0], 30, random.Random(1))
    assert [s.pulls for s in bandit.stats(1)] == [0, 0, 0]
    assert bandit.estimate(1, 1) is None
    assert bandit.choose(1) == 0


def test_keeps_exploring_at_rate_epsilon_forever():
    epsilon, arms, rounds = 0.2, 4, 6000
    bandit = BucketedBandit(
        num_arms=arms, num_buckets=1, epsilon=epsilon, window=16, rng=random.Random(0), exploration="uniform"
    )
    chosen = _run(bandit, 0, [10.0, 20.0, 40.0, 80.0], rounds, random.Random(1))
    late = chosen[1000:]
    off_greedy = sum(arm != 3 for arm in late) / len(late)
    # a random pick lands on the greedy arm 1/arms of the time
    assert off_greedy == pytest.approx(epsilon * (arms - 1) / arms, abs=0.03)
    assert all(late[-2000:].count(arm) > 0 for arm in range(arms))


def _steady(bandit: BucketedBandit, means: list[float], rounds: int) -> list[int]:
    """Rounds of fixed throughput: arm a makes means[a] tokens a second, exactly."""
    chosen = []
    for _ in range(rounds):
        arm = bandit.choose(0)
        bandit.update(0, arm, means[arm] * 0.01, 0.01)
        chosen.append(arm)
    return chosen


def test_weighted_exploration_tries_arms_by_their_shortfall_behind_the_best():
    means = [100.0, 95.0, 60.0, 30.0]
    bandit = BucketedBandit(num_arms=4, num_buckets=1, epsilon=1.0, window=16, rng=random.Random(0))
    chosen = _steady(bandit, means, 20000)[4:]
    # gaps 0, 0.05, 0.4, 0.7: weights 1, e^-0.5, and the floor twice
    weights = [1.0, math.exp(-0.5), FLOOR, FLOOR]
    assert bandit.exploration_weights(0) == pytest.approx(weights)
    for arm, weight in enumerate(weights):
        assert chosen.count(arm) / len(chosen) == pytest.approx(weight / sum(weights), abs=0.01)


def test_weighted_exploration_spends_fewer_rounds_behind_than_uniform():
    """Eight arms, two near the best, five far behind (as a bucket of countdown-deep-v3): the share of
    rounds on arms 30% or more behind, per exploration rule; both still try every arm."""
    means = [586.0, 582.0, 342.0, 541.0, 554.0, 323.0, 325.0, 332.0]
    far = [arm for arm, m in enumerate(means) if m < 0.7 * max(means)]
    share = {}
    for rule in ("uniform", "weighted"):
        bandit = BucketedBandit(
            num_arms=8, num_buckets=1, epsilon=0.1, window=64, rng=random.Random(0), exploration=rule
        )
        late = _run(bandit, 0, means, 12000, random.Random(1))[2000:]
        share[rule] = sum(late.count(arm) for arm in far) / len(late)
        assert all(late.count(arm) > 0 for arm in range(8))
    assert share["uniform"] == pytest.approx(0.1 * len(far) / 8, abs=0.01)
    assert share["weighted"] < share["uniform"] / 4


def test_weighted_exploration_still_finds_an_arm_that_got_better():
    """An arm far behind keeps a second look (the floor): when the drafter behind it improves, it wins."""
    bandit = BucketedBandit(num_arms=2, num_buckets=1, epsilon=0.1, window=8, rng=random.Random(0))
    _steady(bandit, [200.0, 100.0], 200)
    assert bandit.best(0) == 0
    chosen = _steady(bandit, [200.0, 400.0], 4000)
    assert bandit.best(0) == 1
    assert chosen[-200:].count(1) >= 180


def test_window_forgets_a_drafter_whose_quality_changed():
    bandit = BucketedBandit(num_arms=2, num_buckets=1, epsilon=0.1, window=8, rng=random.Random(0))
    noise = random.Random(1)
    _run(bandit, 0, [200.0, 100.0], 200, noise)
    assert bandit.best(0) == 0
    chosen = _run(bandit, 0, [50.0, 100.0], 60, noise)
    assert bandit.best(0) == 1
    assert chosen[-20:].count(1) >= 15


def test_a_single_slow_round_is_diluted_by_the_window():
    bandit = BucketedBandit(num_arms=2, num_buckets=1, epsilon=0.0, window=64, rng=random.Random(0))
    for _ in range(63):
        bandit.update(0, 0, 3.0, 0.010)
        bandit.update(0, 1, 2.0, 0.010)
    bandit.update(0, 0, 3.0, 0.050)  # a GC pause
    assert bandit.estimate(0, 0) == pytest.approx(300.0, rel=0.07)
    assert bandit.best(0) == 0


def test_estimate_is_the_windows_tokens_over_its_seconds():
    bandit = BucketedBandit(num_arms=1, num_buckets=1, epsilon=0.0, window=4, rng=random.Random(0))
    for tokens, seconds in [(9, 1.0), (1, 0.010), (4, 0.012), (1, 0.011), (4, 0.013)]:  # the first leaves the window
        bandit.update(0, 0, tokens, seconds)
    assert bandit.estimate(0, 0) == pytest.approx(10 / 0.046)


def _bursty_vs_plain(bandit: BucketedBandit, rounds: int, noise: random.Random) -> list[int]:
    """Arm 0: plain decoding, one token in 8 ms. Arm 1: a draft chain, accepted whole or not at all:
    1 token (p 0.5) or 4 (p 0.5) in 14.5 ms; its throughput, 2.5 / 14.5 ms = 172/s, is 1.38x plain's
    125/s, but its median per-round rate (1 / 14.5 ms = 69/s half the time) is not."""
    chosen = []
    for _ in range(rounds):
        arm = bandit.choose(0)
        jitter = noise.lognormvariate(0.0, 0.1)
        if arm == 0:
            bandit.update(0, 0, 1.0, 0.008 * jitter)
        else:
            bandit.update(0, 1, noise.choice([1.0, 4.0]), 0.0145 * jitter)
        chosen.append(arm)
    return chosen


def test_a_bursty_drafting_arm_with_the_higher_throughput_wins():
    """Drafts are accepted in bursts: the bandit must rank arms by throughput (what a rollout gets),
    not by the median round, which ranks plain decoding first whenever half the rounds accept nothing."""
    bandit = BucketedBandit(num_arms=2, num_buckets=1, epsilon=0.1, window=64, rng=random.Random(0))
    chosen = _bursty_vs_plain(bandit, 3000, random.Random(1))
    late = chosen[1000:]
    assert late.count(1) / len(late) > 0.85


def test_a_state_saved_with_per_round_rates_loads_as_one_second_rounds():
    bandit = BucketedBandit(num_arms=2, num_buckets=1, epsilon=0.1, window=4, rng=random.Random(0))
    state = bandit.state_dict()
    del state["rounds"]
    state["rewards"] = [[[100.0, 300.0], [150.0]]]
    state["pulls"] = [[2, 1]]
    bandit.load_state_dict(state)
    assert bandit.estimate(0, 0) == 200.0
    assert bandit.best(0) == 0


def test_reward_is_accepted_tokens_per_second():
    bandit = BucketedBandit(num_arms=1, num_buckets=1, epsilon=0.0, window=3, rng=random.Random(0))
    assert bandit.update(0, 0, accepted_tokens=12, seconds=0.5) == 24.0
    assert bandit.estimate(0, 0) == 24.0


def test_same_seed_same_choices():
    runs = []
    for _ in range(2):
        bandit = BucketedBandit(num_arms=4, num_buckets=1, epsilon=0.3, window=8, rng=random.Random(7))
        runs.append(_run(bandit, 0, [10.0, 12.0, 11.0, 9.0], 300, random.Random(3)))
    assert runs[0] == runs[1]


def test_state_dict_round_trip_through_json_continues_identically():
    spec = SpeculativeSpec()
    original = BucketedBandit.from_spec(spec, random.Random(5))
    means = [10.0, 12.0, 11.0, 9.0]
    _run(original, 1, means, 100, random.Random(2))
    restored = BucketedBandit.from_spec(spec, random.Random(999))
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.stats(1) == original.stats(1)
    assert _run(restored, 1, means, 100, random.Random(4)) == _run(original, 1, means, 100, random.Random(4))


def test_state_of_another_shape_is_refused():
    state = BucketedBandit(num_arms=3, num_buckets=2, epsilon=0.1, window=4, rng=random.Random(0)).state_dict()
    other = BucketedBandit(num_arms=4, num_buckets=2, epsilon=0.1, window=4, rng=random.Random(0))
    with pytest.raises(ValueError, match="arms or buckets"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("bucket", "arm", "tokens", "seconds", "field"),
    [
        (2, 0, 1.0, 1.0, "bucket"),
        (0, 5, 1.0, 1.0, "arm"),
        (0, 0, -1.0, 1.0, "accepted_tokens"),
        (0, 0, 1.0, 0.0, "seconds"),
        (0, 0, 1.0, float("nan"), "seconds"),
    ],
)
def test_bad_updates_name_the_argument(bucket, arm, tokens, seconds, field):
    bandit = BucketedBandit(num_arms=2, num_buckets=2, epsilon=0.1, window=4, rng=random.Random(0))
    with pytest.raises(ValueError, match=field):
        bandit.update(bucket, arm, tokens, seconds)


def test_a_state_saved_before_the_exploration_rule_keeps_the_specs():
    bandit = BucketedBandit(
        num_arms=2, num_buckets=1, epsilon=0.1, window=4, rng=random.Random(0), exploration="uniform"
    )
    state = bandit.state_dict()
    del state["exploration"]
    restored = BucketedBandit(num_arms=2, num_buckets=1, epsilon=0.1, window=4, rng=random.Random(0))
    restored.load_state_dict(state)
    assert restored.exploration == "weighted"
    restored.load_state_dict(bandit.state_dict())
    assert restored.exploration == "uniform"


def test_an_unknown_exploration_rule_is_refused_by_name():
    with pytest.raises(ValueError, match="exploration must be one of"):
        BucketedBandit(num_arms=2, num_buckets=1, epsilon=0.1, window=4, rng=random.Random(0), exploration="greedy")
    with pytest.raises(ValueError, match="exploration"):
        SpeculativeSpec(exploration="greedy")
    assert BucketedBandit.from_spec(SpeculativeSpec(exploration="uniform"), random.Random(0)).exploration == "uniform"
