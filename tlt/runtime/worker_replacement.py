"""Rollout workers lost at any point of a step, found and replaced at their rank.

A worker's process can die at any moment: in the middle of its shard (the shard is retried,
`tlt.runtime.rollout_dispatch`), but also between steps, while its trainer stops, or after its shard
returned (the rewards it had the verifiers compute are owned by it, so they go with it); a verifier can
die with the step's rewards (on Kubernetes they share the rollout pods' nodes unless verifier pods run).
The coordinator then asks every worker and verifier for its status (`lost_ranks`), starts a fresh one in
place of each lost one (`replace_rank`: swapped in place in `Actors.rollout`, not waited for: its calls
queue until it is up; the live workers are told of a new verifier) and runs the step again, or, once the
policy has been updated, carries on without what the lost worker still had to say (`ask_each`: its
drafter scores and state timeline).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import ray

from tlt.runtime.failure_kinds import LOST, classify, failure_line
from tlt.runtime.ray_cluster import Actors

log = logging.getLogger(__name__)

PROBE_SECONDS = 10.0  # a status call answers at once (the actor's concurrent threads): silence is not death
Emit = Callable[..., None]


def lost_ranks(workers: list[Any], timeout: float = PROBE_SECONDS) -> list[int]:
    """Ranks of `workers` whose status call fails as lost (`failure_kinds.LOST`). A worker that does not answer
    within `timeout` (a replacement still starting) is not counted lost."""
    refs = [w.status.remote() for w in workers]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    lost = []
    for rank, ref in enumerate(refs):
        if ref not in ready:
            continue
        try:
            ray.get(ref)
        except Exception as exc:
            if classify(exc) != LOST:
                raise
            lost.append(rank)
    return lost


def replace_rank(actors: Actors, rank: int, reason: str, emit: Emit) -> Any:
    """Start a rollout worker at `rank` in place of the lost one (`actors.replace` must be set); event
    `worker_replaced`. Returns the new actor (not yet up)."""
    assert actors.replace is not None
    name = actors.names[rank] if rank < len(actors.names) else f"rollout-{rank}"
    log.warning("%s was lost (%s): a new rollout worker starts in its place", name, reason)
    actors.rollout[rank] = actors.replace(rank)
    emit("worker_replaced", worker=name, rank=rank, reason=reason)
    return actors.rollout[rank]


def replace_lost(actors: Actors, exc: BaseException, emit: Emit, running: dict[Any, Any]) -> list[str]:
    """After `exc`: replace every verifier and rollout worker found lost (`lost_ranks`; a lost worker is
    dropped from the carried trainers `running`; the live workers are told the new verifiers). Returns their
    names; [] when `exc` lost neither or one of them cannot be replaced."""
    if classify(exc) != LOST:
        return []
    verifiers, ranks = lost_ranks(actors.verifiers), lost_ranks(actors.rollout)
    if (ranks and actors.replace is None) or (verifiers and actors.replace_verifier is None):
        return []
    reason = failure_line(exc)
    for index in verifiers:  # first: the workers started below get the new verifiers
        assert actors.replace_verifier is not None
        actors.verifiers[index] = actors.replace_verifier()
        log.warning("verifier-%d was lost (%s): a new verifier starts in its place", index, reason)
        emit("verifier_replaced", verifier=f"verifier-{index}", reason=reason)
    names = [f"verifier-{index}" for index in verifiers] + [actors.names[rank] for rank in ranks]
    for rank in ranks:
        running.pop(actors.rollout[rank], None)
        replace_rank(actors, rank, reason, emit)
    if verifiers:
        live = [w for rank, w in enumerate(actors.rollout) if rank not in ranks]
        ray.get([w.set_verifiers.remote(actors.verifiers) for w in live])
    return names


def ask_each(workers: list[Any], method: str, default: Any) -> list[Any]:
    """`method` of each worker, called once per worker; a worker that produced two shards (its own and a lost
    worker's) reports on its last rollout, so its value goes with its last place and `default` (copied)
    with the earlier ones; so does a worker lost since (found and replaced at the next step's first call).
    Returns the values in the order of `workers`."""
    last = {worker: i for i, worker in enumerate(workers)}
    refs = {worker: getattr(worker, method).remote() for worker in last}
    values = {}
    for worker, ref in refs.items():
        try:
            values[worker] = ray.get(ref)
        except Exception as exc:
            if classify(exc) != LOST:
                raise
            values[worker] = copy.copy(default)
    return [values[w] if last[w] == i else copy.copy(default) for i, w in enumerate(workers)]
