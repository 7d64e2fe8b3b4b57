"""The simulator reproduces step times computed by hand."""

from __future__ import annotations

import math
import random

import pytest

from tlt.adaptive.bandit import BucketedBandit
from tlt.sim.accept import AcceptCurve, accept_length
from tlt.sim.replica import Drafting, decode_shard
from tlt.sim.simulator import build_variants, simulate
from tlt.sim.step import ClusterConfig, Variant, simulate_step, verification_end
from tlt.spec.run import ArmSpec, SpeculativeSpec


def test_one_replica_without_sd_is_the_sum_of_its_step_costs(linear_cost):
    lengths = [3, 5, 10]
    cluster = ClusterConfig(prompt_len=4, decision_tokens=2)
    step = simulate_step(lengths, Variant("vanilla"), linear_cost, cluster, [None])
    c = linear_cost
    decode = 3 * c.target_seconds(3, 1, 0) + 2 * c.target_seconds(2, 1, 0) + 5 * c.target_seconds(1, 1, 0)
    prefill = c.target_seconds(3, 4, 0)
    update = c.update_per_token * (sum(lengths) + 4 * 3)
    assert step.rollout_seconds == pytest.approx(prefill + decode)
    assert step.update_seconds == pytest.approx(update)
    assert step.step_seconds == pytest.approx(prefill + decode + update + c.sync)
    assert step.idle_gpu_seconds == 0.0


def test_responses_finish_when_their_last_token_is_decoded(linear_cost):
    rollout = decode_shard([2, 1], linear_cost, prompt_len=1, drafting=None, decision_tokens=64)
    prefill = linear_cost.target_seconds(2, 1, 0)
    first = prefill + linear_cost.target_seconds(2, 1, 0)
    assert rollout.finish == pytest.approx([first + linear_cost.target_seconds(1, 1, 0), first])
    assert rollout.end == pytest.approx(max(rollout.finish))


def test_equal_lengths_on_equal_shards_leave_no_idle_time(linear_cost):
    cluster = ClusterConfig(replicas=4, update_gpus=4)
    step = simulate_step([50] * 16, Variant("vanilla"), linear_cost, cluster, [None] * 4)
    assert step.idle_gpu_seconds == pytest.approx(0.0)
    assert step.harvested_gpu_seconds == 0.0


def test_idle_time_is_the_gap_to_the_slowest_replica_times_its_gpus(linear_cost):
    cluster = ClusterConfig(replicas=2, gpus_per_replica=4, update_gpus=8, prompt_len=1)
    step = simulate_step([10, 30], Variant("vanilla"), linear_cost, cluster, [None, None])
    gap = 20 * linear_cost.target_seconds(1, 1, 0)
    assert step.idle_gpu_seconds == pytest.approx(gap * 4)


def test_reward_verification_overlaps_the_rollout_fifo_over_workers():
    assert verification_end([0.0, 0.0, 0.0], verifiers=2, reward_seconds=1.0) == pytest.approx(2.0)
    assert verification_end([0.0, 5.0], verifiers=1, reward_seconds=1.0) == pytest.approx(6.0)
    assert verification_end([0.0, 0.5, 0.6], verifiers=1, reward_seconds=1.0) == pytest.approx(3.0)


def test_slow_verification_extends_the_rollout(linear_cost):
    fast = ClusterConfig(prompt_len=1)
    slow = ClusterConfig(prompt_len=1, reward_seconds=100.0)
    lengths = [5, 5]
    a = simulate_step(lengths, Variant("vanilla"), linear_cost, fast, [None])
    b = simulate_step(lengths, Variant("vanilla"), linear_cost, slow, [None])
    assert b.rollout_seconds == pytest.approx(a.rollout_seconds + 200.0)


CHAIN2 = (ArmSpec(kind="chain", depth=2),)


def _chain_drafting(alpha: float, threshold: int, arms=CHAIN2) -> Drafting:
    bandit = BucketedBandit(len(arms), 2, 0.0, 4, random.Random(0))
    return Drafting(tuple(arms), threshold, (1, 4), bandit, alpha, 0.3)


def test_sd_chunk_costs_tokens_over_accept_length_rounds(linear_cost):
    drafting = _chain_drafting(0.5, threshold=4)
    rollout = decode_shard([8], linear_cost, prompt_len=1, drafting=drafting, decision_tokens=64)
    tokens_per_round = 1 + 0.5 + 0.25
    per_round = linear_cost.target_seconds(1, 3, 0) + 2 * linear_cost.drafter
    assert rollout.end == pytest.approx(linear_cost.target_seconds(1, 1, 0) + 8 / tokens_per_round * per_round)
    assert {s.kind for s in rollout.segments} == {"prefill", "sd"}


