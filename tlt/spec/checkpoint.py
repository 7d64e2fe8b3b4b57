"""Whole-run checkpoints, and where their folder may be: a canonical path with no '..', and, when a volume
is mounted there on a cluster, nowhere over the pod's own mounts or its ServiceAccount token. The same
regexes are the CRD's CEL rules (tlt.spec.crd), so `tlt validate` and the API server refuse the same paths."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from tlt.spec.base import Name, PathStr, Spec

PARENT_SEGMENT = r"(^|/)\.\.(/|$)"
MSG_CHECKPOINT_PATH = (
    "checkpoint.path must not contain a '..' segment (it would leave the working directory or the volume)"
)
# Where every worker pod mounts its own volumes (tlt_operator.builders.pod); the working directory last.
POD_OWN_MOUNTS = ("/etc/tlt", "/tmp", "/home/tlt", "/dev/shm", "/var/lib/tlt")
# Where the kubelet mounts a ServiceAccount token (`/var/run` is a link to `/run` in the images).
TOKEN_DIRS = ("/var/run/secrets/kubernetes.io/serviceaccount", "/run/secrets/kubernetes.io/serviceaccount")
# A path in canonical form: no empty segment, no '.' segment but "." alone, no trailing '/' ("/" alone aside).
NON_CANONICAL = r"//|(^|/)\.(/|$)|./$"
MSG_CHECKPOINT_CANONICAL = (
    "checkpoint.path must be in canonical form: no '//', no '.' segment (but '.' alone) and no trailing '/'"
)


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def _forbidden_mount() -> str:
    """The regex of the canonical paths a checkpoint volume may not be mounted at: the pod's own mounts (or
    under them; under the working directory is where relative paths go, so only the directory itself is
    refused), the token directories (or under them), and any folder that holds one of them, '/' included."""
    under = [re.escape(p) + "(/.*)?" for p in (*POD_OWN_MOUNTS[:-1], *TOKEN_DIRS)]
    exact = [re.escape(POD_OWN_MOUNTS[-1]), re.escape(".")]
    over = sorted({re.escape(a) for p in (*POD_OWN_MOUNTS, *TOKEN_DIRS) for a in _ancestors(p)})
    return "^(" + "|".join([*under, *exact, *over]) + ")$"


FORBIDDEN_MOUNT = _forbidden_mount()
MSG_CHECKPOINT_MOUNT = (
    "checkpoint.path is where checkpoint.claimName is mounted and must not be '/', one of the "
    f"pod's own mounts ({', '.join(POD_OWN_MOUNTS[:-1])}), the ServiceAccount token directory, "
    "a folder under them or holding them, nor the working directory "
    f"{POD_OWN_MOUNTS[-1]} ('.'); a relative path is mounted under the working directory"
)


class CheckpointSpec(Spec):
    """Whole-run checkpoints (policy, optimizer, drafter, bandit)."""

    path: PathStr = Field(
        "checkpoints", description="Folder (local) or mount path of the checkpoint volume; canonical, no '..' segment."
    )
    claim_name: Name | None = Field(None, description="PersistentVolumeClaim mounted at `path` on a cluster.")
    interval_steps: int = Field(1, ge=1, le=1_000_000, description="Whole-run checkpoint every N steps.")
    keep: int = Field(2, ge=1, le=100, description="Checkpoints kept.")
    on_corrupt: Literal["fallback", "fail"] = Field(
        "fallback",
        description="When the newest checkpoint's files do not match their sha256 digests at resume: "
        "fallback resumes from the newest intact checkpoint (a warning and an event; the damaged folder is kept "
        "as corrupt-step-N), fail stops the run and leaves the folder as it is.",
    )

    @model_validator(mode="after")
    def _safe_path(self) -> CheckpointSpec:
        if re.search(PARENT_SEGMENT, self.path):
            raise ValueError(MSG_CHECKPOINT_PATH)
        if self.path != "." and re.search(NON_CANONICAL, self.path):
            raise ValueError(MSG_CHECKPOINT_CANONICAL)
        if self.claim_name and re.search(FORBIDDEN_MOUNT, self.path):
            raise ValueError(MSG_CHECKPOINT_MOUNT)
        return self
