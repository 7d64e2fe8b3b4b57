"""The operator's own Prometheus metrics (served by `tlt-operator --metrics-port`)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

from .slots import SlotOutcome

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


SLOTS_ENABLED = Gauge(
    "tlt_operator_trainer_slots_enabled", "Rollout pods whose drafter-trainer slot is enabled.", ["namespace", "run"]
)
TRAINERS_ACTIVE = Gauge("tlt_operator_trainers_active", "Rollout pods reporting TRAINING.", ["namespace", "run"])
IDLE_GPU_SECONDS = Counter("tlt_operator_idle_gpu_seconds", "Rollout GPU-seconds observed idle.", ["namespace", "run"])
HARVESTED_GPU_SECONDS = Counter(
    "tlt_operator_harvested_gpu_seconds", "Idle rollout GPU-seconds a drafter trainer used.", ["namespace", "run"]
)
SLOT_CHANGES = Counter("tlt_operator_trainer_slot_changes", "Trainer slots turned on or off.", ["direction"])
GPU_QUERIES = Counter("tlt_operator_gpu_queries", "Prometheus GPU-utilisation queries, by result.", ["result"])


def observe_slots(namespace: str, name: str, outcome: SlotOutcome) -> None:
    """Record one poll of a run's trainer slots."""
    SLOTS_ENABLED.labels(namespace=namespace, run=name).set(len(outcome.decision.enabled))
    TRAINERS_ACTIVE.labels(namespace=namespace, run=name).set(outcome.drafter.active_trainers or 0)
    IDLE_GPU_SECONDS.labels(namespace=namespace, run=name).inc(outcome.idle_gpu_seconds)
    HARVESTED_GPU_SECONDS.labels(namespace=namespace, run=name).inc(outcome.harvested_gpu_seconds)
    SLOT_CHANGES.labels(direction="on").inc(len(outcome.decision.turned_on))
    SLOT_CHANGES.labels(direction="off").inc(len(outcome.decision.turned_off))


def forget_slots(namespace: str, name: str) -> None:
    """Drop a run's per-run slot series (it finished, was suspended or is gone)."""
    for metric in (SLOTS_ENABLED, TRAINERS_ACTIVE, IDLE_GPU_SECONDS, HARVESTED_GPU_SECONDS):
        with contextlib.suppress(KeyError):
            metric.remove(namespace, name)
