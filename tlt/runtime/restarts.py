"""A run's restarts after a failed step: the `restart` event, and the end of the run past its backoff limit.

A step that fails in a way nothing fixes in place makes the trainer (`tlt.runtime.trainer`) tear its executor
down and go on from the newest whole-run checkpoint (or the initial policy when there is none); restarts
beyond `runPolicy.backoffLimit` fail the run (`RunFailed`). Ray-free: the in-process executor's trainer uses it.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The run failed more often than `runPolicy.backoffLimit` allows."""


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
