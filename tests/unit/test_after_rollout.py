"""A rollout's after-work waits for `start`, runs in order on one thread, once, whoever asks first."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from tlt.runtime.after_rollout import AfterRollout


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
