"""A Ray step's drafter metrics: agreement, the hub's optimizer steps and the trainers' harvested time."""

from __future__ import annotations

from typing import Any


def drafter_step_metrics(results: list[dict[str, Any]], acks: list[dict[str, Any]],
                         pushes: list[dict[str, Any]]) -> dict[str, Any]:
    """results: the rollout workers' results (`agree` / `agree_total`: positions where the served
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
