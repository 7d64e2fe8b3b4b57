"""Runs inside `unshare --mount` for the test node agent: bind-mounts a pod's volumes at their mount
paths (shortest path first, so nested mounts land inside their parents), then execs the container's
command in its working directory with its environment. Argument: the plan JSON the agent wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def main(plan_file: str) -> None:
    plan = json.loads(Path(plan_file).read_text())
    for mount in sorted(plan["mounts"], key=lambda m: len(m["target"])):
        target = mount["target"]
        if mount["kind"] != "file":
            os.makedirs(target, exist_ok=True)
        if mount["kind"] == "tmpfs":
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", target], check=True)
        else:
            subprocess.run(["mount", "--bind", mount["source"], target], check=True)
        if mount["readOnly"]:
            subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)
    os.chdir(plan["cwd"])
    argv = plan["argv"]
    os.execvpe(argv[0], argv, plan["env"])


if __name__ == "__main__":
    main(sys.argv[1])
