"""Aggregation of `tlt bench run` results: pure functions from per-run step metrics to the report.

Per variant and repeat, times are SUMS over all RL steps; across repeats the report gives the
median and the range [min, max]. Speedups are ratios of medians against `vanilla`.

- rollout_speedup / e2e_speedup: vanilla's rollout (step) time over TLT's.
- amdahl_e2e_bound: the end-to-end speedup rollout_speedup would give if nothing else changed,
  1 / ((1 - s) + s / rollout_speedup) with s = vanilla's rollout share of step time.
- accept_length_ratio: TLT's held-out accept length (fixed arm) over static's, at the last step.
- rollout_accept_length_ratio: the same at the last step, in the rollout itself: tokens a speculative
  row-step gained over every arm the bandit ran (EAGLE, history, n-gram), TLT's over static's. Where
  the drafter-free arms do well, static leans on them and this ratio stays below the held-out one.
- rollout_accept_ratio_by_position: the same per range of response positions (0-31, 32-63, 64-127,
  128-255, 256+ tokens generated before the step; the variant's `rollout_accept_by_position`), every step
  pooled: whether TLT's lead holds on the long responses' late tokens, where one-row SD spends its time.
- interference_fraction: step time of tlt-shadow (trainer runs, its drafter unused) over
  vanilla's, minus 1; mean over repeats (paired by repeat) with a Student-t 95% interval.
- reward_delta: TLT's final-step mean reward minus vanilla's (medians over repeats).
- ideal_speedup: vanilla's decode time re-weighted by running-batch size: every batch size SD
  covers (at most TLT's threshold) runs faster by accept_length / (cost_ratio(batch, width) +
  depth * drafter_ratio(batch)) (never slower than plain), with TLT's last-step held-out accept
  length at the fixed chain arm of `width` = depth + 1 verified tokens and the measured cost of a
  drafter step; ideal_speedup_free_drafter is the same with a free drafter (the bound no drafter
  of this shape can reach); tlt_fraction_of_ideal = rollout_speedup / ideal_speedup.
- arm_rates (per variant): tokens per second of every arm the bandit ran in every bucket, from
  the workers' own step timings (the plain arm is the same run's baseline).
- step_parts (per variant): its step time split into the decode loops (generate), the rest of the
  rollout (rollout_overhead), the policy update and the rest of the step (other), each a median over
  repeats of per-run sums (other too: step minus rollout minus update, summed per run; the difference of
  the three medians would mix repeats and can show a rest that no single run had); interference_by_part:
  tlt-shadow's part minus vanilla's, over vanilla's step time (where the interference fraction comes from;
  medians, so the parts need not add up to the paired mean exactly); interference_per_token_by_range:
  tlt-shadow's time per decoded token over vanilla's, minus 1, per running-batch range (its trainer runs
  only in the tail, while a worker whose shard is done idles; the rest is what TLT's engine mode costs
  plain steps).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from tlt.adaptive.adaptive_stepper import merge_arm_rates
from tlt.bench.cost_timing import CostPoint, DrafterCost, amdahl, cost_ratio, drafter_ratio, ideal_speedup
from tlt.rollout.step_timing import merge_tables, seconds_by_range
from tlt.runtime.shard_metrics import accept_by_position
from tlt.tasks.evaluate import length_stats

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (beyond: the normal 1.96).
T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def spread(values: list[float]) -> dict[str, float]:
    """{'median', 'min', 'max'} of a non-empty list."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def mean_ci95(values: list[float]) -> tuple[float, list[float] | None]:
    """Mean and Student-t 95% interval of the mean; the interval is None for fewer than 2 values."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    df = len(values) - 1
    half = (T975[df - 1] if df <= len(T975) else 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, [mean - half, mean + half]


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def variant_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Summary of one variant's runs (one per repeat, each with per-step metrics)."""
    rollout = [sum(s["rollout_seconds"] for s in r["steps"]) for r in runs]
    step = [sum(s["step_seconds"] for s in r["steps"]) for r in runs]
    tokens = [sum(s["generated_tokens"] for s in r["steps"]) for r in runs]
    lengths = [n for r in runs for s in r["steps"] for n in s["response_lengths"]]
    n_steps = min(len(r["steps"]) for r in runs)
    arms: Counter[str] = Counter()
    for r in runs:
        for s in r["steps"]:
            arms.update(s.get("sd_arms") or {})
    by_running: dict[str, list[float]] = {}
    range_seconds: Counter[str] = Counter()
    range_steps: Counter[str] = Counter()
    range_tokens: Counter[str] = Counter()
    range_token_seconds: Counter[str] = Counter()  # decode seconds of the steps whose tokens were counted
    for r in runs:
        totals: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for s in r["steps"]:
            totals.update(s.get("seconds_by_running") or {})
            counts.update(s.get("steps_by_running") or {})
            if s.get("tokens_by_running"):
                range_tokens.update(seconds_by_range({int(k): v for k, v in s["tokens_by_running"].items()}))
                range_token_seconds.update(seconds_by_range({int(k): v for k, v in s["seconds_by_running"].items()}))
        for size, seconds in totals.items():
            by_running.setdefault(size, []).append(seconds)
        range_seconds.update(seconds_by_range({int(k): v for k, v in totals.items()}))
        range_steps.update(seconds_by_range({int(k): v for k, v in counts.items()}))
    stats = length_stats(lengths)
    rates = merge_arm_rates([s.get("sd_arm_rates") or {} for r in runs for s in r["steps"]])
    return {
        "arm_rates": {
            bucket: {
                arm: {**cell, "tokens_per_second": cell["tokens"] / cell["seconds"] if cell["seconds"] else None}
                for arm, cell in sorted(arms.items())
            }
            for bucket, arms in sorted(rates.items(), key=lambda kv: int(kv[0]))
        },
        "repeats": len(runs),
        "rollout_seconds": spread(rollout),
        "generate_seconds": spread([sum(s.get("generate_seconds") or 0.0 for s in r["steps"]) for r in runs]),
        "rollout_overhead_seconds": spread(
            [sum(s.get("rollout_overhead_seconds") or 0.0 for s in r["steps"]) for r in runs]
        ),
        "step_seconds": spread(step),
        # the policy update's seconds (the same tokens in every variant: coupled sampling)
        "update_seconds": spread([sum(s.get("update_seconds") or 0.0 for s in r["steps"]) for r in runs]),
        # the rest of each step (rewards, trainer stops, drafter bookkeeping), summed per run before the median:
        # median(step) - median(rollout) - median(update) would mix repeats
        "other_seconds": spread(
            [
                sum(s["step_seconds"] - s["rollout_seconds"] - (s.get("update_seconds") or 0.0) for s in r["steps"])
                for r in runs
            ]
        ),
        "rollout_share": spread([a / b for a, b in zip(rollout, step)]),
        "generated_tokens": spread([float(t) for t in tokens]),
        "seconds_per_token": spread([a / max(t, 1) for a, t in zip(rollout, tokens)]),
        "heldout_accept_length": [
            _median_or_none([r["heldout_accept_length"][i] for r in runs]) for i in range(n_steps)
        ],
        "rollout_accept_length": [
            _median_or_none([r["steps"][i]["accept_length"] for r in runs]) for i in range(n_steps)
        ],
        "rollout_accept_by_position": accept_by_position(s.get("sd_by_position") for r in runs for s in r["steps"]),
        "heldout_kl": [
            _median_or_none([(r.get("heldout_kl") or [None] * n_steps)[i] for r in runs]) for i in range(n_steps)
        ],
        "frozen_accept_length": [
            _median_or_none([(r.get("frozen_accept_length") or [None] * n_steps)[i] for r in runs])
            for i in range(n_steps)
        ],
        "arms_chosen": dict(sorted(arms.items())),
        "harvested_seconds": spread([sum(s.get("harvested_seconds") or 0.0 for s in r["steps"]) for r in runs]),
        "idle_seconds": spread([sum(s.get("idle_seconds") or 0.0 for s in r["steps"]) for r in runs]),
        "response_length": {"p50": stats["p50"], "p90": stats["p90"], "max": stats["max"]},
        "truncation_rate": statistics.fmean(s["truncation_rate"] for r in runs for s in r["steps"]),
        "final_reward": spread([r["steps"][-1]["reward_mean"] for r in runs]),
        "seconds_by_running": {k: statistics.median(by_running[k]) for k in sorted(by_running, key=int)},
        # every repeat pooled, by running-batch range: decode steps and ms per decode step (runs that
        # recorded steps_by_running)
        "decode_steps_by_range": {k: int(n) for k, n in range_steps.items()},
        # the slowest worker's rollout overhead by part, summed over steps, median over repeats
        "rollout_overhead_parts": _median_parts(
            [s.get("rollout_overhead_parts") or {} for s in r["steps"]] for r in runs
        ),
        # ms per decode step by stepper, range and part, every step of every repeat (runs with --split)
        "step_split": merge_tables([s["step_split"] for r in runs for s in r["steps"] if s.get("step_split")]),
        "ms_per_decode_step_by_range": {k: 1e3 * range_seconds[k] / n for k, n in range_steps.items() if n},
        # every repeat pooled: tokens the rows kept in decode steps at each running-batch range, and ms per
        # token there (a variant that drafts drains its rows at other times, so seconds alone by range mix
        # how many tokens each variant generated there; runs that recorded tokens_by_running)
        "decode_tokens_by_range": {k: int(n) for k, n in range_tokens.items()},
        "ms_per_token_by_range": {k: 1e3 * range_token_seconds[k] / n for k, n in range_tokens.items() if n},
    }


