"""The reaper of a local Ray cluster: after the driver's pipe closes it kills the Ray processes that hold a
file open under the cluster's session folder, and nothing else."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tlt.runtime.ray_reaper import is_ray, reap, session_processes

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="skipped: no /proc (not Linux)")

HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(120)"


def holding(path: Path, title: str) -> subprocess.Popen:
    """A process holding `path` open, `title` its argv[0] (as Ray's processes set theirs)."""
    command = f'exec -a "{title}" "{sys.executable}" -c "$0" "$1"'
    proc = subprocess.Popen(["bash", "-c", command, HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def session(tmp_path):
    (tmp_path / "session" / "logs").mkdir(parents=True)
    (tmp_path / "session" / "logs" / "raylet.out").write_text("")
    (tmp_path / "elsewhere.log").write_text("")
    return tmp_path


def test_only_ray_processes_holding_the_session_open_are_reaped(session):
    log = session / "session" / "logs" / "raylet.out"
    ray_proc = holding(log, "ray::DashboardAgent")
    viewer = holding(log, "less")  # a user's own process reading a log: left alone
    other = holding(session / "elsewhere.log", "ray::Other")  # another cluster's: left alone
    try:
        assert session_processes(session / "session") == [ray_proc.pid]
        assert reap(str(session / "session"), grace=0.0) == [ray_proc.pid]
        assert ray_proc.wait(timeout=10) == -9
        time.sleep(0.2)
        assert viewer.poll() is None and other.poll() is None
    finally:
        for proc in (ray_proc, viewer, other):
            proc.kill()
            proc.wait()


def test_the_reaper_waits_for_the_pipe_then_reaps(session):
    held = holding(session / "session" / "logs" / "raylet.out", "ray::RuntimeEnvAgent")
    reaper = subprocess.Popen(
        [sys.executable, "-m", "tlt.runtime.ray_reaper", str(session / "session")], stdin=subprocess.PIPE
    )
    try:
        time.sleep(1.0)
        assert reaper.poll() is None and held.poll() is None, "reaped while the driver's pipe was open"
        assert reaper.stdin is not None
        reaper.stdin.close()  # the driver is gone
        assert reaper.wait(timeout=30) == 0
        assert held.wait(timeout=10) == -9
    finally:
        for proc in (held, reaper):
            proc.kill()
            proc.wait()


def test_ray_command_lines():
    assert is_ray(b"ray::IDLE\0") and is_ray(b"ray::DashboardAgent\0")
    assert is_ray(b"/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet\0--raylet_socket_name=x\0")
    assert is_ray(b"/venv/bin/python\0-u\0/venv/lib/python3.11/site-packages/ray/_private/log_monitor.py\0")
    assert not is_ray(b"less\0/tmp/ray/session_1/logs/raylet.out\0")
    assert not is_ray(b"python\0-c\0print(1)\0ray::x\0") and not is_ray(b"")
