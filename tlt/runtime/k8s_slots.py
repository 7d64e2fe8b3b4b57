"""The workers' side of the trainer-slot contract with the operator (see `tlt_operator.builders.pod`).

Two directions, both through the Kubernetes API with the pod's own service account (the run's
`<run>-worker`, whose Role the operator makes: `patch` on the run's reports ConfigMap and `get` on
the run's status, nothing else; see `tlt_operator.builders.security`):

- `report_state` / `report_progress`: a rollout worker publishes what it is doing (GENERATING / IDLE /
  TRAINING, since when, from which pod) under key `state.rollout-<rank>`, the coordinator the step's
  progress under key `progress`, of the ConfigMap `$TLT_REPORTS_CONFIGMAP`, by a JSON merge patch of
  its `data` (one key per writer, so writers never overwrite each other). No worker writes a pod.
- `enabled_slots` / `enabled_workers`: the coordinator reads which rollout pods' slots the operator
  enabled, `.status.drafter.enabledSlots` of its run, through the status subresource (verb `get` on
  `tltrainingruns/status`: read-only).

Outside a cluster (no `KUBERNETES_SERVICE_HOST`, or no `TLT_POD_NAME` / `TLT_NAMESPACE` /
`TLT_RUN_NAME` / `TLT_REPORTS_CONFIGMAP` from the pod builder) `SlotApi.from_environment()` is None and
the module-level functions do nothing: `report_state` returns False and `enabled_slots` None ("no list
written"). Stdlib only, so the runtime image needs no Kubernetes client.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tlt.spec.run import API_GROUP, API_VERSION, PLURAL

log = logging.getLogger(__name__)

PROGRESS_KEY = "progress"
STATE_KEY_PREFIX = "state."
STATES = ("GENERATING", "IDLE", "TRAINING")
WorkerState = Literal["GENERATING", "IDLE", "TRAINING"]
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_WORKER_SUFFIX = re.compile(r"-(rollout-\d+)$")


class SlotApiError(RuntimeError):
    """The Kubernetes API refused or could not be reached."""


def worker_name(pod: str) -> str:
    """`rollout-<rank>` (the pod's hostname, the runtime's worker name) of pod `<run>-rollout-<rank>`."""
    match = _WORKER_SUFFIX.search(pod)
    if match is None:
        raise ValueError(f"{pod!r} is not a rollout pod name (<run>-rollout-<rank>)")
    return match.group(1)


def state_report(state: WorkerState, since: datetime.datetime, pod_uid: str | None = None) -> str:
    """A worker state's value: `{"state": ..., "since": RFC 3339 UTC, "uid": this pod's uid}`."""
    if state not in STATES:
        raise ValueError(f"worker state must be one of {list(STATES)}, got {state!r}")
    stamp = since.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    report = {"state": state, "since": stamp} | ({"uid": pod_uid} if pod_uid else {})
    return json.dumps(report, separators=(",", ":"))


def progress_report(metrics: dict[str, Any], recovery: dict[str, Any] | None = None) -> str:
    """The coordinator's `progress` value from one step's metrics (the operator mirrors it into
    `.status.step` and `.status.drafter`); keys the step did not report are left out. `recovery`: the run's
    last recovery below the step (`{"step": n, "message": ...}`, `recovery_report`), kept in every later
    report so the operator's condition `Recovered` cannot miss it."""
    fields = {
        "step": "step",
        "lastStepSeconds": "step_seconds",
        "drafterVersion": "drafter_version",
        "acceptLength": "accept_length",
        "evalAccuracy": "eval_accuracy",
        "evalReward": "eval_reward_mean",
        "offPolicyFraction": "off_policy_fraction",
    }
    report = {key: metrics[name] for key, name in fields.items() if metrics.get(name) is not None}
    if metrics.get("drafter_trainers") is not None:
        report["activeTrainers"] = len(metrics["drafter_trainers"])
    if metrics.get("drafter_health"):
        report["drafterHealth"] = {worker: health_report(h) for worker, h in metrics["drafter_health"].items()}
    if recovery is not None:
        report["recovery"] = recovery
    return json.dumps(report, separators=(",", ":"))


def health_report(health: dict[str, Any]) -> dict[str, Any]:
    """One worker's drafter health in the progress report (`tlt.workers.drafter_watch`; camelCase, unset left
    out): healthy, the version its engine serves, the last judged accept length, and when flagged the step
    and the accept lengths that flagged it."""
    fields = {
        "healthy": "healthy",
        "servedVersion": "served_version",
        "acceptLength": "accept_length",
        "flaggedStep": "flagged_step",
        "flaggedAccept": "flagged_accept",
        "previousAccept": "previous_accept",
    }
    return {key: health[name] for key, name in fields.items() if health.get(name) is not None}


def recovery_report(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """`{"step": n, "message": ...}` of the step's recoveries (`metrics["recoveries"]`: a lost rollout worker's
    shard generated by another, the step run again without lost actors, the drafter hub or a sidecar trainer
    restarted alone),
    None when it had none."""
    recoveries = metrics.get("recoveries") or []
    if not recoveries:
        return None
    said = "; ".join(_recovery_line(r) for r in recoveries)
    return {"step": metrics["step"], "message": said[:1024]}


def _recovery_line(r: dict[str, Any]) -> str:
    if isinstance(r["lost"], list):
        return f"{', '.join(r['lost'])} lost ({r['reason']}), the step run again"
    if r.get("trainer_restarted"):
        return f"{r['lost']} lost ({r['reason']}), restarted alone with an empty buffer"
    if "restored_version" in r:
        return f"{r['lost']} lost ({r['reason']}), restarted with the drafter of version {r['restored_version']}"
    return f"{r['lost']} lost ({r['reason']}), its shard of {r['prompts']} prompts generated on {r['retried_on']}"


@dataclass(frozen=True)
class SlotApi:
    """This pod's calls. base_url: the API server; token_file / ca_file: the service account's
    (None for a plain-HTTP test server); pod / namespace / run: this pod and its run; reports: the
    run's reports ConfigMap; pod_uid: this pod's uid (None where unknown)."""

    base_url: str
    pod: str
    namespace: str
    run: str
    reports: str
    pod_uid: str | None = None
    token_file: Path | None = None
    ca_file: Path | None = None
    timeout: float = 5.0

    @classmethod
    def from_environment(cls) -> SlotApi | None:
        """In a TLT pod: the in-cluster API with the mounted service account; else None."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        ids = [os.environ.get(k) for k in ("TLT_POD_NAME", "TLT_NAMESPACE", "TLT_RUN_NAME", "TLT_REPORTS_CONFIGMAP")]
        if not host or not all(ids):
            return None
        pod, namespace, run, reports = (str(v) for v in ids)
        host = f"[{host}]" if ":" in host else host
        return cls(
            f"https://{host}:{port}",
            pod,
            namespace,
            run,
            reports,
            os.environ.get("TLT_POD_UID") or None,
            SERVICE_ACCOUNT_DIR / "token",
            SERVICE_ACCOUNT_DIR / "ca.crt",
        )

    def report_state(self, state: WorkerState, since: datetime.datetime | None = None) -> None:
        """Report this rollout worker's `state`, entered at `since` (default: now)."""
        value = state_report(state, since or datetime.datetime.now(datetime.UTC), self.pod_uid)
        self._report(STATE_KEY_PREFIX + worker_name(self.pod), value)

    def report_progress(self, metrics: dict[str, Any], recovery: dict[str, Any] | None = None) -> None:
        """Report the step's progress (the coordinator, on policy rank 0)."""
        self._report(PROGRESS_KEY, progress_report(metrics, recovery))

    def _report(self, key: str, value: str) -> None:
        self._call("PATCH", f"/api/v1/namespaces/{self.namespace}/configmaps/{self.reports}", {"data": {key: value}})

    def enabled_slots(self) -> frozenset[str] | None:
        """Pod names whose slot the operator enabled; None while it has written no list."""
        path = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.run}/status"
        drafter = (self._call("GET", path).get("status") or {}).get("drafter") or {}
        listed = drafter.get("enabledSlots")
        return None if listed is None else frozenset(str(p) for p in listed)

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"  # re-read: tokens rotate
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file is not None else None
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
                return dict(json.loads(response.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            raise SlotApiError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:300]!r}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise SlotApiError(f"{method} {path}: API server unreachable: {exc}") from exc


def report_state(state: WorkerState, since: datetime.datetime | None = None) -> bool:
    """Publish this worker's state; False (nothing done) outside a cluster."""
    api = SlotApi.from_environment()
    if api is None:
        return False
    api.report_state(state, since)
    return True


def report_progress(metrics: dict[str, Any], recovery: dict[str, Any] | None = None) -> bool:
    """Publish the step's progress (with the run's last `recovery`); False (nothing done) outside a cluster."""
    api = SlotApi.from_environment()
    if api is None:
        return False
    api.report_progress(metrics, recovery)
    return True


def enabled_slots() -> frozenset[str] | None:
    """Enabled rollout pods of this pod's run; None outside a cluster or before the operator wrote a list."""
    api = SlotApi.from_environment()
    return None if api is None else api.enabled_slots()


def enabled_workers() -> frozenset[str] | None:
    """As `enabled_slots`, as worker names (`rollout-<rank>`)."""
    pods = enabled_slots()
    return None if pods is None else frozenset(worker_name(p) for p in pods)
