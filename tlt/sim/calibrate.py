"""Prediction vs measurement on this machine: a `tlt train` run's steps against the simulator's.

The run's steps are split in halves. On the first half three things are fitted, each from the run's own
per-step metrics:

- the update: `update_seconds` = fixed + per_token x padded tokens (`fit_update`), the tokens the
  update's micro-batches compute (`step.update_tokens`: sorted micro-batches of
  `algorithm.microBatchSize` rows, each padded to its longest prompt + response). The fixed part (the
  optimizer step, the old-log-prob pass's set-up) is why a per-token cost fitted on one half does not
  carry to another whose responses are shorter or longer;
- the rollout's fixed overhead per step: the mean `rollout_overhead_seconds` (dispatch, the weights'
  `ray.put`, the stepper's set-up: the step's time outside the engines' generate call);
- the decode slowdown: measured `generate_seconds` over the simulated decode of the same steps. The
  bench measures costs in CPU time at one thread (the fastest repeat); a worker on a shared machine
  runs in wall time and gets part of a core, so its steps take longer by a factor the cost file
  cannot know.

The second half's step times are then predicted from their recorded response lengths and compared to
the measured `step_seconds`; the error is |predicted - measured| / measured over the held-out steps'
total time. Each held-out step also reports its terms (rollout, update, overhead) beside the measured
ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tlt.sim.accept import AcceptCurve
from tlt.sim.measured import MeasuredCost
from tlt.sim.simulator import build_variants, simulate
from tlt.sim.step import ClusterConfig, update_tokens
from tlt.spec.run import RunSpec

MODE_VARIANT = {"off": "vanilla", "static": "static", "tlt": "tlt"}


def update_cost(history: list[dict[str, Any]], prompt_len: int) -> float:
    """Seconds of update (+ sync) per prompt-or-response token over `history`'s steps."""
    tokens = sum(len(m["response_lengths"]) * prompt_len + sum(m["response_lengths"]) for m in history)
    if tokens == 0:
        raise ValueError("no tokens to fit the update cost on")
    return sum(m["update_seconds"] for m in history) / tokens


def fit_update(tokens: list[int], seconds: list[float]) -> tuple[float, float]:
    """(fixed seconds, seconds per token) of seconds = fixed + per_token x tokens, least squares with
    both terms >= 0: where the unconstrained fit makes one negative, it is 0 and the other is refitted
    (all tokens equal: the fixed term alone)."""
    if not tokens or len(tokens) != len(seconds):
        raise ValueError(f"fit_update needs as many token counts as seconds (>= 1), got {len(tokens)}, {len(seconds)}")
    n = len(tokens)
    mean_x, mean_y = sum(tokens) / n, sum(seconds) / n
    var = sum((x - mean_x) ** 2 for x in tokens)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(tokens, seconds)) / var if var else 0.0
    fixed = mean_y - slope * mean_x
    if slope < 0:
        return max(mean_y, 0.0), 0.0
    if fixed < 0:
        total = sum(tokens)
        return 0.0, (sum(seconds) / total if total else 0.0)
    return fixed, slope


def _decode_ends(result_steps: list[Any]) -> list[float]:
    """The simulated engines' time per step: the last replica's decode end (without reward verification)."""
    return [
        max(
            (seg.end for row in s.timelines for seg in row if seg.kind not in ("idle", "train", "update", "sync")),
            default=0.0,
        )
        for s in result_steps
    ]


def compare_run(
    history: list[dict[str, Any]],
    bench: dict[str, Any],
    spec: RunSpec,
    cluster: ClusterConfig,
    curve: AcceptCurve,
    *,
    fit_slowdown: bool = True,
) -> dict[str, Any]:
    """Predicted vs measured step seconds of a run's held-out steps (see the module docstring).
    fit_slowdown False: the decode costs as measured (factor 1)."""
    steps = [m for m in history if "response_lengths" in m]
    if len(steps) < 2:
        raise ValueError(
            f"the run has {len(steps)} steps with response_lengths; at least 2 are needed (the Ray "
            "runtime records them: `tlt train` without --local)"
        )
    variant_name = MODE_VARIANT.get(spec.speculative.mode)
    if variant_name is None:
        raise ValueError(
            f"speculative.mode {spec.speculative.mode!r} has no simulated variant; allowed: {sorted(MODE_VARIANT)}"
        )
    fit, held = steps[: len(steps) // 2], steps[len(steps) // 2 :]
    layout = (cluster.prompt_len, cluster.micro_batch_size, cluster.update_layout)
    fixed, per_token = fit_update(
        [update_tokens(m["response_lengths"], *layout) for m in fit], [float(m["update_seconds"]) for m in fit]
    )
    overhead = sum(float(m.get("rollout_overhead_seconds") or 0.0) for m in fit) / len(fit)
    # The fixed update seconds ride in the cost model's per-step sync term (added after the update).
    cost = MeasuredCost.from_bench(bench, per_token * cluster.update_gpus, fixed)

    def run(part: list[dict[str, Any]], model: MeasuredCost) -> list[Any]:
        variants = build_variants(spec.speculative, (variant_name,), spec.drafter.training)
        result = simulate(
            [m["response_lengths"] for m in part],
            variants,
            model,
            cluster,
            spec.speculative,
            curve,
            seed=spec.algorithm.seed,
        )
        return result.steps[variants[0].name]

    slowdown = 1.0
    measured_generate = [m.get("generate_seconds") for m in fit]
    if fit_slowdown and all(g is not None for g in measured_generate):
        simulated = sum(_decode_ends(run(fit, cost)))
        slowdown = sum(float(g) for g in measured_generate) / simulated if simulated > 0 else 1.0
    if slowdown != 1.0:
        cost = replace(
            cost,
            verify=tuple(replace(p, seconds=p.seconds * slowdown) for p in cost.verify),
            drafter=tuple((b, s * slowdown) for b, s in cost.drafter),
            contexts=tuple(
                (c, tuple((b, s * slowdown) for b, s in plain), tuple((b, s * slowdown) for b, s in dr))
                for c, plain, dr in cost.contexts
            ),
        )
    held_steps = run(held, cost)
    predicted = [r.step_seconds + overhead for r in held_steps]
    measured = [float(m["step_seconds"]) for m in held]
    rows = [
        {
            "step": m["step"],
            "predicted_seconds": p,
            "measured_seconds": s,
            "predicted_rollout": r.rollout_seconds + overhead,
            "measured_rollout": m.get("rollout_seconds"),
            "predicted_update": r.update_seconds + r.sync_seconds,
            "measured_update": m.get("update_seconds"),
        }
        for m, p, s, r in zip(held, predicted, measured, held_steps)
    ]
    return {
        "variant": variant_name,
        "update_seconds_per_token": per_token,
        "update_fixed_seconds": fixed,
        "rollout_overhead_seconds": overhead,
        "decode_slowdown": slowdown,
        "steps": rows,
        "predicted_seconds": sum(predicted),
        "measured_seconds": sum(measured),
        "error": abs(sum(predicted) - sum(measured)) / sum(measured),
    }
