"""What a failed Ray step does short of a restart: fail the run at once, or replace lost actors and run again.

- A permanent failure (`tlt.runtime.failure_kinds`: an error of the configuration or the program) fails the run
  at once with its line (event `failed`): every retry would repeat it.
- Rollout workers or verifiers lost before the policy update are replaced at their rank
  (`tlt.runtime.worker_replacement.replace_lost`) and the step runs again (event `step_redone`, at most
  `MAX_REDOS` times): seeded by prompt, it is the same step. Once the policy is changing (`updating`) a
  step cannot run again; a worker lost after the update is replaced when it is next asked for something.

Anything else is the trainer's restart from the newest checkpoint (`tlt.runtime.restarts`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tlt.runtime.failure_kinds import PERMANENT, classify, failure_line, permanent_message
from tlt.runtime.ray_cluster import Actors
from tlt.runtime.restarts import RunFailed
from tlt.runtime.worker_replacement import replace_lost

log = logging.getLogger(__name__)

MAX_REDOS = 2  # a step runs at most this many more times after losing rollout workers outside their rollout
Emit = Callable[..., None]


class StepRecovery:
    """The step under way: `updating` (its policy update has begun), `redos` (times it ran again) and `redone`
    (their records, for the step's `recoveries`)."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.updating = False
        self.redos = 0
        self.redone: list[dict[str, Any]] = []

    def finished(self) -> None:
        """The step completed: the next one starts with no redos."""
        self.redos, self.redone = 0, []

    def fail_if_permanent(self, exc: BaseException, step: int) -> None:
        """RunFailed at once, with the cause's line, for a failure of `step` no restart changes."""
        if classify(exc) == PERMANENT:
            self.emit("failed", reason=failure_line(exc), retried=False)
            raise RunFailed(permanent_message(exc, step)) from exc

    def replace_lost(
        self, actors: Actors | None, exc: BaseException, running: dict[Any, Any], step: int, redo: bool
    ) -> bool:
        """Replace the rollout workers and verifiers `exc` lost (`replace_lost`; `running`: the carried trainers);
        True when that fixes it: for the step to run again (`redo`) the policy must be untouched and
        `MAX_REDOS` not spent."""
        if actors is None or (redo and (self.updating or self.redos >= MAX_REDOS)):
            return False
        lost = replace_lost(actors, exc, self.emit, running)
        if not lost:
            log.warning("step %d: %s is not a lost rollout worker or verifier", step, failure_line(exc))
        if lost and redo:
            self.redos += 1
            self.redone.append({"lost": lost, "reason": failure_line(exc), "attempt": self.redos, "at": time.time()})
            self.emit("step_redone", **self.redone[-1])
        return bool(lost)
