"""A rollout worker's work after a rollout, off the rollout's critical path and started late.

After a rollout a worker indexes its finished responses into the rollout-history store and hands
its samples to the drafter trainer (buffer them, score the drafters' top-1 agreement on them).
None of it is needed until the worker's next use of the drafter or the store, so it waits:
`leave` records it while the rollout's results are still being returned (pickling them holds the
interpreter, and work started then measurably slowed the return on two cores), and `start` runs
it, one job after another on one background thread, once the coordinator holds the results, or
earlier where something needs it first (`indexed`, `result`: the next rollout, a trainer start,
a checkpoint). `start` is idempotent and safe from any of the actor's threads.

The thread runs in the lowest CPU class (`tlt.drafter.priority`), as the spot trainer does: the last
shard's bookkeeping otherwise runs beside the policy update and takes a core from it; in SCHED_IDLE
the update is not slowed (measured: docs/measurements-history.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tlt.drafter.priority import lower_thread_priority

Settle = Callable[[], "Future[dict[str, Any]]"]


class AfterRollout:
    """The deferred index and settle jobs of a worker's last rollout.

    index: runs on the background thread. settle: called on `start`; returns the future of the
    bookkeeping's result (submitted to `submit`, or already done where the work ran in the call).
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="after-rollout", initializer=lower_thread_priority
        )
        self._lock = threading.Lock()
        self._index: Callable[[], None] | None = None
        self._settle: Settle | None = None
        self.indexing: Future | None = None
        self.settling: Future | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(*args)` on the background thread, after every job submitted before it."""
        return self._executor.submit(fn, *args)

    def leave(self, settle: Settle, index: Callable[[], None] | None = None) -> None:
        """Record the last rollout's jobs (not started: see `start`); the previous rollout's are done."""
        with self._lock:
            self._index, self._settle, self.settling = index, settle, None

    def start(self) -> None:
        """Start the recorded jobs that have not started: the index job first, then settle."""
        with self._lock:
            if self._index is not None:
                self.indexing, self._index = self.submit(self._index), None
            if self._settle is not None:
                self.settling, self._settle = self._settle(), None

    def indexed(self) -> None:
        """Start the jobs and wait until the last rollout's responses are indexed."""
        self.start()
        if self.indexing is not None:
            self.indexing.result()
            self.indexing = None

    def result(self) -> dict[str, Any] | None:
        """Start the jobs and wait for the settle job's result (None when no rollout left one)."""
        self.start()
        return self.settling.result() if self.settling is not None else None
