"""Prediction vs measurement on this machine: a `tlt train` run's steps against the simulator's.

The update's cost per token is fitted on the first half of the run's steps (their `update_seconds`,
which on this runtime include the weight sync, over prompt + response tokens); the second half's
step times are then predicted from their recorded response lengths with the bench's measured decode
costs and compared to the measured `step_seconds`. The error is |predicted - measured| / measured
over the held-out steps' total time.
"""

from __future__ import annotations

from typing import Any

from tlt.config import RunSpec
from tlt.sim.accept import AcceptCurve
from tlt.sim.measured import MeasuredCost
from tlt.sim.simulator import build_variants, simulate
from tlt.sim.step import ClusterConfig

MODE_VARIANT = {"off": "vanilla", "static": "static", "tlt": "tlt"}


def update_cost(history: list[dict[str, Any]], prompt_len: int) -> float:
    """Seconds of update (+ sync) per prompt-or-response token over `history`'s steps."""
    tokens = sum(len(m["response_lengths"]) * prompt_len + sum(m["response_lengths"]) for m in history)
    if tokens == 0:
        raise ValueError("no tokens to fit the update cost on")
    return sum(m["update_seconds"] for m in history) / tokens


def compare_run(history: list[dict[str, Any]], bench: dict[str, Any], spec: RunSpec, cluster: ClusterConfig,
                curve: AcceptCurve) -> dict[str, Any]:
    """Predicted vs measured step seconds of a run's held-out steps (see the module docstring)."""
    steps = [m for m in history if "response_lengths" in m]
    if len(steps) < 2:
        raise ValueError(f"the run has {len(steps)} steps with response_lengths; at least 2 are needed (the Ray "
                         "runtime records them: `tlt train` without --local)")
    if spec.speculative.mode not in MODE_VARIANT:
        raise ValueError(f"speculative.mode {spec.speculative.mode!r} has no simulated variant; "
                         f"allowed: {sorted(MODE_VARIANT)}")
    fit, held = steps[: len(steps) // 2], steps[len(steps) // 2:]
    per_token = update_cost(fit, cluster.prompt_len)
    cost = MeasuredCost.from_bench(bench, per_token, 0.0)
    variants = build_variants(spec.speculative, (MODE_VARIANT[spec.speculative.mode],), spec.drafter.training)
    result = simulate([m["response_lengths"] for m in held], variants, cost, cluster, spec.speculative, curve,
                      seed=spec.algorithm.seed)
    predicted = [r.step_seconds for r in result.steps[variants[0].name]]
    measured = [float(m["step_seconds"]) for m in held]
    return {
        "variant": variants[0].name,
        "update_seconds_per_token": per_token,
        "steps": [{"step": m["step"], "predicted_seconds": p, "measured_seconds": s}
                  for m, p, s in zip(held, predicted, measured)],
        "predicted_seconds": sum(predicted),
        "measured_seconds": sum(measured),
        "error": abs(sum(predicted) - sum(measured)) / sum(measured),
    }
