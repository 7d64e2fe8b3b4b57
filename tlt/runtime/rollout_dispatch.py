"""Handing one step's prompt shards to the rollout workers and collecting them as they finish.

Each worker gets its shard of prompts (x group size), the policy weights (one object in the store) and
the step's drafters; it streams every finished response to a verifier. A worker that finishes turns
IDLE, and if the step trains the drafter and its slot is enabled, its spot trainer starts at once
(`tlt.runtime.spot_trainers`); the others start the bookkeeping of their rollout (`settle`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from tlt.runtime import rl_step
from tlt.runtime.spot_trainers import SpotTrainers
from tlt.tasks.problem import Problem


def dispatch(
    workers: list[Any], step: int, ids: list[int], problems: list[Problem], weights: Any, drafter: Any, candidate: Any
) -> dict[Any, Any]:
    """Start every worker's rollout of its shard of `ids` (`rl_step.shards`; a worker with an empty shard gets
    none). Returns {result ref: worker}, in shard order."""
    futures = {}
    for worker, shard in zip(workers, rl_step.shards(ids, len(workers))):
        if shard:
            futures[worker.rollout.remote(step, shard, [problems[i] for i in shard], weights, drafter, candidate)] = (
                worker
            )
    return futures


def collect(
    futures: dict[Any, Any], step: int, trainers: SpotTrainers | None, emit_workers: Callable[[], None]
) -> tuple[list[dict[str, Any]], dict[Any, float]]:
    """Wait for every shard; start each finished worker's trainer where `trainers.starts` allows (None: the
    step trains no drafter). Returns the results in shard order and the trainers started (worker -> when).

    A trainer start is not waited for while other shards are still out (the next result is collected at
    once); every start has completed (its errors raised) before this returns, so no later stop can
    overtake it on the worker's concurrent actor."""
    order = list(futures)
    done: dict[Any, dict[str, Any]] = {}
    started: dict[Any, float] = {}
    starts = []
    pending = list(order)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
        for ref in ready:
            result = ray.get(ref)
            done[ref] = result
            worker = futures[ref]
            if trainers is not None and trainers.starts(result["worker"], started, last=not pending):
                starts.append(trainers.start(worker, result["worker"], step, started))  # settles first
            else:
                # the worker indexes its responses for history drafts, buffers its samples and scores the
                # drafters now that its results are here (started before returning them, that work slowed
                # the return); errors surface in `agreement`
                worker.settle.remote()
        emit_workers()
    ray.get(starts)
    return [done[ref] for ref in order], started
