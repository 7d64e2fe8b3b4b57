"""A rollout's after-work waits for `start`, runs in order on one thread, once, whoever asks first."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future

import pytest

from tlt.drafter.priority import BACKGROUND_NICE
from tlt.workers.after_rollout import AfterRollout


def _recorder():
    done: list[str] = []
    after = AfterRollout()

    def settle() -> Future:
        return after.submit(lambda: done.append("settle") or {"agree": len(done)})

    return after, done, settle


def test_nothing_runs_before_start_and_the_index_job_runs_first():
    after, done, settle = _recorder()
    gate = threading.Event()
    after.submit(gate.wait, 60)
    after.leave(settle, lambda: done.append("index"))
    assert after.indexing is None and after.settling is None, "left, not started"
    gate.set()
    assert after.result() == {"agree": 2}
    assert done == ["index", "settle"]


def test_start_is_idempotent_and_indexed_waits_only_for_the_index():
    after, done, settle = _recorder()
    calls = []
    after.leave(lambda: calls.append(1) or settle(), lambda: done.append("index"))
    threads = [threading.Thread(target=after.start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after.indexed()
    assert after.result() == {"agree": 2} and calls == [1], "each job ran once"
    assert after.result() == {"agree": 2}, "the result stays until the next rollout leaves its jobs"


def test_a_new_rollout_replaces_the_result_and_no_rollout_means_none():
    after, done, settle = _recorder()
    assert after.result() is None
    after.leave(settle)
    assert after.result() == {"agree": 1}
    after.leave(settle)
    assert after.settling is None
    assert after.result() == {"agree": 2}
    assert done == ["settle", "settle"]


def test_a_failing_job_raises_where_its_result_is_asked():
    after = AfterRollout()

    def boom() -> Future:
        return after.submit(lambda: 1 / 0)

    after.leave(boom)
    after.start()
    with pytest.raises(ZeroDivisionError):
        after.result()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
def test_the_jobs_run_in_the_idle_class_and_the_caller_keeps_its_own():
    def priority() -> tuple[int, int]:
        tid = threading.get_native_id()
        return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)

    caller = priority()
    after = AfterRollout()
    seen: list[tuple[int, int]] = []
    after.leave(lambda: after.submit(lambda: seen.append(priority()) or {}), lambda: seen.append(priority()))
    assert after.result() == {}
    assert seen == [(os.SCHED_IDLE, BACKGROUND_NICE)] * 2, "index and settle jobs both in the idle class"
    assert priority() == caller != (os.SCHED_IDLE, BACKGROUND_NICE)
