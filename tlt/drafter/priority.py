"""The CPU priority of background work: spot trainers, the hub's pushes, snapshot writes, and a rollout
worker's after-rollout bookkeeping (`tlt.workers.after_rollout`).

They harvest idle capacity, so each such thread moves itself to the lowest priority there is: Linux's
SCHED_IDLE class, after nice 19 in case the class is refused. SCHED_IDLE, not only a nice value, because
the kernel counts a core running only SCHED_IDLE threads as idle when it places a waking thread: Ray's,
the coordinator's and the verifiers' many short wake-ups land on the trainer's core instead of
preempting the decoding one (docs/measurements-history.md has the measurement). Linux applies both per thread.
"""

from __future__ import annotations

import os
import threading

# The nice value where SCHED_IDLE is refused: the lowest, below every rollout and serving thread.
BACKGROUND_NICE = 19


def lower_thread_priority(nice: int = BACKGROUND_NICE) -> str | None:
    """Move the calling thread to the lowest CPU priority: nice `nice` (never lowered: that needs privileges),
    then the SCHED_IDLE class (Linux; one-way for an unprivileged thread, so only for threads that do
    nothing else afterwards, or whose every later job is background work too).

    Returns what the thread runs at afterwards: "idle" (SCHED_IDLE), "nice <n>" where only the nice
    value could be set, or None where the OS has no per-thread priority (not Linux) or refuses both.
    """
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return None
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        lowered = f"nice {os.getpriority(os.PRIO_PROCESS, tid)}"
    except OSError:
        lowered = None
    if hasattr(os, "SCHED_IDLE"):
        try:
            if os.sched_getscheduler(tid) != os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            return "idle"
        except OSError:
            pass
    return lowered
