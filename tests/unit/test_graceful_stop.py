"""The stop flag of a graceful stop: the first SIGTERM / SIGINT sets it and nothing else, the handlers come
off again, and the lines a stopped run prints."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tlt.runtime.graceful_stop import EXIT_TERMINATED, GracefulStop, stop_on_signals, stopped_line, write_failed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_only_sets_the_flag_and_the_old_handlers_come_back(sig):
    before = signal.getsignal(sig)
    with stop_on_signals() as stop:
        assert not stop.requested
        os.kill(os.getpid(), sig)
        assert stop.requested and stop.name == signal.Signals(sig).name
    assert signal.getsignal(sig) is before


def test_install_again_puts_the_handler_back_over_another_one():
    """As after `ray.init`, which sets its own SIGTERM handler; restore still returns to the first one."""
    before = signal.getsignal(signal.SIGTERM)
    stop = GracefulStop()
    stop.install()
    signal.signal(signal.SIGTERM, lambda *_: None)
    stop.install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested
    stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_outside_the_main_thread_nothing_is_installed():
    results = []
    thread = threading.Thread(target=lambda: results.append(GracefulStop().install()))
    thread.start()
    thread.join()
    assert results == [False]


def test_the_lines_a_stopped_run_prints():
    assert stopped_line("r", "SIGTERM", 3, 10, "/c/step-00000003") == (
        "stopped r on SIGTERM after step 3/10; checkpoint /c/step-00000003; rerun the same command to resume from it"
    )
    assert "nothing to save" in stopped_line("r", "SIGINT", 0, 10, None)
    stop = GracefulStop()
    assert write_failed(stop, OSError("disk full")) == (1, "error: disk full")
    stop.signum = signal.SIGTERM
    assert write_failed(stop, OSError("disk full")) == (
        EXIT_TERMINATED,
        "stopped on SIGTERM without a checkpoint: disk full",
    )
