"""Runs inside `unshare --mount` for the test node agent: bind-mounts a pod's volumes at their mount
paths (shortest path first, so nested mounts land inside their parents), keeps the host folders the
process needs visible, then execs the container's command in its working directory with its
environment. Argument: the plan JSON the agent wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def main(plan_file: str) -> None:
    plan = json.loads(Path(plan_file).read_text())
    # Host folders the process needs (its virtualenv, the source tree) that a volume would hide, e.g. a
    # checkout under /tmp: bound aside first, then back in place over the volume.
    for i, path in enumerate(plan["keep"]):
        aside = os.path.join(plan["aside"], str(i))
        os.makedirs(aside, exist_ok=True)
        subprocess.run(["mount", "--bind", path, aside], check=True)
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
    for i, path in enumerate(plan["keep"]):
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "--bind", os.path.join(plan["aside"], str(i)), path], check=True)
    os.chdir(plan["cwd"])
    argv = plan["argv"]
    os.execvpe(argv[0], argv, plan["env"])


if __name__ == "__main__":
    main(sys.argv[1])
