"""shard_rollout_metrics: one step's rollout metrics from the workers' shard results."""

from __future__ import annotations

import pytest
import torch

from tlt.rollout.types import Completion, StepMetrics
from tlt.runtime.shard_metrics import shard_rollout_metrics


def _result(
    finished_at: float,
    generate: float,
    trace: list[StepMetrics],
    row_steps: int,
    accepted: int,
    arms: dict[str, int],
    streamed: int,
) -> dict:
    return {
        "finished_at": finished_at,
        "generate_seconds": generate,
        "trace": trace,
        "sd_row_steps": row_steps,
        "sd_accepted": accepted,
        "sd_arms": arms,
        "sd_arm_rates": {},
        "streamed": streamed,
    }


def test_the_slowest_shard_sets_the_tail_and_every_shard_counts_in_the_totals():
    completions = [Completion(f"r{i}", [1], [5] * n, torch.zeros(n), None, "stop") for i, n in enumerate((3, 1, 4, 2))]
    fast = _result(
        11.0,
        0.9,
        [StepMetrics(0, 2, 2, 4, 0, 0.2), StepMetrics(1, 2, 2, 2, 1, 0.3), StepMetrics(2, 1, 1, 1, 1, 0.4)],
        row_steps=0,
        accepted=0,
        arms={},
        streamed=2,
    )
    slow = _result(
        14.0,
        3.5,
        [StepMetrics(0, 2, 2, 4, 0, 0.5), StepMetrics(1, 2, 4, 6, 1, 1.0), StepMetrics(2, 1, 3, 3, 1, 2.0)],
        row_steps=3,
        accepted=4,
        arms={"chain-d2": 2, "plain": 1},
        streamed=2,
    )
    fast["sd_by_position"], slow["sd_by_position"] = {"0": [2, 3]}, {"128": [1, 1], "0": [2, 0]}
    out = shard_rollout_metrics(completions, torch.tensor([[1.0, 0.0], [0.0, 0.0]]), [fast, slow], 10.0, 15.0)
    assert out["sd_by_position"] == {"0": [4, 3], "128": [1, 1]}  # both shards' counts, ranges in order
    assert out["rollout_seconds"] == 5.0
    assert out["idle_seconds"] == pytest.approx((15 - 11) + (15 - 14))
    assert out["generate_seconds"] == 3.5 and out["rollout_overhead_seconds"] == pytest.approx(1.5)
    assert out["tail_seconds"] == pytest.approx(2.0)  # the slow shard's step at 1 of 2 rows
    assert out["accept_length"] == pytest.approx((4 + 3) / 3) and out["sd_row_steps"] == 3
    assert out["sd_arms"] == {"chain-d2": 2, "plain": 1}
    assert out["seconds_by_running"] == {"1": pytest.approx(2.4), "2": pytest.approx(1.3)}
    assert out["steps_by_running"] == {"1": 2, "2": 2}  # decode steps of both shards, prefills excluded
    assert out["tokens_by_running"] == {"1": 4, "2": 6}  # tokens kept in those steps (prefills excluded)
    assert out["streamed_rewards"] == 4 and out["response_lengths"] == [3, 1, 4, 2]
    assert out["generated_tokens"] == 10 and out["reward_mean"] == 0.25


def test_no_speculative_steps_leave_the_accept_length_unset():
    completions = [Completion("r0", [1], [5, 6], torch.zeros(2), None, "stop")]
    only = _result(2.0, 1.0, [StepMetrics(0, 1, 1, 2, 0, 0.1), StepMetrics(1, 1, 1, 1, 1, 0.1)], 0, 0, {}, 1)
    out = shard_rollout_metrics(completions, torch.tensor([[1.0]]), [only], 0.0, 2.0)
    assert out["accept_length"] is None and out["sd_arms"] == {} and out["idle_seconds"] == 0.0
    assert out["sd_by_position"] == {}  # results without the counts (vLLM workers) pool to nothing
    assert out["draft_vocab_coverage"] is None  # no reduced draft vocabulary


def test_draft_vocabulary_coverage_pools_the_workers_generated_tokens():
    completions = [Completion("r0", [1], [5, 6], torch.zeros(2), None, "stop")]
    trace = [StepMetrics(0, 1, 1, 2, 0, 0.1), StepMetrics(1, 1, 1, 1, 1, 0.1)]
    a = {**_result(2.0, 1.0, trace, 0, 0, {}, 1), "draft_vocab_coverage": (9, 10)}
    b = {**_result(2.5, 1.0, trace, 0, 0, {}, 0), "draft_vocab_coverage": (21, 30)}
    out = shard_rollout_metrics(completions * 2, torch.tensor([[1.0], [0.0]]), [a, b], 0.0, 3.0)
    assert out["draft_vocab_coverage"] == pytest.approx(30 / 40)  # tokens pooled, not the workers' rates averaged


def test_workers_step_splits_are_pooled_when_they_report_them():
    completions = [Completion("r0", [1], [5, 6], torch.zeros(2), None, "stop")]
    trace = [StepMetrics(0, 1, 1, 2, 0, 0.1), StepMetrics(1, 1, 1, 1, 1, 0.1)]
    a = {**_result(2.0, 1.0, trace, 0, 0, {}, 1), "step_split": {"plain": {"1": {"steps": 1, "total": 2.0}}}}
    b = {**_result(2.5, 1.0, trace, 0, 0, {}, 0), "step_split": {"plain": {"1": {"steps": 3, "total": 4.0}}}}
    out = shard_rollout_metrics(completions * 2, torch.tensor([[1.0], [0.0]]), [a, b], 0.0, 3.0)
    assert out["step_split"] == {"plain": {"1": {"steps": 4, "total": 3.5}}}
    assert "step_split" not in shard_rollout_metrics(
        completions, torch.tensor([[1.0]]), [_result(2.0, 1.0, trace, 0, 0, {}, 1)], 0.0, 2.0
    )


def test_the_slowest_workers_overhead_is_split_into_its_parts():
    completions = [Completion("r0", [1], [5, 6], torch.zeros(2), None, "stop")]
    trace = [StepMetrics(0, 1, 1, 2, 0, 0.1), StepMetrics(1, 1, 1, 1, 1, 0.1)]
    setup = {"settle_wait": 0.25, "history_wait": 0.0, "load_weights": 0.125, "load_drafter": 0.0625, "stepper": 0.0}
    fast = {**_result(3.0, 1.0, trace, 0, 0, {}, 1), "called_at": 10.5, "setup_seconds": dict.fromkeys(setup, 0.0)}
    slow = {**_result(14.0, 3.0, trace, 0, 0, {}, 0), "called_at": 10.25, "setup_seconds": setup}
    out = shard_rollout_metrics(completions * 2, torch.tensor([[1.0], [0.0]]), [fast, slow], 10.0, 15.0)
    assert out["rollout_overhead_parts"] == {"dispatch": 0.25, **setup, "return": 1.0}
    prepare = {"put_weights": 0.0625, "stop_trainers": 0.125}  # the coordinator's part of the dispatch delay
    out = shard_rollout_metrics(completions * 2, torch.tensor([[1.0], [0.0]]), [fast, slow], 10.0, 15.0, prepare)
    assert out["rollout_overhead_parts"] == {**prepare, "dispatch": 0.0625, **setup, "return": 1.0}
