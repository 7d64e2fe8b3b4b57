"""kopf settings, all in one place, each with its reason; and the operator's tunables.

Tunables come from the environment (set in the Deployment), read when the operator starts:
`TLT_OPERATOR_NAMESPACES` (comma-separated namespaces to watch; empty: all),
`TLT_OPERATOR_RECONCILE_SECONDS` (period of the level-based resync of every run, default 10),
`TLT_OPERATOR_REQUEST_TIMEOUT` (seconds per API request, default 30),
`TLT_OPERATOR_NAMESPACE` (the operator's own namespace, from the downward API; each run's
NetworkPolicy admits metrics scrapes from the operator's pods there; default tlt-system),
`TLT_OPERATOR_PROMETHEUS_URLS` (comma-separated Prometheus base URLs a run's
`monitoring.prometheusUrl` may name; empty: no run's Prometheus is read),
`TLT_OPERATOR_SHARED_SECRETS` / `TLT_OPERATOR_SERVICE_ACCOUNTS` (names any run's pods may use besides the
run's own `<run>.*`; `tlt.spec.references`) and
`TLT_OPERATOR_WATCH_SECONDS` (server-side watch timeout, default 300).
"""

from __future__ import annotations

import logging
import os

import kopf

from tlt.spec.references import SharedNames


def _number(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from exc
    if value <= 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value}")
    return value


def namespaces() -> list[str]:
    return [ns.strip() for ns in os.environ.get("TLT_OPERATOR_NAMESPACES", "").split(",") if ns.strip()]


def exact_namespaces() -> bool:
    """`TLT_OPERATOR_NAMESPACES` lists exact names (no kopf glob or negation): the operator needs no
    cluster-wide watch of namespaces or CRDs (see `configure`)."""
    listed = namespaces()
    return bool(listed) and not any(set("*?[!") & set(n) for n in listed)


def reconcile_seconds() -> float:
    return _number("TLT_OPERATOR_RECONCILE_SECONDS", 10.0)


def request_timeout_seconds() -> float:
    return _number("TLT_OPERATOR_REQUEST_TIMEOUT", 30.0)


def operator_namespace() -> str:
    return os.environ.get("TLT_OPERATOR_NAMESPACE", "").strip() or "tlt-system"


def prometheus_allowlist() -> frozenset[str]:
    """The Prometheus base URLs (no trailing slash) the operator may query for a run."""
    raw = os.environ.get("TLT_OPERATOR_PROMETHEUS_URLS", "")
    return frozenset(url.strip().rstrip("/") for url in raw.split(",") if url.strip())


def shared_names() -> SharedNames:
    """The Secrets and ServiceAccounts every run may name (`TLT_OPERATOR_SHARED_SECRETS`,
    `TLT_OPERATOR_SERVICE_ACCOUNTS`; see `tlt.spec.references`)."""
    return SharedNames.from_environment()


def configure(settings: kopf.OperatorSettings) -> None:
    # Progress and diff-base in annotations: status has a strict schema that would prune kopf's
    # `status.kopf`, and handler return values are never stored (handlers return None).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="tlt.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="tlt.dev", key="last-handled-configuration"
    )
    # One replica with `strategy: Recreate`: no peering CRD to install, no leader election.
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # A namespace-scoped install (`TLT_OPERATOR_NAMESPACES`, `manifests/namespaced`) holds no cluster-wide
    # verb: kopf then finds the CRD once at start (API discovery) and takes the namespaces as exact names,
    # instead of watching CRDs and namespaces cluster-wide.
    settings.scanning.disabled = exact_namespaces()
    # Only warnings from kopf itself become Kubernetes events; the operator posts its own
    # transition events (phase changes) explicitly.
    settings.posting.level = logging.WARNING
    # Reconnect watch streams regularly so a silently dropped connection costs at most this long.
    watch = _number("TLT_OPERATOR_WATCH_SECONDS", 300.0)
    settings.watching.server_timeout = int(watch)
    settings.watching.client_timeout = int(watch) + 30
    settings.watching.connect_timeout = 30
    # A stuck API call must not stall a reconcile forever; the timer retries anyway.
    settings.networking.request_timeout = request_timeout_seconds()
    # Handlers are async and hand blocking client calls to threads themselves: a small pool for
    # kopf's own sync work is enough.
    settings.execution.max_workers = 8
    # Retry a failed watch-stream batch quickly first (transient 409/5xx), then back off.
    settings.batching.error_delays = (1, 2, 5, 10, 30, 60)
