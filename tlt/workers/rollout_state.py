"""Who a rollout worker is, and the GENERATING / IDLE / TRAINING state it reports.

Each state change is kept with its timestamp for the coordinator (`take`: the transitions of a step) and,
in a cluster, published on the worker's pod for the operator's slot decisions (`tlt.runtime.k8s_slots`),
from one thread so the pod sees the states in order. A failed publish is logged, never fails the worker.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tlt.runtime import k8s_slots
from tlt.runtime.optional_ray import ray

log = logging.getLogger(__name__)

GENERATING, IDLE, TRAINING = "GENERATING", "IDLE", "TRAINING"


class WorkerStates:
    """The worker's state transitions [(state, since)], the current one last, and its running rows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-report")
        self.states: list[tuple[str, float]] = [(IDLE, time.time())]
        self.running = 0  # rows the engine decodes now (0 outside a rollout)

    def set(self, state: str) -> None:
        now = time.time()
        with self._lock:
            self.states.append((state, now))
        self._reporter.submit(_report_to_pod, state, now)  # one thread: the pod sees states in order

    def current(self) -> tuple[str, float]:
        with self._lock:
            return self.states[-1]

    def take(self) -> list[tuple[str, float]]:
        """State transitions since the last call (the current state stays as the first entry)."""
        with self._lock:
            out, self.states = self.states, self.states[-1:]
            return out


def node_id() -> str:
    """This process's Ray node id."""
    return str(ray.get_runtime_context().get_node_id())


def worker_identity(index: int) -> str:
    """`rollout-<rank>` of the rollout pod this actor runs on (the operator's slot names), else `rollout-<index>`."""
    pod = os.environ.get("TLT_POD_NAME")
    if os.environ.get("TLT_ROLE") == "rollout" and pod:
        return k8s_slots.worker_name(pod)
    return f"rollout-{index}"


def _report_to_pod(state: str, since: float) -> None:
    """Publish the state on this pod for the operator (a no-op outside a cluster); never fails the worker."""
    try:
        k8s_slots.report_state(state, datetime.datetime.fromtimestamp(since, datetime.UTC))
    except k8s_slots.SlotApiError as exc:
        log.warning("could not report worker state %s to the pod: %s", state, exc)
