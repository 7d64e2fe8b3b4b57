"""The processes of a local Ray cluster, ended when the run that started it dies without ending them.

`ray.init` starts a local cluster whose processes share the driver's fate (the GCS and raylet die with it,
the workers with the raylet), but for two: the raylet's dashboard and runtime-env agents notice its death at
once, then spend 60 s reporting it to the GCS, dead too (Ray 2.60: a fixed timeout), ~250 MB together. A
SIGKILLed or OOM-killed driver can end nothing itself, so right after `ray.init` it starts this reaper: a
small process that holds the read end of a pipe only the driver holds open. At EOF (the driver exited,
however) it gives Ray's own teardown `GRACE_SECONDS`, then SIGKILLs every process of this user that still
holds a file open under the cluster's session folder (each Ray process keeps its logs there): this run's
cluster only, never another's. It ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole terminal group).

    python -m tlt.runtime.ray_reaper SESSION_DIR      # stdin: the pipe
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_SECONDS = 2.0
_reapers: list[subprocess.Popen] = []  # the driver's: the pipe stays open while this process lives


def is_ray(cmdline: bytes) -> bool:
    """Whether a /proc command line is a Ray process's: a `ray::...` title (workers, agents), or Ray's own
    binary or script among its first three words (GCS, raylet, monitors)."""
    words = cmdline.split(b"\0")[:3]
    programs = (b".py", b"/gcs_server", b"/raylet")
    return words[0].startswith(b"ray::") or any(b"/ray/" in w and w.endswith(programs) for w in words)


def session_processes(session_dir: str | Path, exclude: set[int] = frozenset()) -> list[int]:
    """PIDs of this user's Ray processes (`is_ray`) holding a file open under `session_dir`, but `exclude`."""
    root = os.path.realpath(session_dir) + os.sep
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            if entry.stat().st_uid != os.getuid() or not is_ray(Path(entry.path, "cmdline").read_bytes()):
                continue
            fds = os.scandir(f"/proc/{entry.name}/fd")
            if any(os.readlink(fd.path).startswith(root) for fd in fds):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def reap(session_dir: str, grace: float = GRACE_SECONDS) -> list[int]:
    """After `grace` seconds, SIGKILL what is left of the cluster of `session_dir`; returns the PIDs killed."""
    time.sleep(grace)
    killed = []
    for pid in session_processes(session_dir, exclude={os.getpid()}):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            continue
    return killed


def start_reaper(session_dir: str) -> subprocess.Popen | None:
    """Start the reaper of the local cluster of `session_dir` (None where /proc is missing: not Linux)."""
    if not Path("/proc/self/fd").is_dir():
        return None
    reaper = subprocess.Popen(
        [sys.executable, "-m", "tlt.runtime.ray_reaper", session_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _reapers.append(reaper)
    return reaper


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):  # until the driver's end closes
        pass
    reap(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