def _median_parts(runs: Any) -> dict[str, float]:
    """Per run, each part summed over its steps; then each part's median over the runs."""
    sums: list[Counter[str]] = []
    for steps in runs:
        total: Counter[str] = Counter()
        for parts in steps:
            total.update(parts)
        sums.append(total)
    keys = sorted({k for total in sums for k in total})
    return {k: statistics.median(total.get(k, 0.0) for total in sums) for k in keys}


def ideal_rollout_speedup(
    seconds_by_running: dict[str, float],
    points: list[CostPoint],
    *,
    threshold: int,
    width: int,
    accept_length: float,
    drafter: list[DrafterCost] | None = None,
) -> float:
    """Decode-time speedup if every step at a running batch <= threshold ran an SD chain of `width`
    verified tokens with `accept_length` (never slower than plain); the chain's width - 1 drafter
    steps cost `drafter_ratio` each, or nothing when `drafter` is None. See the module docstring."""
    total = sum(seconds_by_running.values())
    if total <= 0:
        return 1.0
    sped = 0.0
    for size, seconds in seconds_by_running.items():
        b = int(size)
        gain = 1.0
        if b <= threshold:
            drafts = (width - 1) * drafter_ratio(drafter, b) if drafter else 0.0
            gain = max(1.0, ideal_speedup(accept_length, cost_ratio(points, b, width), drafts))
        sped += seconds / gain
    return total / sped


