"""A Ray run's whole-run checkpoint, and its recovery from a failed step.

A checkpoint holds the policy, its optimizer, the torch RNG, the step, the metrics so far and the restart
count, plus what the actors hold (`ActorStates`): the hub's drafter parameters and optimizer (with the
drafter the rollouts draft with), and every rollout worker's bandit and drafter buffer, in worker order.
The file format is `tlt.runtime.checkpoint`; which checkpoint a run resumes from, the newest one being
damaged, is `tlt.runtime.checkpoint_recovery`.

Failures: an actor that dies (or a task that raises: `STEP_FAILURES`) fails the step; the coordinator
tears every actor down, reloads the newest whole-run checkpoint (or the initial policy when there is none)
and starts fresh actors; restarts beyond `runPolicy.backoffLimit` fail the run (`RunFailed`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError

from tlt.drafter.warmstart import warm_start_params
from tlt.runtime.checkpoint import Checkpoint, add_drafter, drafter_of, save_checkpoint
from tlt.runtime.ray_cluster import Actors
from tlt.workers.policy import PolicyRole
from tlt.workers.sharded_policy import ShardedPolicyRole

log = logging.getLogger(__name__)

STEP_FAILURES = (RayActorError, RayTaskError, ObjectLostError, WorkerCrashedError)
Drafter = tuple[int, dict[str, torch.Tensor]]  # (version, parameters)


class RunFailed(RuntimeError):
    """The run failed more often than `runPolicy.backoffLimit` allows."""


@dataclass
class ActorStates:
    """What the actors hold that a checkpoint keeps: the hub's state (`DrafterHub.state`, with "served":
    the drafter the rollouts draft with), and each rollout worker's bandit and trainer state in worker
    order (None: nothing of that kind yet; the actors start afresh)."""

    drafter: dict[str, Any] | None = None
    bandits: list[dict[str, Any] | None] | None = None
    trainers: list[dict[str, Any] | None] | None = None

    def gather(self, actors: Actors, drafts: bool, served: Drafter | None) -> None:
        """Read the states from the live actors (`drafts`: the run drafts, so its workers keep bandits;
        `served`: the served drafter)."""
        if drafts:
            self.bandits = ray.get([w.bandit_state.remote() for w in actors.rollout])
        if actors.hub is not None:
            self.drafter = ray.get(actors.hub.state.remote())
            if served is not None:
                self.drafter["served"] = {"version": served[0], "params": served[1]}
            self.trainers = ray.get([w.trainer_state.remote() for w in actors.rollout])

    def hand_out(self, actors: Actors, drafter_path: str | None, policy_config: Any) -> None:
        """Load the states into fresh actors: the hub's (else the `speculative.drafterPath` warm start, for
        the policy of `policy_config`: the parts of the drafters the hub holds, `warm_start_params`; the
        workers have told it which as they started), then each rollout worker's own."""
        if actors.hub is not None and self.drafter is not None:
            ray.get(actors.hub.load_state.remote(self.drafter))
        elif actors.hub is not None and drafter_path is not None:
            learned = ray.get(actors.hub.drafters.remote())
            ray.get(actors.hub.load_params.remote(warm_start_params(drafter_path, policy_config, learned)))
        _per_worker(actors, "load_bandit", self.bandits, "bandits start afresh")
        _per_worker(actors, "load_trainer_state", self.trainers, "drafter buffers start empty")

    def served(self) -> Drafter | None:
        """The served drafter a checkpoint kept (None: the hub's newest is served)."""
        served = (self.drafter or {}).get("served")
        return (int(served["version"]), served["params"]) if served else None


def _per_worker(actors: Actors, method: str, states: list[Any] | None, otherwise: str) -> None:
    """Hand each rollout worker its own checkpointed state (`method` of the worker, in worker order)."""
    if states is None:
        return
    workers = actors.rollout
    if len(states) != len(workers):
        log.warning(
            "the checkpoint holds %d rollout workers' states for %s, the run has %d workers: %s",
            len(states),
            method,
            len(workers),
            otherwise,
        )
        return
    ray.get([getattr(w, method).remote(state) for w, state in zip(workers, states)])


def save_run(
    root: Path,
    keep: int,
    *,
    step: int,
    role: PolicyRole | ShardedPolicyRole,
    history: list[dict[str, Any]],
    restarts: int,
    spec: dict[str, Any],
    states: ActorStates,
) -> Path:
    """Write the whole-run checkpoint of `step` under `root` (keeping the newest `keep`); returns its folder.
    `spec`: the run spec as JSON, checked against the run that resumes from it."""
    state: dict[str, Any] = {"step": step, "metrics": history, "restarts": restarts, "spec": spec}
    if states.bandits is not None:
        state["bandits"] = states.bandits
    ckpt = Checkpoint(step=step, tensors={}, objects={}, state=state)
    role.add_to(ckpt)
    add_drafter(ckpt, states.drafter, states.trainers)
    return save_checkpoint(root, ckpt, keep=keep)


def restore_run(
    ckpt: Checkpoint, role: PolicyRole | ShardedPolicyRole
) -> tuple[int, list[dict[str, Any]], int, ActorStates]:
    """Load `ckpt` into the policy role (weights, optimizer, torch RNG); returns (step, metrics, restarts, actor
    states)."""
    role.load(ckpt)
    drafter, trainers = drafter_of(ckpt)
    states = ActorStates(drafter=drafter, bandits=ckpt.state.get("bandits"), trainers=trainers)
    return ckpt.step, list(ckpt.state["metrics"]), int(ckpt.state.get("restarts", 0)), states


def restart_event(failed: int, resumed: int, restarts: int, limit: int, exc: BaseException) -> dict[str, Any]:
    """The `restart` event of step `failed`, the run resumed at step `resumed` after `restarts` restarts."""
    return {
        "failed_step": failed,
        "resumed_step": resumed,
        "restarts": restarts,
        "limit": limit,
        "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
        "detail": str(exc),
    }


def check_backoff(event: dict[str, Any], exc: BaseException) -> None:
    """Log the restart `event` (`restart_event`); raise RunFailed once its restarts exceed its limit."""
    failed, restarts, limit = event["failed_step"], event["restarts"], event["limit"]
    log.warning(
        "step %d failed (%s); restart %d of %d from checkpoint step %d\n%s",
        failed,
        type(exc).__name__,
        restarts,
        limit,
        event["resumed_step"],
        exc,
    )
    if restarts > limit:
        raise RunFailed(
            f"step {failed} failed and {restarts} restarts exceed runPolicy.backoffLimit={limit}; last error: {exc}"
        ) from exc
