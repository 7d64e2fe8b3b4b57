"""The nodes the test node agent plays: what each is (a name, `execute` or `hold`, capacity, labels, taints),
and whether this machine can run pods as local processes at all."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field


@dataclass
class FakeNode:
    name: str
    mode: str  # "execute" or "hold"
    capacity: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)


def why_pods_cannot_run() -> str | None:
    """Why `execute` nodes cannot run pods here (one line), or None: they need mount namespaces (root)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "util-linux `unshare` and `mount` are needed to run pods as local processes"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no mount namespace for pods here (`unshare --mount` says: {probe.stderr.strip()[:200]})"
    return None
