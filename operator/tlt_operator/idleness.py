"""Trainer slots of one run, poll by poll: worker states read from the rollout pods, GPU
utilisation read from Prometheus, `slots.decide_slots`, and the drafter status that follows.

Where things are kept:
- in the operator's memory, per run (`RunSlots`): utilisation history, the time of the last poll
  and when each slot last changed. Lost on an operator restart, which only makes it more cautious:
  without history only the reported states count, and every slot enabled in the status is taken
  as changed at the restart, so none changes again within `cooldownSeconds`.
- in `.status.drafter` (persistent): `enabledSlots`, `enabledTrainers`, `activeTrainers`,
  `idleGpuSeconds`, `harvestedGpuSeconds`.

Accounting per poll: the time since the previous poll (at most `MAX_GAP_POLLS` polls, so the
operator's own downtime is never counted as observed) times the pod's GPUs is added, for every
rollout pod judged IDLE, to the idle GPU-seconds, and for every pod reporting TRAINING also to the
harvested GPU-seconds (harvested is a part of idle: TRAINING is judged IDLE). Until something is
observed (a reported state, a utilisation sample, an enabled slot) the status is left as it is:
no `enabledSlots` list there means "the operator has not decided yet". A status write that fails
after a poll loses that poll's GPU-seconds and events (the next poll writes the slots again):
the counts err low, never high.

Worker states come from the run's reports ConfigMap (`builders.reports`, read by `reports`): the
contract is described in `builders.pod`; `parse_worker_state` reads one value.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tlt.spec.run import MonitoringSpec, RunSpec
from tlt.spec.status import DrafterStatus

from . import metrics
from .gpu_metrics import PrometheusClient, PrometheusError
from .slots import (
    PodObservation,
    SlotOutcome,
    SlotState,
    UtilSample,
    Verdict,
    WorkerState,
    decide_slots,
    record_utilization,
)

log = logging.getLogger(__name__)
MAX_GAP_POLLS = 3
PROMETHEUS_TIMEOUT_S = 5.0
PROMETHEUS_THREADS = 2

Reader = Callable[[MonitoringSpec, str], dict[str, float]]


def parse_worker_state(pod: str, raw: str | None) -> tuple[WorkerState, float] | None:
    """(state, since in epoch seconds) from a rollout pod's reported state
    `{"state": "IDLE", "since": "2026-01-01T00:00:00Z"}`; None when absent or unreadable (logged)."""
    if raw is None:
        return None
    try:
        report = json.loads(raw)
        state = WorkerState(report["state"])
        since = datetime.datetime.fromisoformat(report["since"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        log.warning(
            'pod %s: unreadable worker state %r (want {"state": GENERATING|IDLE|TRAINING, "since": RFC 3339}): %s',
            pod,
            raw[:200],
            exc,
        )
        return None
    if since.tzinfo is None:
        since = since.replace(tzinfo=datetime.UTC)
    return state, since.timestamp()


def read_prometheus(monitoring: MonitoringSpec, namespace: str) -> dict[str, float]:
    """{pod: GPU utilisation in [0, 1]} of `namespace` (blocking; raises PrometheusError)."""
    return PrometheusClient.from_spec(monitoring, timeout=PROMETHEUS_TIMEOUT_S).utilization(namespace)


@dataclass(frozen=True)
class RunSlots:
    """What the operator remembers of one run between polls."""

    history: Mapping[str, tuple[UtilSample, ...]] = field(default_factory=dict)
    state: SlotState | None = None
    last_poll: float | None = None


def due(memory: RunSlots, spec: RunSpec, now: float) -> bool:
    """A poll is due `monitoring.pollSeconds` after the last one."""
    return memory.last_poll is None or now - memory.last_poll >= spec.monitoring.poll_seconds


def step(
    memory: RunSlots,
    spec: RunSpec,
    pods: Mapping[str, str | None],
    reading: Mapping[str, float] | None,
    old: DrafterStatus,
    now: float,
) -> tuple[RunSlots, SlotOutcome]:
    """One poll, pure: `pods` maps each running rollout pod to its reported state (None: none), `reading` is this
    poll's Prometheus answer ({pod: utilisation}; None without Prometheus or when it failed), `old`
    the drafter status so far, `now` epoch seconds."""
    drafter = spec.drafter
    horizon = max(drafter.idle_window_seconds, drafter.busy_window_seconds) + 2 * spec.monitoring.poll_seconds
    ours = {p: u for p, u in (reading or {}).items() if p in pods}
    history = record_utilization({p: s for p, s in memory.history.items() if p in pods}, ours, now, horizon)
    reports = {p: parse_worker_state(p, raw) for p, raw in pods.items()}
    observed = [PodObservation(p, *(reports[p] or (None, None)), utilization=history.get(p, ())) for p in sorted(pods)]
    previous = memory.state
    if previous is None:
        enabled = frozenset(old.enabled_slots or ()) & set(pods)
        previous = SlotState(enabled, {p: now for p in enabled})
    decision = decide_slots(observed, previous, now, drafter)

    gap = 0.0 if memory.last_poll is None else min(now - memory.last_poll, MAX_GAP_POLLS * spec.monitoring.poll_seconds)
    gpus = spec.rollout.resources.gpus
    idle = sum(d.verdict is Verdict.IDLE for p, d in decision.pods.items() if p in pods) * gap * gpus
    training = sorted(p for p, r in reports.items() if r is not None and r[0] is WorkerState.TRAINING)
    harvested = len(training) * gap * gpus
    update: dict[str, Any] = {}
    if any(reports.values()) or history or decision.enabled or old.enabled_slots is not None:
        update.update(enabled_slots=sorted(decision.enabled), enabled_trainers=len(decision.enabled))
    if idle or old.idle_gpu_seconds is not None:
        update["idle_gpu_seconds"] = round((old.idle_gpu_seconds or 0.0) + idle, 3)
    if harvested or old.harvested_gpu_seconds is not None:
        update["harvested_gpu_seconds"] = round((old.harvested_gpu_seconds or 0.0) + harvested, 3)
    if any(reports.values()):
        update["active_trainers"] = len(training)
    events = [
        ("Normal", "TrainerSlotEnabled", f"trainer slot of {p} enabled: {decision.pods[p].reason}")
        for p in sorted(decision.turned_on)
    ]
    events += [
        ("Normal", "TrainerSlotDisabled", f"trainer slot of {p} disabled: {decision.pods[p].reason}")
        for p in sorted(decision.turned_off)
    ]
    outcome = SlotOutcome(old.model_copy(update=update), events, decision, idle, harvested)
    return RunSlots(history, decision.state, now), outcome


class SlotTracker:
    """The operator's memory of every run's slots, and the Prometheus reads.

    `monitoring.prometheusUrl` is a tenant's choice and the operator is shared, so a read happens
    only when the URL (without a trailing slash) is in `allowlist` (the admin's
    `TLT_OPERATOR_PROMETHEUS_URLS`), on this tracker's own `PROMETHEUS_THREADS` threads (never the
    default executor the API calls use), and is abandoned after `deadline` seconds: a slow or
    hostile server costs its own run's utilisation reading, nothing else."""

    def __init__(
        self,
        read: Reader = read_prometheus,
        clock: Callable[[], float] = time.time,
        allowlist: frozenset[str] = frozenset(),
        deadline: float = 2 * PROMETHEUS_TIMEOUT_S,
    ) -> None:
        self._read = read
        self._clock = clock
        self._allowlist = allowlist
        self._deadline = deadline
        self._pool = concurrent.futures.ThreadPoolExecutor(PROMETHEUS_THREADS, thread_name_prefix="tlt-prometheus")
        self._runs: dict[tuple[str, str], RunSlots] = {}

    def forget(self, namespace: str, name: str) -> None:
        """The run finished, was suspended or is gone: its slots and history go."""
        self._runs.pop((namespace, name), None)
        metrics.forget_slots(namespace, name)

    async def poll(
        self, namespace: str, name: str, spec: RunSpec, pods: Mapping[str, str | None], old: DrafterStatus
    ) -> SlotOutcome | None:
        """This run's slots after one more poll; None while no poll is due (`monitoring.pollSeconds`)."""
        key, now = (namespace, name), self._clock()
        memory = self._runs.get(key, RunSlots())
        if not due(memory, spec, now):
            return None
        reading = await self._utilization(namespace, spec.monitoring)
        memory, outcome = step(memory, spec, pods, reading, old, now)
        self._runs[key] = memory
        metrics.observe_slots(namespace, name, outcome)
        return outcome

    async def _utilization(self, namespace: str, monitoring: MonitoringSpec) -> dict[str, float] | None:
        if not monitoring.prometheus_url:
            return None
        if monitoring.prometheus_url.rstrip("/") not in self._allowlist:
            metrics.GPU_QUERIES.labels(result="refused").inc()
            log.warning(
                "monitoring.prometheusUrl %r of a run in %s is not in the operator's allowlist "
                "(TLT_OPERATOR_PROMETHEUS_URLS): reported worker states only",
                monitoring.prometheus_url,
                namespace,
            )
            return None
        loop = asyncio.get_running_loop()
        try:
            reading = await asyncio.wait_for(
                loop.run_in_executor(self._pool, self._read, monitoring, namespace), self._deadline
            )
        except (PrometheusError, TimeoutError, ValueError) as exc:  # ValueError: metric/label names (see gpu_metrics)
            metrics.GPU_QUERIES.labels(result="error").inc()
            log.warning(
                "no GPU utilisation for %s this poll (reported worker states only): %s",
                namespace,
                exc or f"no answer within {self._deadline:g}s",
            )
            return None
        metrics.GPU_QUERIES.labels(result="ok").inc()
        return reading
