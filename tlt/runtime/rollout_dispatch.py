"""Handing one step's prompt shards to the rollout workers and collecting them as they finish.

Each worker gets its shard of prompts (x group size), the policy weights (one object in the store) and
the step's drafters; it streams every finished response to a verifier. A worker that finishes turns
IDLE, and if the step trains the drafter and its slot is enabled, its spot trainer starts at once
(`tlt.runtime.spot_trainers`); the others start the bookkeeping of their rollout (`settle`).

A worker lost in the middle of its shard (its process killed, its node gone: `failure_kinds.LOST`) costs
the step nothing but time: its shard goes to the next worker that is free (one whose shard is done; a
trainer started there is stopped first), and a fresh worker is started in its place (`replace`), which
takes shards too once it is up. The shard's samples are seeded by prompt, group member and step
(`rl_step.make_requests`; a partial rollout's segments by group, member and step), so they are the same tokens
whichever worker generates them. A partial rollout's shards end at their share of the step's complete groups
(`partial_work.shard_quotas`). Failures of any
other kind, and a shard lost more than `MAX_SHARD_TRIES - 1` times, are raised to the coordinator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from tlt.runtime import rl_step
from tlt.runtime.failure_kinds import LOST, classify, failure_line
from tlt.runtime.partial_work import GroupWork, shard_quotas
from tlt.runtime.ray_cluster import Actors
from tlt.runtime.spot_trainers import SpotTrainers
from tlt.runtime.worker_replacement import replace_rank
from tlt.tasks.problem import Problem

log = logging.getLogger(__name__)

MAX_SHARD_TRIES = 3  # a shard is generated at most this many times in one step (2 workers lost under it)
Emit = Callable[..., None]


@dataclass(frozen=True)
class Shard:
    """One worker's part of a step: `order` its place in shard order, `ids` its prompts' dataset indices; a
    partial rollout's `work` (its groups) and `quota` (the complete groups it ends at)."""

    order: int
    ids: list[int]
    problems: list[Problem]
    work: list[GroupWork] | None = None
    quota: int = 0


@dataclass
class Collected:
    """A step's rollout, back: `results` and the `workers` that produced them, in shard order; `started`:
    the trainers started (worker -> when requested); `acks`: trainers stopped before the update to take a
    lost worker's shard; `recoveries`: one entry per shard retried."""

    results: list[dict[str, Any]]
    workers: list[Any]
    started: dict[Any, float]
    acks: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)


