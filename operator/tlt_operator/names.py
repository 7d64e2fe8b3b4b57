"""Fixed names and labels of a run's children: the same run always maps to the same names, so a
restarted operator finds what it made and creation can never duplicate a child."""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from tlt.spec.run import GCS_PORT, RAY_CLIENT_PORT  # noqa: F401 (re-exported: the pods' Ray ports)

Role = Literal["policy", "rollout", "verifier"]
ROLES: tuple[Role, ...] = ("policy", "rollout", "verifier")

MANAGER = "tlt.dev/operator"
RUN_LABEL = "tlt.dev/run"
ROLE_LABEL = "tlt.dev/role"
RANK_LABEL = "tlt.dev/rank"
SPEC_HASH_ANNOTATION = "tlt.dev/spec-hash"
PROGRESS_KEY = "progress"  # the reports ConfigMap's key the coordinator writes
STATE_KEY_PREFIX = "state."  # + `rollout-<rank>`: the key each rollout worker writes
SPEC_DIR = "/etc/tlt"
SPEC_FILE = "run.yaml"
RAY_TOKEN_KEY = "token"

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _digest(text: str, n: int = 10) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def label_value(run: str) -> str:
    """The run's name as a label value (at most 63 characters; longer names are shortened with a
    digest so they stay unique)."""
    return run if len(run) <= 63 else f"{run[:52].rstrip('-.')}-{_digest(run)}"


def service_name(run: str) -> str:
    """The headless Service: the run's name when it is a DNS-1035 label, else `tlt-<digest>`."""
    return run if len(run) <= 63 and _DNS1035.match(run) else f"tlt-{_digest(run)}"


def configmap_name(run: str) -> str:
    return f"{run}-spec" if len(run) <= 248 else f"{run[:237]}-{_digest(run)}-spec"


def claim_template_name(run: str) -> str:
    """The rollout pods' ResourceClaimTemplate (sidecar placement)."""
    return f"{run}-rollout-gpu" if len(run) <= 241 else f"{run[:230]}-{_digest(run)}-rollout-gpu"


def _suffixed(run: str, suffix: str) -> str:
    """`<run><suffix>` within 253 characters (a longer run name is cut and given a digest)."""
    return f"{run}{suffix}" if len(run) + len(suffix) <= 253 else f"{run[: 242 - len(suffix)]}-{_digest(run)}{suffix}"


def ray_token_secret_prefix(run: str) -> str:
    """`generateName` of the Secret holding the run's Ray token (key `token`): the server appends 5
    random characters, so no one can make the Secret a run will use before the run makes it."""
    return _suffixed(run, "-ray-token-")[:248]


def network_policy_name(run: str) -> str:
    return _suffixed(run, "-ray")


def reports_name(run: str) -> str:
    """The ConfigMap the run's workers write their reports into (progress, worker states)."""
    return _suffixed(run, "-reports")


def worker_account_name(run: str) -> str:
    """The ServiceAccount, Role and RoleBinding of the run's pods that call the API (policy rank 0
    and rollout pods)."""
    return _suffixed(run, "-worker")


def podgroup_name(run: str) -> str:
    return run


def pod_name(run: str, role: Role, rank: int) -> str:
    return _suffixed(run, f"-{role}-{rank}")


def hostname(role: Role, rank: int) -> str:
    """Pod hostname under the Service's subdomain: `policy-0.<service>` resolves to policy rank 0."""
    return f"{role}-{rank}"


def head_address(run: str) -> str:
    """Where rank 0 of the policy serves the Ray head (GCS) and the coordinator."""
    return f"{hostname('policy', 0)}.{service_name(run)}:{GCS_PORT}"


def run_selector(run: str) -> str:
    return f"{RUN_LABEL}={label_value(run)}"