def test_sd_stays_off_above_the_threshold(linear_cost):
    drafting = _chain_drafting(0.5, threshold=1)
    rollout = decode_shard([4, 8], linear_cost, prompt_len=1, drafting=drafting, decision_tokens=64)
    kinds = [(s.kind, s.batch) for s in rollout.segments]
    assert kinds == [("prefill", 2), ("decode", 2), ("sd", 1)]


def test_the_bandit_learns_plain_decoding_where_drafts_cost_more_than_they_gain(linear_cost):
    costly = type(linear_cost)(drafter=1.0)
    arms = (ArmSpec(kind="chain", depth=4), ArmSpec(kind="plain"))
    drafting = _chain_drafting(0.1, threshold=4, arms=arms)
    decode_shard([400], costly, prompt_len=1, drafting=drafting, decision_tokens=8)
    assert drafting.bandit.best(0) == 1
    # epsilon 0: each arm once (untried first), then plain for the other 48 chunks of 8 tokens
    assert [s.pulls for s in drafting.bandit.stats(0)] == [1, 49]


def test_accept_length_of_arms():
    assert accept_length(ArmSpec(kind="plain"), 0.9, 0.3) == 1.0
    assert accept_length(ArmSpec(kind="chain", depth=3), 0.5, 0.3) == pytest.approx(1.875)
    assert accept_length(ArmSpec(kind="ngram", depth=1), 0.9, 0.3) == pytest.approx(1.3)
    tree = accept_length(ArmSpec(kind="tree", depth=1, topk=2), 0.5, 0.3)
    assert tree == pytest.approx(1.75)


def test_accept_curve_rises_from_alpha0_toward_alpha_max():
    curve = AcceptCurve(alpha0=0.4, alpha_max=0.8, tau=100.0)
    assert curve.alpha(0.0) == pytest.approx(0.4)
    assert curve.alpha(100.0) == pytest.approx(0.8 - 0.4 * math.exp(-1))
    with pytest.raises(ValueError, match="alpha_max"):
        AcceptCurve(alpha0=0.8, alpha_max=0.5)


def test_tlt_harvests_idle_time_and_its_drafter_improves_while_static_does_not(linear_cost):
    spec = SpeculativeSpec(threshold=4, buckets=[1, 2, 4])
    cluster = ClusterConfig(replicas=2, update_gpus=2, prompt_len=1)
    trace = [[10, 10, 200, 200]] * 3
    result = simulate(trace, build_variants(spec), linear_cost, cluster, spec, AcceptCurve(tau=1.0))
    tlt, static, vanilla = result.steps["tlt"], result.steps["static"], result.steps["vanilla"]
    assert all(s.idle_gpu_seconds > 0 and s.harvested_gpu_seconds == s.idle_gpu_seconds for s in tlt)
    assert all(s.harvested_gpu_seconds == 0.0 for s in static + vanilla)
    assert tlt[0].alpha == static[0].alpha == 0.5
    assert tlt[-1].alpha > tlt[0].alpha and static[-1].alpha == 0.5
    assert tlt[-1].rollout_seconds < static[-1].rollout_seconds
    summary = result.summary()
    assert summary["vanilla"]["speedup"] == 1.0
    assert summary["tlt"]["speedup"] == pytest.approx(
        summary["vanilla"]["step_seconds"] / summary["tlt"]["step_seconds"]
    )


def test_variants_take_the_engines_arms_per_mode():
    spec = SpeculativeSpec()
    vanilla, static, tlt = build_variants(spec)
    assert vanilla.arms == () and not vanilla.trains
    assert static.arms == tuple(spec.arms) and not static.trains
    assert tlt.trains
    assert not build_variants(spec, ("tlt",), drafter_training=False)[0].trains
    with pytest.raises(ValueError, match="variants must be among"):
        build_variants(spec, ("eagle",))


def test_timeline_shows_training_for_tlt_and_idling_for_vanilla_then_update_and_sync(linear_cost):
    cluster = ClusterConfig(replicas=2, update_gpus=2, prompt_len=1)
    for variant, spare in ((Variant("vanilla"), "idle"), (Variant("tlt", trains=True), "train")):
        step = simulate_step([5, 50], variant, linear_cost, cluster, [None, None])
        kinds = [[s.kind for s in row] for row in step.timelines]
        assert kinds[0] == ["prefill", "decode", spare, "update", "sync"]
        assert kinds[1] == ["prefill", "decode", "update", "sync"]
        assert all(row[-1].end == pytest.approx(step.step_seconds) for row in step.timelines)
