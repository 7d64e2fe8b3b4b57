"""`tlt bench run` on a time-to-accuracy workload: the runs' per-step records reduced to the comparison
(pure functions; the runs are `tlt.bench.accuracy`'s).

A run's clock is the sum of its steps' `step_seconds` (held-out evaluation, which every variant does alike,
is left out). Its curve is the held-out accuracy after each evaluated step, against that clock and against
the samples trained (P x G a step, the same for every variant). Compared, over the seeds (median [min, max]):
the seconds to reach the workload's target accuracy, the accuracy at the shortest variant's total time (each
run's last evaluation by then), the accuracy at each evaluated step, rollout and step seconds, the off-policy
share of the trained tokens, the drafters' harvested idle seconds, and per seed whether two variants' curves
are identical (tlt against vanilla and partial+tlt against partial: drafts are lossless).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from tlt.bench.run_summary import spread


def span(values: Sequence[float | None]) -> dict[str, float] | None:
    """{"median", "min", "max", "n"} of the values that are not None; None when none is."""
    known = [float(v) for v in values if v is not None]
    return {**spread(known), "n": len(known)} if known else None


def curve(steps: Sequence[dict[str, Any]]) -> list[tuple[int, float, int, float]]:
    """(step, seconds so far, samples trained so far, held-out accuracy) after each evaluated step."""
    out, clock, samples = [], 0.0, 0
    for m in steps:
        clock += float(m["step_seconds"])
        samples += int(m["samples"])
        if m.get("eval_accuracy") is not None:
            out.append((int(m["step"]), clock, samples, float(m["eval_accuracy"])))
    return out


def time_to(points: Sequence[tuple[int, float, int, float]], target: float) -> float | None:
    """Seconds until the first evaluation at or above `target` (None: never reached)."""
    return next((seconds for _, seconds, _, accuracy in points if accuracy >= target), None)


def accuracy_at(points: Sequence[tuple[int, float, int, float]], seconds: float) -> float | None:
    """The accuracy of the last evaluation at or before `seconds` (None: none by then)."""
    seen = [accuracy for _, at, _, accuracy in points if at <= seconds]
    return seen[-1] if seen else None


def summarize(runs: Sequence[dict[str, Any]], target: float, variants: Sequence[str]) -> dict[str, Any]:
    """The comparison of `runs` ({"variant", "seed", "steps": [per-step records]}) of `variants`."""
    by_variant = {v: [r for r in runs if r["variant"] == v] for v in variants}
    curves = {id(r): curve(r["steps"]) for r in runs}
    totals = {v: span([sum(m["step_seconds"] for m in r["steps"]) for r in rs]) for v, rs in by_variant.items()}
    common = min((t["median"] for t in totals.values() if t is not None), default=0.0)
    out: dict[str, Any] = {"target": target, "equal_seconds": common, "variants": {}}
    for v, rs in by_variant.items():
        reached = [time_to(curves[id(r)], target) for r in rs]
        evaluated = sorted({step for r in rs for step, *_ in curves[id(r)]})
        out["variants"][v] = {
            "seeds": [r["seed"] for r in rs],
            "seconds_to_target": span(reached),
            "reached": sum(t is not None for t in reached),
            "seconds_to_target_by_seed": dict(zip((r["seed"] for r in rs), reached)),
            "accuracy_at_equal_seconds": span([accuracy_at(curves[id(r)], common) for r in rs]),
            "accuracy_by_step": {
                str(step): span([next((a for s, _, _, a in curves[id(r)] if s == step), None) for r in rs])
                for step in evaluated
            },
            "final_accuracy": span([curves[id(r)][-1][3] if curves[id(r)] else None for r in rs]),
            "total_seconds": totals[v],
            "rollout_seconds_per_step": span([_mean(r, "rollout_seconds") for r in rs]),
            "step_seconds_per_step": span([_mean(r, "step_seconds") for r in rs]),
            "off_policy_fraction": span([_mean(r, "off_policy_fraction") for r in rs]),
            "harvested_seconds": span([sum(m.get("harvested_seconds") or 0.0 for m in r["steps"]) for r in rs]),
            "idle_seconds": span([sum(m.get("idle_seconds") or 0.0 for m in r["steps"]) for r in rs]),
            "generated_tokens": span([sum(m.get("generated_tokens") or 0 for m in r["steps"]) for r in rs]),
            "curves": {str(r["seed"]): curves[id(r)] for r in rs},
        }
    out["ratios_to_vanilla"] = _ratios(by_variant, curves, target)
    out["identical_curves"] = {
        f"{a} = {b}": _identical(by_variant.get(a, []), by_variant.get(b, []), curves)
        for a, b in (("tlt", "vanilla"), ("partial+tlt", "partial"))
        if a in by_variant and b in by_variant
    }
    return out


def _mean(run: dict[str, Any], key: str) -> float | None:
    values = [m[key] for m in run["steps"] if m.get(key) is not None]
    return statistics.fmean(values) if values else None


def _ratios(
    by_variant: dict[str, list[dict[str, Any]]], curves: dict[int, list], target: float
) -> dict[str, dict[str, Any]]:
    """Per variant, over the seeds both reached the target in: vanilla's seconds to the target / the variant's
    (above 1: faster), and the same for the total seconds of the run."""
    base = {r["seed"]: r for r in by_variant.get("vanilla", [])}
    out: dict[str, dict[str, Any]] = {}
    for v, rs in by_variant.items():
        if v == "vanilla":
            continue
        to_target, total = [], []
        for r in rs:
            b = base.get(r["seed"])
            if b is None:
                continue
            mine, theirs = time_to(curves[id(r)], target), time_to(curves[id(b)], target)
            if mine and theirs:
                to_target.append(theirs / mine)
            total.append(sum(m["step_seconds"] for m in b["steps"]) / sum(m["step_seconds"] for m in r["steps"]))
        out[v] = {"time_to_target_speedup": span(to_target), "run_speedup": span(total)}
    return out


def _identical(a: list[dict[str, Any]], b: list[dict[str, Any]], curves: dict[int, list]) -> dict[str, bool]:
    """Per seed both ran: whether the held-out accuracies after every evaluated step are the same."""
    other = {r["seed"]: r for r in b}
    return {
        str(r["seed"]): [p[3] for p in curves[id(r)]] == [p[3] for p in curves[id(other[r["seed"]])]]
        for r in a
        if r["seed"] in other
    }