class StepRollout:
    """One step's shards on the run's rollout workers (`actors.rollout`, in rank order). A lost worker is
    replaced at its rank (`worker_replacement.replace_rank`) and its shard retried; where none can be started
    in its place (`actors.replace` None) its failure is raised."""

    def __init__(
        self,
        actors: Actors,
        step: int,
        ids: list[int],
        problems: list[Problem],
        call: tuple[Any, Any, Any],
        work: list[GroupWork] | None = None,
        prompts: int = 0,
    ) -> None:
        self.actors = actors
        self.step = step
        self.weights, self.drafter, self.candidate = call
        positions = rl_step.shards(list(range(len(ids))), len(actors.rollout))
        quotas = shard_quotas([len(p) for p in positions], prompts) if work is not None else [0] * len(positions)
        self.shards = [
            Shard(
                order,
                [ids[i] for i in part],
                [problems[ids[i]] for i in part],
                None if work is None else [work[i] for i in part],
                quota,
            )
            for order, (part, quota) in enumerate(zip(positions, quotas))
        ]
        self.out: dict[Any, tuple[Any, Shard]] = {}  # result ref -> (worker, shard)
        self.tries: dict[int, int] = {}

    def dispatch(self) -> int:
        """Start every worker's rollout of its shard (a worker with an empty shard gets none); returns how
        many shards went out."""
        for worker, shard in zip(self.actors.rollout, self.shards):
            if shard.ids:
                self._send(worker, shard)
        return len(self.out)

    def _send(self, worker: Any, shard: Shard) -> None:
        self.tries[shard.order] = self.tries.get(shard.order, 0) + 1
        args = (self.step, shard.ids, shard.problems, self.weights, self.drafter, self.candidate)
        partial = () if shard.work is None else (shard.work, [shard.quota])
        ref = worker.rollout.remote(*args, *partial)
        self.out[ref] = (worker, shard)

    def _name(self, worker: Any) -> str:
        workers = self.actors.rollout
        return self.actors.names[workers.index(worker)] if worker in workers else "a replaced rollout worker"

    def collect(self, trainers: SpotTrainers | None, emit: Emit, emit_workers: Callable[..., None]) -> Collected:
        """Wait for every shard, retrying a lost worker's on a free one; start each finished worker's trainer
        where `trainers.starts` allows (None: the step trains no drafter) and no lost shard waits.
        `emit(kind, **info)` records a run event; `emit_workers(skip=...)` the workers' states but those of `skip`
        (replacements still starting).

        A trainer start is not waited for while other shards are still out (the next result is collected at
        once); every start has completed (its errors raised) before this returns, so no later stop can
        overtake it on the worker's concurrent actor."""
        done: dict[int, tuple[dict[str, Any], Any]] = {}
        started: dict[Any, float] = {}
        starts: dict[Any, Any] = {}  # worker -> its trainer start's ref
        free: list[Any] = []  # workers whose shard is done and whose device is not training
        waiting: list[tuple[Shard, dict[str, Any]]] = []  # lost shards and their recovery records
        booting: dict[Any, Any] = {}  # a starting replacement's status ref -> the replacement
        collected = Collected([], [], started)
        lost: BaseException | None = None
        while self.out or waiting:
            while waiting and (free or started):
                worker = free.pop(0) if free else self._stop_one(trainers, started, starts, collected)
                shard, record = waiting.pop(0)
                self._send(worker, shard)
                record["retried_on"] = self._name(worker)
                collected.recoveries.append(record)
                emit("shard_retry", **record)
            if not self.out and not booting and lost is not None:
                raise lost  # no worker is left to take the lost shards: the step restarts
            ready, _ = ray.wait([*self.out, *booting], num_returns=1, timeout=0.5)
            for ref in ready:
                if ref in booting:
                    self._booted(ref, booting, free)
                    continue
                worker, shard = self.out.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:
                    if (
                        classify(exc) != LOST
                        or self.actors.replace is None
                        or self.tries[shard.order] >= MAX_SHARD_TRIES
                    ):
                        raise
                    lost = exc
                    waiting.append((shard, self._lost(worker, shard, exc, booting, emit)))
                    continue
                done[shard.order] = (result, worker)
                if trainers is not None and not waiting and trainers.starts(result["worker"], started, not self.out):
                    starts[worker] = trainers.start(worker, result["worker"], self.step, started)  # settles first
                else:
                    # the worker indexes its responses for history drafts, buffers its samples and scores the
                    # drafters now that its results are here (started before returning them, that work slowed
                    # the return); errors surface in `agreement`
                    worker.settle.remote()
                    free.append(worker)
            emit_workers(skip=set(booting.values()))
        ray.get(list(starts.values()))
        order = sorted(done)
        collected.results = [done[o][0] for o in order]
        collected.workers = [done[o][1] for o in order]
        return collected

    def _lost(
        self, worker: Any, shard: Shard, exc: BaseException, booting: dict[Any, Any], emit: Emit
    ) -> dict[str, Any]:
        """Record `worker` lost with `shard`; a replacement starts at its rank (not waited for). Returns the
        shard's recovery record."""
        name, reason = self._name(worker), failure_line(exc)
        log.warning("step %d: %s was lost (%s); its shard goes to the next free worker", self.step, name, reason)
        if worker in self.actors.rollout:
            replacement = replace_rank(self.actors, self.actors.rollout.index(worker), reason, emit)
            booting[replacement.status.remote()] = replacement
        return {
            "lost": name,
            "shard": shard.order,
            "prompts": len(shard.ids),
            "attempt": self.tries[shard.order],
            "reason": reason,
            "at": time.time(),
        }

    def _booted(self, ref: Any, booting: dict[Any, Any], free: list[Any]) -> None:
        """A replacement is up (free for a lost shard), or failed to start (logged: the step goes on)."""
        replacement = booting.pop(ref)
        try:
            name = ray.get(ref)["worker"]
        except Exception as exc:
            log.warning("step %d: a replacement rollout worker failed to start: %s", self.step, failure_line(exc))
            return
        if replacement in self.actors.rollout:
            self.actors.names[self.actors.rollout.index(replacement)] = name
            free.append(replacement)

    def _stop_one(
        self, trainers: SpotTrainers | None, started: dict[Any, float], starts: dict[Any, Any], collected: Collected
    ) -> Any:
        """Free the device of a worker whose trainer this step started: its start completes, it stops."""
        assert trainers is not None
        worker = next(iter(started))
        ray.get(starts.pop(worker))
        collected.acks.extend(trainers.stop({worker: started.pop(worker)}))
        return worker
