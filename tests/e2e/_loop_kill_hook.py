"""Run `tlt` in this process, SIGKILLing it inside `save_checkpoint` of one step: after every file of
that checkpoint is written and fsynced, before its folder is renamed into place.

    python tests/e2e/_loop_kill_hook.py STEP train run.yaml --out DIR

The hook wraps the checkpoint module's directory fsync, which `save_checkpoint` calls on the
temporary folder right before the rename (and on the root after it).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from unittest import mock

from tlt import cli
from tlt.checkpoint import store as checkpoint


def main() -> int:
    kill_step = int(sys.argv[1])
    real_fsync_dir = checkpoint._fsync_dir

    def fsync_then_maybe_die(path: Path) -> None:
        real_fsync_dir(path)
        if Path(path).name.startswith(f".tmp-step-{kill_step:08d}-"):
            os.kill(os.getpid(), signal.SIGKILL)

    with mock.patch.object(checkpoint, "_fsync_dir", fsync_then_maybe_die):
        return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
