"""`tlt bench run` produces a complete, internally consistent report (never checks timings).

The slow test runs the workload's `--quick` version end to end through the Ray loop; the fast
ones check the pinned workload file and the summary's arithmetic on synthetic step metrics.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from tlt.bench.run import repeat_order, variant_run
from tlt.bench.run_summary import mean_ci95, summarize
from tlt.bench.workload import DEFAULT_WORKLOAD, block_size, load_workload
from tlt.spec.plan import learned_drafters

TOP_KEYS = (
    "rollout_speedup",
    "e2e_speedup",
    "amdahl_e2e_bound",
    "accept_length_ratio",
    "interference_fraction",
    "interference_ci95",
    "reward_delta",
    "ideal_speedup",
    "workload_sha256",
)
VARIANT_KEYS = (
    "rollout_seconds",
    "step_seconds",
    "update_seconds",
    "seconds_per_token",
    "heldout_accept_length",
    "arms_chosen",
    "harvested_seconds",
    "response_length",
    "truncation_rate",
    "seconds_by_running",
    "rollout_share",
    "rollout_accept_by_position",
)


def check_consistent(report: dict, steps: int) -> None:
    for key in TOP_KEYS:
        assert key in report, f"report lacks {key}"
    assert report["workload_sha256"] == hashlib.sha256(DEFAULT_WORKLOAD.read_bytes()).hexdigest()
    v = report["variants"]
    assert set(v) == {"vanilla", "ngram", "static", "tlt", "tlt-shadow"}
    for name, s in v.items():
        for key in VARIANT_KEYS:
            assert key in s, f"variant {name} lacks {key}"
        for key in ("rollout_seconds", "step_seconds"):
            assert s[key]["min"] <= s[key]["median"] <= s[key]["max"]
        assert s["rollout_seconds"]["median"] <= s["step_seconds"]["max"]
        assert len(s["heldout_accept_length"]) == steps
        p = s["response_length"]
        assert p["p50"] <= p["p90"] <= p["max"]
        assert 0.0 <= s["truncation_rate"] <= 1.0
    assert all(a is None for a in v["vanilla"]["heldout_accept_length"]), "vanilla has no drafter"
    for name, s in v.items():  # speculative row-steps are counted by response position too
        assert bool(s["rollout_accept_by_position"]) == any(a is not None for a in s["rollout_accept_length"]), name
    assert all(a is not None and a >= 1.0 for a in v["tlt"]["heldout_accept_length"]), "bonus token included"
    speedup = v["vanilla"]["rollout_seconds"]["median"] / v["tlt"]["rollout_seconds"]["median"]
    assert math.isclose(report["rollout_speedup"], speedup)
    assert math.isclose(
        report["e2e_speedup"], v["vanilla"]["step_seconds"]["median"] / v["tlt"]["step_seconds"]["median"]
    )
    share = v["vanilla"]["rollout_share"]["median"]
    assert 0 < share <= 1
    assert math.isclose(report["amdahl_e2e_bound"], 1 / ((1 - share) + share / speedup))
    assert math.isclose(
        report["accept_length_ratio"], v["tlt"]["heldout_accept_length"][-1] / v["static"]["heldout_accept_length"][-1]
    )
    assert math.isclose(
        report["reward_delta"], v["tlt"]["final_reward"]["median"] - v["vanilla"]["final_reward"]["median"]
    )
    assert math.isclose(
        report["rollout_accept_length_ratio"],
        v["tlt"]["rollout_accept_length"][-1] / v["static"]["rollout_accept_length"][-1],
    )
    lo, hi = report["interference_ci95"]
    assert lo <= report["interference_fraction"] <= hi
    assert report["ideal_speedup"] >= 1.0
    assert math.isclose(report["tlt_fraction_of_ideal"], speedup / report["ideal_speedup"])
    json.dumps(report, default=str)


def test_workload_file_is_pinned_and_every_variant_is_a_valid_run():
    workload = load_workload()
    assert workload.sha256 == hashlib.sha256(DEFAULT_WORKLOAD.read_bytes()).hexdigest()
    assert workload.repeats >= 3
    algo = workload.spec["algorithm"]
    assert (algo["temperature"], algo["topP"]) == (1.0, 1.0)
    modes = {v: variant_run(workload, v, 0).spec.speculative for v in workload.variants}
    assert {v: m.mode for v, m in modes.items()} == {
        "vanilla": "off",
        "ngram": "ngram",
        "static": "static",
        "tlt": "tlt",
        "tlt-shadow": "tlt",
    }
    assert modes["tlt-shadow"].threshold == 0, "shadow training must never draft"
    quick = load_workload(quick=True)
    assert quick.sha256 == workload.sha256 and quick.repeats >= 2


def test_every_pinned_workload_loads_with_a_name_of_its_own():
    """Every workload file in bench/ (the retired ones keep their results) is a valid pin: each variant, full
    and quick, is a valid run, and no two files share a name (a changed workload is a new name)."""
    names = {}
    for path in sorted(DEFAULT_WORKLOAD.parent.glob("workload*.yaml")):
        for quick in (False, True):
            workload = load_workload(path, quick=quick)
            assert workload.repeats >= (2 if quick else 3), path.name
            for variant in workload.variants:
                assert variant_run(workload, variant, 0).spec.speculative.mode in ("off", "ngram", "static", "tlt")
        names.setdefault(workload.name, []).append(path.name)
    assert all(len(files) == 1 for files in names.values()), names


def test_deep_v7_is_deep_v6_with_block_arms_and_a_block_drafter_warm_start():
    v6, v7 = (load_workload(DEFAULT_WORKLOAD.parent / f"workload-deep-{v}.yaml") for v in ("v6", "v7"))
    blocks = [a for a in v7.spec["speculative"]["arms"] if a["kind"] == "block"]
    assert blocks and v7.spec["speculative"]["arms"][: -len(blocks)] == v6.spec["speculative"]["arms"]
    rest = [(w.spec | {"speculative": {**w.spec["speculative"], "arms": None}}) for w in (v6, v7)]
    assert rest[0] == rest[1] and v7.variants == v6.variants and v7.repeats == v6.repeats
    assert (v7.warmstart, v7.drafter_warmstart, v7.heldout, v7.costs) == (
        v6.warmstart,
        v6.drafter_warmstart,
        v6.heldout,
        v6.costs,
    )
    assert block_size(v6) == 0 and block_size(v7) == max(a["depth"] for a in blocks)
    learned = learned_drafters(variant_run(v7, "static", 0).spec.speculative, v7.warmstart.policy.num_layers)
    assert learned.eagle and learned.block_size == block_size(v7), "the warm start's block size is the run's"


def _synthetic_runs(workload) -> list[dict]:
    runs = []
    for repeat in range(3):
        for i, variant in enumerate(workload.variants):
            has_drafter = variant in ("static", "tlt", "tlt-shadow")
            steps = [
                {
                    "rollout_seconds": 4.0 + i + repeat,
                    "step_seconds": 6.0 + i + 0.5 * repeat,
                    "update_seconds": 1.0,
                    "generated_tokens": 100 + s,
                    "reward_mean": 0.1 * (s + i),
                    "response_lengths": [3, 9, 40, 7],
                    "truncation_rate": 0.25,
                    "accept_length": 2.0 + 0.25 * i if has_drafter else None,
                    "sd_row_steps": 5,
                    "harvested_seconds": 0.5,
                    "idle_seconds": 1.0,
                    "seconds_by_running": {"8": 1.0, "2": 0.5, "1": 0.7},
                    "steps_by_running": {"8": 100, "2": 50, "1": 70},
                    "tokens_by_running": {"8": 800, "2": 100 * (1 + i), "1": 70 * (1 + i)},
                    "rollout_overhead_parts": {"dispatch": 0.5 * repeat, "settle_wait": 0.25},
                    "sd_arms": {"chain-d4": 3} if variant == "tlt" else None,
                    # 10 row-steps early accepting 1 + i each, 4 late accepting i each
                    "sd_by_position": {"0": [10, 10 * (1 + i)], "128": [4, 4 * i]} if has_drafter else {},
                }
                for s in range(2)
            ]
            runs.append(
                {
                    "variant": variant,
                    "repeat": repeat,
                    "steps": steps,
                    "heldout_accept_length": [1.5 + i, 2.0 + i] if has_drafter else [None, None],
                }
            )
    return runs


def test_summary_is_internally_consistent_on_synthetic_metrics():
    from tlt.bench.run import workload_info

    workload = load_workload()
    costs = [
        {"batch": b, "width": w, "seconds": 0.01, "ratio": 1.0 + 0.05 * b * (w - 1), "ratio_min": 1.0, "ratio_max": 2.0}
        for b in (1, 2, 8)
        for w in (1, 5)
    ]
    report = summarize(
        workload_info(workload),
        _synthetic_runs(workload),
        costs,
        {"before": [1.0]},
        drafter_costs=[{"batch": 1, "seconds": 0.002, "ratio": 0.2}, {"batch": 8, "seconds": 0.004, "ratio": 0.4}],
    )
    check_consistent(report, steps=2)
    assert 1.0 <= report["ideal_speedup"] < report["ideal_speedup_free_drafter"], "drafter steps are not free"
    assert report["variants"]["tlt"]["arms_chosen"] == {"chain-d4": 18}
    # per repeat summed over 2 steps (dispatch 0, 1, 2; settle 0.5 each), then the median over repeats
    assert report["variants"]["tlt"]["rollout_overhead_parts"] == {"dispatch": 1.0, "settle_wait": 0.5}
    by_range = report["variants"]["vanilla"]
    assert by_range["decode_steps_by_range"] == {"1": 420, "2-4": 300, "5-8": 600, "9-16": 0, "17+": 0}
    assert by_range["ms_per_decode_step_by_range"] == pytest.approx({"1": 10.0, "2-4": 10.0, "5-8": 10.0})
    # per token: vanilla (variant 0) kept 70 tokens at one row per step, in 0.7 s: 10 ms a token
    assert by_range["decode_tokens_by_range"] == {"1": 420, "2-4": 600, "5-8": 4800, "9-16": 0, "17+": 0}
    assert by_range["ms_per_token_by_range"] == pytest.approx({"1": 10.0, "2-4": 5.0, "5-8": 1.25})
    i = list(workload.variants).index("tlt")  # tlt kept 1 + i times the tokens in the same seconds
    assert report["tlt_speedup_per_token_by_range"] == pytest.approx({"1": 1 + i, "2-4": 1 + i, "5-8": 1.0})
    # step parts: per run 2 steps of 6 + v + 0.5 r seconds (median 13 + 2v), rollout 8 + 2v + 2r (10 + 2v), update 2
    j = list(workload.variants).index("tlt-shadow")
    assert report["step_parts"]["tlt-shadow"] == pytest.approx(
        {"generate": 0.0, "rollout_overhead": 0.0, "update": 2.0, "other": 1.0}
    )
    assert report["interference_by_part"] == pytest.approx(
        {"generate": 0.0, "rollout_overhead": 0.0, "update": 0.0, "other": 0.0}
    )
    # accept by position: every step and repeat pooled (60 early row-steps, 24 late), TLT's over static's
    k = list(workload.variants).index("static")
    assert report["variants"]["tlt"]["rollout_accept_by_position"] == {
        "0": {"accept_length": 2.0 + i, "row_steps": 60},
        "128": {"accept_length": 1.0 + i, "row_steps": 24},
    }
    assert report["rollout_accept_ratio_by_position"] == pytest.approx(
        {"0": (2 + i) / (2 + k), "128": (1 + i) / (1 + k)}
    )
    assert report["variants"]["vanilla"]["rollout_accept_by_position"] == {}
    # shadow kept 1 + j times vanilla's tokens at 1 and 2-4 rows in the same seconds
    assert report["interference_per_token_by_range"] == pytest.approx(
        {"1": 1 / (1 + j) - 1, "2-4": 1 / (1 + j) - 1, "5-8": 0.0}
    )


def test_each_repeat_rotates_the_variant_order():
    variants = ["vanilla", "static", "tlt", "tlt-shadow"]
    orders = [repeat_order(variants, r) for r in range(4)]
    assert orders[0] == variants and orders[1] == ["static", "tlt", "tlt-shadow", "vanilla"]
    assert all(sorted(o) == sorted(variants) for o in orders)
    assert [o[0] for o in orders] == variants  # every variant runs first once in len(variants) repeats
    assert repeat_order(variants, 5) == orders[1] and repeat_order([], 3) == []


def test_mean_ci95_brackets_the_mean_and_needs_two_values():
    mean, ci = mean_ci95([0.1, 0.3, 0.2])
    assert math.isclose(mean, 0.2) and ci[0] < 0.2 < ci[1]
    assert mean_ci95([0.5]) == (0.5, None)


@pytest.mark.slow
def test_quick_bench_runs_every_variant_through_the_rl_loop(tmp_path, monkeypatch):
    from tlt.bench.run import run_bench
    from tlt.rollout.step_timing import STEP_SPLIT_ENV

    workload = load_workload(quick=True)
    monkeypatch.setenv(STEP_SPLIT_ENV, "1")  # as `--split`: the Ray workers split their decode steps
    report = run_bench(workload, work_dir=tmp_path)
    steps = int(workload.spec["algorithm"]["steps"])
    check_consistent(report, steps=steps)
    assert len(report["runs"]) == len(workload.variants) * workload.repeats
    for run in report["runs"]:
        assert len(run["steps"]) == steps
        # drift after every step: KL to the step-0 policy in every variant, the frozen drafter in vanilla
        assert len(run["heldout_kl"]) == steps and all(k >= 0 for k in run["heldout_kl"])
        frozen = run["frozen_accept_length"]
        assert all((a is not None and a >= 1.0) if run["variant"] in workload.frozen_in else a is None for a in frozen)
        assert all(s["generate_seconds"] > 0 and s["generate_seconds"] <= s["rollout_seconds"] for s in run["steps"])
        for s in run["steps"]:  # the slowest worker's overhead, part by part, adds up to the step's rollout
            parts = s["rollout_overhead_parts"]
            assert (
                set(parts)
                == {
                    "put_weights",
                    "stop_trainers",
                    "drafters",
                    "dispatch",
                    "settle_wait",
                    "history_wait",
                    "load_weights",
                    "load_drafter",
                    "stepper",
                    "return",
                }
                and min(parts.values()) >= 0
            )
            assert sum(parts.values()) <= s["rollout_seconds"] + 1e-6
    assert report["frozen_accept_drop"] is not None
    for name, v in report["variants"].items():  # every worker's every decode step, split once
        split_steps = sum(c["steps"] for ranges in v["step_split"].values() for c in ranges.values())
        assert split_steps == sum(v["decode_steps_by_range"].values()) > 0, name
    # coupled sampling: every variant kept the same tokens in its decode steps, at its own running sizes
    kept = {name: sum(v["decode_tokens_by_range"].values()) for name, v in report["variants"].items()}
    assert len(set(kept.values())) == 1 and min(kept.values()) > 0, kept
    assert report["tlt_speedup_per_token_by_range"], "per-token comparison by running-batch range"
    assert any(stepper.startswith("sd:") for stepper in report["variants"]["tlt"]["step_split"])
    # the result names where and from what it was measured: the machine and the exact warm-start weights
    assert report["machine"]["usable_cpus"] >= 1 and report["machine"]["torch"]
    sha = (report["workload"]["warmstart"]["weights_sha256"], report["workload"]["drafter_warmstart"]["weights_sha256"])
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in sha) and sha[0] != sha[1], sha


def test_interference_parts_say_which_part_of_the_step_grew():
    from tlt.bench.run_summary import part_deltas, step_parts

    def summary(generate, overhead, update, other):
        return {
            k: {"median": v}
            for k, v in (
                ("generate_seconds", generate),
                ("rollout_overhead_seconds", overhead),
                ("update_seconds", update),
                ("other_seconds", other),
            )
        }

    vanilla = step_parts(summary(9.0, 1.0, 9.5, 0.5))
    shadow = step_parts(summary(9.6, 1.4, 10.0, 1.0))
    assert vanilla == pytest.approx({"generate": 9.0, "rollout_overhead": 1.0, "update": 9.5, "other": 0.5})
    assert part_deltas(vanilla, shadow, 20.0) == pytest.approx(
        {"generate": 0.03, "rollout_overhead": 0.02, "update": 0.025, "other": 0.025}
    )
    assert part_deltas(vanilla, shadow, 0.0) == {}


def test_the_rest_of_the_step_is_a_median_of_per_run_rests_not_a_difference_of_medians():
    """Every run spends 1 s outside its rollout and update, but the slowest step and the slowest rollout come
    from different repeats: the difference of the medians reads 3 s, the per-run rest 1 s."""
    from tlt.bench.run_summary import step_parts, variant_summary

    def run(rollout, update):
        step = {
            "rollout_seconds": rollout,
            "update_seconds": update,
            "step_seconds": rollout + update + 1.0,
            "generated_tokens": 10,
            "response_lengths": [5],
            "truncation_rate": 0.0,
            "reward_mean": 0.5,
            "accept_length": None,
        }
        return {"steps": [step], "heldout_accept_length": [None]}

    runs = [run(10.0, 5.0), run(14.0, 5.0), run(9.0, 8.0)]  # steps 16 / 20 / 18: medians 18, rollout 10, update 5
    summary = variant_summary(runs)
    medians = [summary[k]["median"] for k in ("step_seconds", "rollout_seconds", "update_seconds")]
    assert medians == [18.0, 10.0, 5.0]  # their difference: 3 s
    assert summary["other_seconds"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert step_parts(summary)["other"] == pytest.approx(1.0)
