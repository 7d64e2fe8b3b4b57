"""`tlt bench engine --part vllm`: its pure summary (paired ratios, the faster vLLM-plain as reference,
the goal, greedy mismatches) and its refusal without vLLM (exit 2 with the install hint, nothing loaded)."""

from __future__ import annotations

import importlib.util

import pytest

from tlt.bench import engine_vllm
from tlt.bench.vllm_compare import (
    Row,
    faster,
    first_mismatches,
    goal_met,
    paired_ratio,
    requests_per_batch,
    summarize,
    variant_order,
)
from tlt.cli import main
from tlt.rollout.vllm.availability import INSTALL_HINT


def test_paired_ratio_is_the_median_and_range_of_per_round_ratios():
    assert paired_ratio([200.0, 300.0, 90.0], [100.0, 100.0, 90.0]) == (2.0, 1.0, 3.0)
    with pytest.raises(ValueError, match="equally long"):
        paired_ratio([1.0], [1.0, 2.0])


def test_the_goal_is_one_and_a_half_times_at_batch_four_or_less_and_par_above():
    assert goal_met(1.5, 1) and goal_met(1.5, 4) and not goal_met(1.49, 4)
    assert goal_met(1.0, 16) and not goal_met(0.99, 32)


def test_a_batch_runs_whole_groups_of_its_size_and_at_least_min_prompts():
    assert [requests_per_batch(b, 32) for b in (1, 4, 16, 32, 48)] == [32, 32, 32, 32, 48]
    assert requests_per_batch(3, 4) == 6


def test_first_mismatches_name_the_first_differing_position_and_prefixes():
    reference = [[1, 2, 3], [4, 5], [6, 7, 8]]
    assert first_mismatches(reference, [[1, 2, 3], [4, 9], [6, 7]]) == [(1, 1), (2, 2)]
    assert first_mismatches(reference, reference) == []


def test_faster_picks_the_highest_median():
    assert faster({"eager": [10.0, 30.0, 11.0], "compiled": [12.0, 12.0, 1.0]}) == "compiled"


def _row(variant: str, batch: int, rates: list[float], outputs: list[list[int]]) -> Row:
    row = Row(variant, batch, groups=1, tokens=[100] * len(rates), seconds=[100 / r for r in rates])
    row.outputs = [outputs] * (len(rates) + 1)  # the warm-up round too
    return row


def test_summary_pairs_tlt_adaptive_and_eagle_with_the_faster_vllm_plain_at_each_batch():
    same, other = [[1, 2, 3]], [[1, 2, 7]]
    rates = {  # batch -> variant -> tokens/s per round
        1: {
            "vllm-plain-eager": [100, 100],
            "vllm-plain-compiled": [50, 50],
            "vllm-eagle": [150, 120],
            "tlt-plain": [80, 80],
            "tlt-adaptive": [200, 160],
        },
        16: {
            "vllm-plain-eager": [100, 100],
            "vllm-plain-compiled": [200, 100],
            "vllm-eagle": [150, 150],
            "tlt-plain": [80, 80],
            "tlt-adaptive": [180, 120],
        },
    }
    rows = {
        (v, b): _row(v, b, r, other if v == "vllm-eagle" else same)
        for b, by_variant in rates.items()
        for v, r in by_variant.items()
    }
    out = summarize({}, rows, (1, 16), {"before": [0.5], "after": [0.7]})
    assert out["vllm_plain_reference"] == {"1": "vllm-plain-eager", "16": "vllm-plain-compiled"}
    assert out["tlt_vs_vllm_plain"] == {"1": pytest.approx(1.8), "16": pytest.approx(1.05)}
    assert out["tlt_vs_vllm_plain_range"]["1"] == [pytest.approx(1.6), pytest.approx(2.0)]
    assert out["vllm_eagle_vs_plain"]["16"] == pytest.approx(1.125)
    assert out["goal_met"] == {"1": True, "16": True}
    assert out["load_average"] == {"before": [0.5], "after": [0.7]}
    by_key = {(r["variant"], r["batch"]): r for r in out["vllm"]["rows"]}
    assert by_key["tlt-adaptive", 1]["mismatched_requests"] == 0 and by_key["tlt-adaptive", 1]["compared_requests"] == 3
    eagle = by_key["vllm-eagle", 1]
    assert eagle["mismatched_requests"] == 3  # one request, in the warm-up and both timed rounds
    assert eagle["first_mismatch"] == {"round": 0, "request": 0, "position": 2, "reference_token": 3, "token": 7}
    assert by_key["tlt-adaptive", 1]["tokens_per_s"] == pytest.approx(180)


def test_the_dynamic_table_is_paired_with_the_better_of_the_best_fixed_k_and_plain():
    same = [[1, 2, 3]]
    rates = {
        1: {"vllm-fixed-k3": [150, 150], "vllm-fixed-k2": [140, 170], "vllm-dynamic": [155, 140]},
        16: {"vllm-fixed-k3": [90, 90], "vllm-fixed-k2": [95, 95], "vllm-dynamic": [99, 98]},
    }
    base = {"vllm-plain-eager": [100, 100], "vllm-eagle": [120, 120], "tlt-plain": [80, 80], "tlt-adaptive": [90, 90]}
    rows = {(v, b): _row(v, b, r, same) for b, by in rates.items() for v, r in {**base, **by}.items()}
    out = summarize({}, rows, (1, 16), {"before": [0.5], "after": [0.7]})
    assert out["vllm_best_fixed"] == {"1": "vllm-fixed-k2", "16": "vllm-fixed-k2"}, "the higher median"
    assert out["vllm_dynamic_vs_best"]["1"] == {
        "over": "vllm-fixed-k2",
        "ratio": pytest.approx((155 / 140 + 140 / 170) / 2),
    }
    assert out["vllm_dynamic_vs_best"]["16"]["over"] == "vllm-plain-eager", "plain beats every fixed K there"
    assert out["dynamic_goal_met"] == {"1": True, "16": False}
    assert variant_order(["tlt-plain", "vllm-fixed-k3", "vllm-dynamic", "vllm-fixed-k2", "vllm-eagle"]) == [
        "vllm-eagle",
        "vllm-fixed-k2",
        "vllm-fixed-k3",
        "vllm-dynamic",
        "tlt-plain",
    ]


def test_part_vllm_without_vllm_exits_2_with_the_install_hint_before_loading_anything(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))

    def never(*_, **__):
        raise AssertionError("the bench ran without vLLM")

    monkeypatch.setattr(engine_vllm, "run_vllm_bench", never)
    assert main(["bench", "engine", "--part", "vllm", "--quick"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "needs vLLM" in out and " ".join(INSTALL_HINT.split()) in out
