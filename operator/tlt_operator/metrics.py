"""The operator's own Prometheus metrics (served by `tlt-operator --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("tlt_operator_reconciles", "Reconcile passes by result.", ["result"])
RECONCILE_SECONDS = Histogram("tlt_operator_reconcile_seconds", "Wall time of one reconcile pass.")
CHILDREN_CREATED = Counter("tlt_operator_children_created", "Children created, by kind.", ["kind"])
PODS_REMOVED = Counter("tlt_operator_pods_removed", "Pods removed, by cause.", ["cause"])
POD_RESTARTS = Counter("tlt_operator_pod_restarts", "Failed pods replaced (counted against backoffLimit).")
RUNS = Gauge("tlt_operator_runs", "Runs reconciled by this operator, by phase.", ["phase"])

_phases: dict[tuple[str, str], str] = {}


def observe_phase(namespace: str, name: str, phase: str | None) -> None:
    """Record a run's phase (None: the run is gone) and refresh the per-phase gauge."""
    key = (namespace, name)
    if phase is None:
        _phases.pop(key, None)
    else:
        _phases[key] = phase
    counts: dict[str, int] = {}
    for value in _phases.values():
        counts[value] = counts.get(value, 0) + 1
    for label in ("Pending", "Running", "Suspended", "Restarting", "Succeeded", "Failed"):
        RUNS.labels(phase=label).set(counts.get(label, 0))
