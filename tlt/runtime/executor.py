"""What the trainer (`tlt.runtime.trainer.Trainer`) asks of the place a run's roles run: the executor.

The trainer owns the step's order, its metrics, the run's events, checkpoints, resume and restarts; an executor
owns what runs where. Two implement it:

- `tlt.runtime.local_executor.LocalExecutor`: this process, no Ray (`tlt train --local`): the policy role, one
  rollout worker with its drafters, an in-process drafter hub and verifier;
- `tlt.runtime.ray_executor.RayExecutor`: Ray actors (rollout workers, verifiers, the drafter hub, spot trainers,
  the policy group's ranks), with worker replacement and recovery in place.

Both run every `speculative.mode`, arm and drafter, and write the same metric keys and checkpoint layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from tlt.checkpoint.store import Checkpoint
from tlt.rl.reward_plugin import RewardError
from tlt.rollout.types import Completion, Request
from tlt.runtime.partial_work import GroupWork
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.problem import Problem

if TYPE_CHECKING:  # the group's role needs Ray; this interface, and the in-process executor, do not
    from tlt.workers.policy import PolicyRole
    from tlt.workers.sharded_policy import ShardedPolicyRole

Emit = Callable[..., None]  # emit(kind, **info): an event of the step under way (`tlt.runtime.events`)
Generate = Callable[[list[Request]], list[Completion]]


@dataclass(frozen=True)
class RunContext:
    """What an executor is started with: the run, its output folder, the trainer's event function, and whether
    the events are followed live (a display): then the workers' states are recorded as events too."""

    run: TLTTrainingRun
    out_dir: Path
    emit: Emit
    watched: bool = False


@dataclass
class Rollout:
    """One step's rollout: `completions` B prompt-major, `scored` their (reward, error) in the same order (None
    for a partial rollout's response still running: finish reason "abort"),
    `results` each shard's result fields (`ShardGenerator.generate` plus the worker's set-up parts: `worker`,
    `called_at`, `setup_seconds`), `dispatched_at` when the shards went out, `ended_at` when the last one came
    back, `prepare` the seconds spent part by part before dispatching (`shard_rollout_metrics`)."""

    completions: list[Completion]
    scored: list[tuple[float, RewardError | None] | None]
    results: list[dict[str, Any]]
    dispatched_at: float
    ended_at: float
    prepare: dict[str, float] = field(default_factory=dict)


class Executor(Protocol):
    """The roles of a run, wherever they run. `step_failures`: the exceptions a step may fail with that the
    trainer recovers from (`recover`, else a restart from the newest checkpoint); () for none."""

    role: PolicyRole | ShardedPolicyRole
    step_failures: tuple[type[BaseException], ...]

    def restore(self, ckpt: Checkpoint | None) -> None:
        """Load the executor's parts of `ckpt` (the policy role's, the workers' and the hub's); None: start."""

    def rollout(
        self, step: int, ids: list[int], dataset: list[Problem], work: list[GroupWork] | None = None
    ) -> Rollout:
        """Roll out the problems `dataset[i] for i in ids`, `algorithm.groupSize` samples each, scored. A partial
        rollout (`work`: group i of problem `ids[i]`, `tlt.runtime.partial_work`) continues the unfinished members
        and ends once `algorithm.promptsPerStep` groups are complete; `results` carry `group_done_at` / `quota`
        per shard, in shard order (`tlt.runtime.partial_rollouts.PartialRollouts.absorb`)."""

    def update(self, completions: list[Completion], rewards: torch.Tensor) -> dict[str, Any]:
        """The policy update on the step's rollouts (rewards [P, G]) and the new weights out to the rollout
        engines; returns the update's metrics."""

    def after_update(self, step: int, rollout: Rollout) -> dict[str, Any]:
        """The drafters' part of the step once the policy is updated (their metrics, the keys of
        `tlt.runtime.shard_metrics.drafter_step_metrics` and `drafter.publish`'s, `bookkeeping_wait_seconds`)."""

    def end_step(self, step: int) -> dict[str, Any]:
        """After the step's timing: `worker_states` and `recoveries`; the drafter snapshot is queued."""

    def generate(self) -> Generate:
        """The held-out evaluation's generation with the current policy."""

    def add_to(self, ckpt: Checkpoint) -> None:
        """The executor's parts of a whole-run checkpoint."""

    def recover(self, exc: BaseException, step: int) -> bool:
        """Step `step` failed with `exc` (one of `step_failures`): True when it was fixed in place (lost workers
        replaced) and the step can run again; raises `RunFailed` when no retry can help."""

    def stopping(self) -> None:
        """A stop was requested after the step: what trains in the background stops before the checkpoint."""

    def finish(self, out_dir: Path, step: int) -> None:
        """The run's last step is done: its background training stopped, its served drafter written."""

    def reset(self) -> None:
        """Tear everything down and start afresh with a new policy role (a restart; `restore` follows)."""

    def shutdown(self) -> None:
        """Release what the executor started (actors, processes)."""
