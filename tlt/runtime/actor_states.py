"""What a Ray run's actors hold in a whole-run checkpoint, and the failures that lose them.

The trainer's checkpoint (`tlt.runtime.trainer`) holds the policy, its optimizer, the torch RNG, the step, the
metrics so far and the restart count; on Ray also what the actors hold (`ActorStates`): the hub's drafter
parameters and optimizer (with the drafter the rollouts draft with), and every rollout worker's bandit and
drafter buffer, in worker order. The file format is `tlt.checkpoint.store`; which checkpoint a run resumes
from, the newest one being damaged, is `tlt.checkpoint.recovery`.

An actor that dies (or a task that raises: `STEP_FAILURES`) fails the step; the trainer restarts it
(`tlt.runtime.restarts`) and hands the newest checkpoint's states to fresh actors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError

from tlt.drafter.warmstart import warm_start_params
from tlt.runtime.ray_cluster import Actors

log = logging.getLogger(__name__)

STEP_FAILURES = (RayActorError, RayTaskError, ObjectLostError, WorkerCrashedError)
Drafter = tuple[int, dict[str, torch.Tensor]]  # (version, parameters)


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
