"""The processes of a Ray `tlt train`: a SIGTERM while Ray starts is a stop like any other (Ray's own
handler is in force inside `ray.init`), and no process of the run outlives it, however it ends.

Real signals to a real `tlt train` process; every process the run started (its descendants, seen while
it ran) is followed until it is gone.
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest
from _train_runs import start, train_args, write_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def descendants_once(pid: int, seen: dict[int, psutil.Process]) -> list[str]:
    """Record the live descendants of `pid` in `seen`; returns their names."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    names = []
    for kid in kids:
        try:
            names.append(" ".join(kid.cmdline()[:3]) or kid.name())
            seen.setdefault(kid.pid, kid)
        except psutil.Error:
            continue
    return names


def still_running(seen: dict[int, psutil.Process]) -> list[str]:
    out = []
    for proc in seen.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {' '.join(proc.cmdline()[:3])}")
        except psutil.NoSuchProcess:
            continue
    return out


def wait_gone(seen: dict[int, psutil.Process], seconds: float) -> list[str]:
    """The processes of `seen` still running after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := still_running(seen)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_sigterm_while_ray_starts_stops_with_one_line_and_leaves_no_process(tmp_path):
    run, out, log = write_run(tmp_path, "ray", 2), tmp_path / "out", tmp_path / "log"
    proc = start(train_args(run, out, local=False), log)
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 120
        while not any("gcs_server" in n for n in descendants_once(proc.pid, seen)):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # ray.init is under way: its GCS is up, the driver not yet connected
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert "SIGTERM received while Ray was starting" in text, text[-3000:]
    assert code == 0, text[-3000:]
    assert "stopped resume-test on SIGTERM after step 0/2: nothing to save" in text
    assert "Traceback" not in text
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()
    assert not (left := wait_gone(seen, 15)), f"processes of the run still running: {left}"


def test_a_sigkilled_driver_leaves_no_process_of_its_cluster(tmp_path):
    """Ray ends most of its processes with the driver; its dashboard and runtime-env agents would linger
    ~60 s (reporting the death to a dead GCS): the run's reaper ends them within seconds."""
    run, out, log = write_run(tmp_path, "ray", 40), tmp_path / "out", tmp_path / "log"
    proc = start(train_args(run, out, local=False), log)
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
            descendants_once(proc.pid, seen)
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        names = descendants_once(proc.pid, seen)
        assert any("DashboardAgent" in n for n in names) and any("ray_reaper" in n for n in names), names
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed = time.monotonic()
    left = wait_gone(seen, 20)
    assert not left, f"still running {time.monotonic() - killed:.0f} s after the SIGKILL: {left}"
