"""Stopping a run on SIGTERM or SIGINT at a step boundary, with a checkpoint.

The first signal only sets a flag. The step loop looks at it once the step under way has finished its
policy update, writes a whole-run checkpoint of that step (a step boundary is all a checkpoint holds, so a
rerun resumes there exactly), stops its actors and Ray, and returns. A second signal ends the process at
once with 128 + its number; the last checkpoint stays as it was (a save is atomic).

Ray's `ray.init` puts its own SIGTERM handler on the driver (it kills the local Ray processes and exits;
the process then aborted in Ray's core-worker teardown): the run installs its handler again after Ray has
started (`install` may be called any number of times), and a SIGTERM inside `ray.init`, where Ray's handler
is in force (it raises SystemExit(15) there), is a stop too: Ray is shut down and the run stops before its
first step (`start_ray`, `StoppedWhileStarting`). Handlers can only be set from the main thread; in
another thread the run keeps the default behaviour and says so.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_TERMINATED = 128 + signal.SIGTERM
T = TypeVar("T")


class StoppedWhileStarting(Exception):
    """A SIGTERM arrived while Ray was starting: Ray was shut down and no step ran. `step` / `checkpoint`: the
    resume point the run had (0 / None: none), for the line it stops with."""

    def __init__(self, step: int = 0, checkpoint: str | None = None) -> None:
        super().__init__("stopped on SIGTERM while Ray was starting")
        self.step, self.checkpoint = step, checkpoint


class GracefulStop:
    """The stop flag the step loop reads (`requested`), set by the first SIGTERM / SIGINT."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def request(self, signum: int) -> None:
        """What the first signal does; the second ends the process at once."""
        if self.signum is not None:
            os.write(2, f"second {signal.Signals(signum).name}: stopping now, without a checkpoint\n".encode())
            os._exit(128 + signum)
        self.signum = signum
        log.warning(
            "%s received: stopping after the step under way, with a checkpoint (send it again to stop at once)",
            self.name,
        )

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.request(signum)

    def install(self) -> bool:
        """Make this object the handler of SIGTERM and SIGINT (again: after `ray.init` replaced it). False,
        with a warning, outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: SIGTERM / SIGINT keep their default handling (no graceful stop)")
            return False
        for sig in SIGNALS:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)
        return True

    def restore(self) -> None:
        """Put back the handlers that were there before the first `install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def start_ray(start: Callable[[], T], stop: GracefulStop | None, shutdown: Callable[[], None]) -> T:
    """`start()` (it calls `ray.init`), then `stop` installed again over Ray's handler. A SIGTERM inside it
    (Ray's handler raises SystemExit(15) there) shuts Ray down (`shutdown`) and raises StoppedWhileStarting,
    with `stop` requested; without a `stop` Ray's behaviour stands."""
    try:
        started = start()
    except SystemExit as exc:
        if stop is None or exc.code != signal.SIGTERM:
            raise
        shutdown()
        stop.signum = signal.SIGTERM
        log.warning("SIGTERM received while Ray was starting: Ray shut down, no step has run")
        raise StoppedWhileStarting() from None
    if stop is not None:
        stop.install()
    return started


@contextmanager
def stop_on_signals(stop: GracefulStop | None = None) -> Iterator[GracefulStop]:
    """`stop` (a new one by default) installed for the block, the previous handlers restored after it."""
    stop = stop or GracefulStop()
    stop.install()
    try:
        yield stop
    finally:
        stop.restore()


def stopped_line(name: str, signal_name: str, step: int, total: int, checkpoint: str | None) -> str:
    """The one line a stopped run prints: where it stopped and how it goes on."""
    where = f"stopped {name} on {signal_name} after step {step}/{total}"
    if checkpoint is None:
        return f"{where}: nothing to save (no step has run since the start); rerun the same command to go on"
    return f"{where}; checkpoint {checkpoint}; rerun the same command to resume from it"


def write_failed(stop: GracefulStop, error: Exception) -> tuple[int, str]:
    """(exit status, line) of a run whose checkpoint could not be written: 143 when it was stopping on a
    signal (no save was possible), else 1 (an error)."""
    if stop.requested:
        return EXIT_TERMINATED, f"stopped on {stop.name} without a checkpoint: {error}"
    return 1, f"error: {error}"