def summarize(
    workload: dict[str, Any],
    runs: list[dict[str, Any]],
    costs: list[dict[str, Any]],
    load: dict[str, list[float]],
    *,
    drafter_costs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report: per-variant summaries, the headline ratios (module docstring), costs and load."""
    variants = {v: variant_summary([r for r in runs if r["variant"] == v]) for v in workload["variants"]}
    van, tlt, static = variants["vanilla"], variants["tlt"], variants["static"]
    shadow = variants.get("tlt-shadow")
    rollout_speedup = van["rollout_seconds"]["median"] / tlt["rollout_seconds"]["median"]
    share = van["rollout_share"]["median"]
    paired = {}
    for r in runs:
        paired.setdefault(r["repeat"], {})[r["variant"]] = sum(s["step_seconds"] for s in r["steps"])
    both = [p for p in paired.values() if {"tlt-shadow", "vanilla"} <= set(p)]
    interference = [p["tlt-shadow"] / p["vanilla"] - 1.0 for p in both]
    interference_mean, interference_ci = mean_ci95(interference)
    tlt_accept = tlt["heldout_accept_length"][-1] if tlt["heldout_accept_length"] else None
    tlt_rollout, static_rollout = (
        v["rollout_accept_length"][-1] if v["rollout_accept_length"] else None for v in (tlt, static)
    )
    static_accept = static["heldout_accept_length"][-1] if static["heldout_accept_length"] else None
    points = [CostPoint(**p) for p in costs]
    threshold = int(workload["speculative"]["tlt"].get("threshold", _default_threshold()))
    width = int(workload["heldout"]["depth"]) + 1
    drafter = [DrafterCost(**d) for d in drafter_costs] if drafter_costs else None
    ideal = ideal_free = None
    if tlt_accept is not None and points:
        ideal_free = ideal_rollout_speedup(
            van["seconds_by_running"], points, threshold=threshold, width=width, accept_length=tlt_accept
        )
        ideal = (
            ideal_rollout_speedup(
                van["seconds_by_running"],
                points,
                threshold=threshold,
                width=width,
                accept_length=tlt_accept,
                drafter=drafter,
            )
            if drafter
            else ideal_free
        )
    return {
        "workload_sha256": workload["sha256"],
        "workload": workload,
        "rollout_speedup": rollout_speedup,
        "e2e_speedup": van["step_seconds"]["median"] / tlt["step_seconds"]["median"],
        "vanilla_rollout_share": share,
        "amdahl_e2e_bound": amdahl(share, rollout_speedup),
        "accept_length_ratio": tlt_accept / static_accept if tlt_accept is not None and static_accept else None,
        "rollout_accept_length_ratio": tlt_rollout / static_rollout if tlt_rollout and static_rollout else None,
        # TLT's accept length in the rollout over static's, per response-position range (whole run pooled)
        "rollout_accept_ratio_by_position": {
            edge: cell["accept_length"] / static["rollout_accept_by_position"][edge]["accept_length"]
            for edge, cell in tlt["rollout_accept_by_position"].items()
            if edge in static["rollout_accept_by_position"]
        },
        "interference_fraction": interference_mean,
        "interference_ci95": interference_ci,
        "interference_per_repeat": interference,
        "reward_delta": tlt["final_reward"]["median"] - van["final_reward"]["median"],
        "frozen_accept_drop": frozen_drop(van["frozen_accept_length"]),
        "ideal_speedup": ideal,
        "tlt_fraction_of_ideal": rollout_speedup / ideal if ideal else None,
        "ideal_speedup_free_drafter": ideal_free,
        # vanilla's ms per generated token / tlt's, per running-batch range (decode steps, every repeat pooled)
        "tlt_speedup_per_token_by_range": per_token_speedup(van["ms_per_token_by_range"], tlt["ms_per_token_by_range"]),
        "step_parts": {name: step_parts(v) for name, v in variants.items()},
        "interference_by_part": part_deltas(step_parts(van), step_parts(shadow), van["step_seconds"]["median"])
        if shadow
        else None,
        "interference_per_token_by_range": {
            k: 1.0 / x - 1.0
            for k, x in per_token_speedup(van["ms_per_token_by_range"], shadow["ms_per_token_by_range"]).items()
        }
        if shadow
        else None,
        "ideal_inputs": {
            "threshold": threshold,
            "width": width,
            "accept_length": tlt_accept,
            "drafter_cost": "measured" if drafter else "free",
        },
        "variants": variants,
        "costs": costs,
        "drafter_costs": drafter_costs,
        "load_average": load,
        "runs": runs,
    }


def per_token_speedup(base: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    """{range: base's time per token / other's} from two {running-batch range: time per token} tables, over
    the ranges where both generated tokens (`tlt bench run` and `tlt bench worker`)."""
    return {k: base[k] / other[k] for k in base if other.get(k)}


def step_parts(summary: dict[str, Any]) -> dict[str, float]:
    """A variant's step seconds by part (module docstring), from its `variant_summary`."""
    med = {
        k: summary[k]["median"]
        for k in ("generate_seconds", "rollout_overhead_seconds", "update_seconds", "other_seconds")
    }
    return {
        "generate": med["generate_seconds"],
        "rollout_overhead": med["rollout_overhead_seconds"],
        "update": med["update_seconds"],
        "other": med["other_seconds"],
    }


def part_deltas(base: dict[str, float], other: dict[str, float], base_step: float) -> dict[str, float]:
    """{part: (other's seconds - base's) / base_step} over the parts both have."""
    return {k: (other[k] - base[k]) / base_step for k in base if k in other} if base_step > 0 else {}


def frozen_drop(series: list[float | None]) -> float | None:
    """1 - last / first of a frozen drafter's per-step held-out accept length (the share it lost as the
    policy moved); None when not measured."""
    values = [v for v in series if v is not None]
    return 1.0 - values[-1] / values[0] if len(values) >= 2 and values[0] else None


def _default_threshold() -> int:
    from tlt.spec.run import SpeculativeSpec

    return SpeculativeSpec().threshold
