"""Which failures of a Ray step another try can fix, and the one line that says what failed.

- lost: an actor's process is gone (killed, OOM-killed, its node lost), or an object whose only copy it
  held. The work it had is retried elsewhere (`tlt.runtime.rollout_dispatch`): nothing about it was wrong.
- permanent: a task (or an actor's constructor) raised an error of the program or of its input: a wrong
  value or type, a missing file or module, an unsupported shape. A step's rollout is seeded by prompt, so
  the same step raises it again on any worker: the run fails at once, with the cause's line, instead of
  spending `runPolicy.backoffLimit` on restarts that end in the same traceback.
- transient: anything else a task raised (RuntimeError: device errors, out of memory; OSError other than a
  missing path; timeouts). The step restarts from the newest checkpoint, counted against the limit.
"""

from __future__ import annotations

from ray.exceptions import ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError

LOST = "lost"
PERMANENT = "permanent"
TRANSIENT = "transient"

# errors of the program or its input: deterministic, whatever worker or attempt runs the step
PERMANENT_CAUSES: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    NotImplementedError,
    ImportError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
)


def cause_of(exc: BaseException) -> BaseException | None:
    """The exception a Ray task raised (None where Ray could not keep it, or `exc` is not a task's)."""
    return getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else None


def classify(exc: BaseException) -> str:
    """LOST, PERMANENT or TRANSIENT (see the module's docstring) for an exception out of `ray.get`."""
    if isinstance(exc, RayActorError):
        # an actor whose constructor raised never ran: starting it again raises the same
        return PERMANENT if exc.actor_init_failed else LOST
    if isinstance(exc, WorkerCrashedError | ObjectLostError):
        return LOST
    cause = cause_of(exc)
    if cause is not None and isinstance(cause, PERMANENT_CAUSES):
        return PERMANENT
    return TRANSIENT


def failure_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: message` of what failed, one line of at most `limit` characters: the task's own exception where
    Ray kept it; for an actor lost, Ray's first sentence; else the last line of Ray's message (a traceback,
    such as a constructor's, ends with the raised exception's line)."""
    cause = cause_of(exc)
    if cause is not None:
        text = str(cause).strip().splitlines()
        line = f"{type(cause).__name__}: {text[0] if text else ''}".rstrip(": ")
    else:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        if not lines:
            line = type(exc).__name__
        elif classify(exc) == LOST:
            line = f"{type(exc).__name__}: {lines[0].split('. ')[0].rstrip('.')}"
        else:
            line = lines[-1]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def permanent_message(exc: BaseException, step: int) -> str:
    """The line a run fails with when `step` failed permanently."""
    return (
        f"step {step} failed: {failure_line(exc)}. An error of the configuration or the program, which every "
        "retry repeats: not retried (fix it, then run the same command again to resume)"
    )
