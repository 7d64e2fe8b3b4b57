"""One step's rollout and drafter metrics from the rollout workers' results, as the trainer records them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from tlt.adaptive.adaptive_stepper import merge_arm_rates
from tlt.rollout.step_timing import merge_tables
from tlt.runtime import rl_step


def pool_by_position(counts: Iterable[dict[str, list[int]] | None]) -> dict[str, list[int]]:
    """Per-range counts summed: each item maps a response-position range (its lower edge,
    `tlt.rollout.speculative.POSITION_EDGES`) to [row-steps, accepted drafts] (a shard's or a step's
    `sd_by_position`; None counts nothing). Ranges in order."""
    total: dict[str, list[int]] = {}
    for item in counts:
        for edge, (n, accepted) in (item or {}).items():
            cell = total.setdefault(edge, [0, 0])
            cell[0] += n
            cell[1] += accepted
    return dict(sorted(total.items(), key=lambda kv: int(kv[0])))


def pool_by_bucket(counts: Iterable[dict[str, list[int]] | None]) -> dict[str, list[int]]:
    """Per-bucket draft counts summed: each item maps a bucket's upper bound (`speculative.buckets`) to
    [row-steps that drafted, draft tokens proposed, draft tokens accepted] (a worker's `sd_by_bucket`;
    None counts nothing). Buckets in order."""
    total: dict[str, list[int]] = {}
    for item in counts:
        for bucket, cell in (item or {}).items():
            into = total.setdefault(bucket, [0, 0, 0])
            for i, n in enumerate(cell):
                into[i] += n
    return dict(sorted(total.items(), key=lambda kv: int(kv[0])))


def accept_by_position(counts: Iterable[dict[str, list[int]] | None]) -> dict[str, dict[str, float]]:
    """Accept length (accepted drafts + 1 per row-step) per response-position range, `counts` pooled:
    {edge: {"accept_length", "row_steps"}}; ranges without a row-step left out."""
    return {
        edge: {"accept_length": (n + a) / n, "row_steps": n} for edge, (n, a) in pool_by_position(counts).items() if n
    }


def shard_rollout_metrics(
    completions: list[Any],
    rewards: torch.Tensor,
    results: list[dict[str, Any]],
    started: float,
    rollout_end: float,
    prepare: dict[str, float] | None = None,
) -> dict[str, Any]:
    """rl_step.rollout_metrics over all shards; the tail is the slowest worker's (the critical path).

    completions: every shard's, in order; rewards [P, G]; results: each worker's `RolloutWorker.rollout`
    result (finished_at, generate_seconds, trace, sd_* counts and arm rates, streamed); started /
    rollout_end: the step's start and the arrival of the last shard (wall seconds); prepare: the seconds
    the coordinator spent, part by part, between the start and dispatching the shards (its sum)."""
    slowest = max(results, key=lambda r: r["finished_at"])
    trace = rl_step.RolloutTrace(steps=list(slowest["trace"]))
    out = rl_step.rollout_metrics(completions, rewards, trace, rollout_end - started)
    out["idle_seconds"] = sum(rollout_end - r["finished_at"] for r in results)
    # The engines' own time (the slowest worker's generate call) and what the step added around it:
    # dispatch, weight and drafter loading, the stepper's set-up, and the work before results return.
    out["generate_seconds"] = max(r.get("generate_seconds", 0.0) for r in results)
    out["rollout_overhead_seconds"] = (rollout_end - started) - out["generate_seconds"]
    if "called_at" in slowest:  # the slowest worker's overhead, part by part (its critical path)
        prepare = prepare or {}
        out["rollout_overhead_parts"] = {
            **prepare,
            "dispatch": slowest["called_at"] - started - sum(prepare.values()),
            **slowest["setup_seconds"],
            "return": rollout_end - slowest["finished_at"],
        }
    row_steps = sum(r["sd_row_steps"] for r in results)
    out["accept_length"] = (sum(r["sd_accepted"] for r in results) + row_steps) / row_steps if row_steps else None
    out["sd_row_steps"] = row_steps
    out["sd_by_position"] = pool_by_position(r.get("sd_by_position") for r in results)
    out["sd_by_bucket"] = pool_by_bucket(r.get("sd_by_bucket") for r in results)
    health = {r["worker"]: r["sd_health"] for r in results if r.get("sd_health")}
    if health:  # per worker: its engine's drafter health and the version it serves (`tlt.workers.drafter_watch`)
        out["drafter_health"] = dict(sorted(health.items()))
    arms: dict[str, int] = {}
    for r in results:
        for arm, count in r["sd_arms"].items():
            arms[arm] = arms.get(arm, 0) + count
    out["sd_arms"] = dict(sorted(arms.items()))
    out["sd_arm_rates"] = merge_arm_rates([r.get("sd_arm_rates") or {} for r in results])
    covered = [r["draft_vocab_coverage"] for r in results if r.get("draft_vocab_coverage")]
    total = sum(n for _, n in covered)  # generated tokens inside the draft vocabulary in use / all of them
    out["draft_vocab_coverage"] = sum(i for i, _ in covered) / total if total else None
    totals = {"seconds_by_running": Counter(), "steps_by_running": Counter(), "tokens_by_running": Counter()}
    for r in results:  # every worker's engine, not only the slowest
        trace = rl_step.RolloutTrace(steps=list(r["trace"]))
        totals["seconds_by_running"].update(trace.decode_seconds_by_running())
        totals["steps_by_running"].update(trace.decode_steps_by_running())
        totals["tokens_by_running"].update(trace.decode_tokens_by_running())
    for key, total in totals.items():
        out[key] = {str(k): v for k, v in sorted(total.items())}
    splits = [r["step_split"] for r in results if "step_split" in r]
    if splits:
        out["step_split"] = merge_tables(splits)
    out["streamed_rewards"] = sum(r["streamed"] for r in results)
    out["response_lengths"] = [len(c.token_ids) for c in completions]
    return out


def drafter_step_metrics(
    results: list[dict[str, Any]], acks: list[dict[str, Any]], pushes: list[dict[str, Any]]
) -> dict[str, Any]:
    """A step's drafter metrics: agreement, the hub's optimizer steps and the trainers' harvested time.

    results: the rollout workers' results (`agree` / `agree_total`: positions where the served
    drafter's guess equals the policy's token, of those scored); acks: the stopped trainers'
    acknowledgements (`was_training`, `started_at` / `stopped_at` on the worker, `requested_at` /
    `acked_at` on the coordinator); pushes: the hub's parameter syncs since the last step (`steps`,
    `loss`, `tokens`, `version`, `trainer`)."""
    agree, total = sum(r["agree"] for r in results), sum(r["agree_total"] for r in results)
    optimizer_steps = sum(p["steps"] for p in pushes)  # optimizer steps on the drafter since the last step
    trained = [a for a in acks if a.get("was_training")]
    latencies = [a["acked_at"] - a["requested_at"] for a in trained]
    return {
        "drafter_agreement": agree / total if total else None,
        # vLLM workers: seconds of the policy forward that recomputes the drafter's features, off the rollout
        "drafter_feature_seconds": sum(r["feature_seconds"] for r in results)
        if any("feature_seconds" in r for r in results)
        else None,
        "drafter_version": pushes[-1]["version"] if pushes else None,
        "drafter_loss": sum(p["loss"] * p["steps"] for p in pushes) / optimizer_steps if optimizer_steps else None,
        "drafter_updates": optimizer_steps,
        "drafter_trainers": sorted({p["trainer"] for p in pushes}),
        "drafter_tokens": sum(p["tokens"] for p in pushes),
        "harvested_seconds": sum(a["stopped_at"] - a["started_at"] for a in trained),
        "stop_latency_max": max(latencies) if latencies else None,
        "trainer_acks": trained,
        "hub_pushes": pushes,
    }
