"""Operator reads per-pod GPU idleness from a real Prometheus and turns trainer slots on and off.

Real parts: Prometheus scraping a DCGM-shaped exporter, the HTTP API, `gpu_metrics` and `slots`.
The decision clock is synthetic (one poll = 5 s) so the windows are exact and the test is fast;
every reading in every poll comes from Prometheus.
"""

from __future__ import annotations

import time

import pytest

from tlt.spec.run import DrafterSpec, MonitoringSpec
from tlt_operator.gpu_metrics import PrometheusClient
from tlt_operator.slots import PodObservation, SlotState, WorkerState, decide_slots, record_utilization

NAMESPACE = "team"
PODS = [f"rollout-{i}" for i in range(4)]
POLL = 5.0
BUSY, IDLE = [92.0, 88.0], [3.0, 7.0]


def _wait_until_scraped(client: PrometheusClient, expected: dict[str, float], seconds: float = 20.0) -> None:
    """Bounded wait until Prometheus serves `expected` ({pod: utilisation}) for our pods."""
    deadline = time.monotonic() + seconds
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        seen = {p: u for p, u in client.utilization(NAMESPACE).items() if p in expected}
        if seen.keys() == expected.keys() and all(abs(seen[p] - u) < 1e-9 for p, u in expected.items()):
            return
        time.sleep(0.2)
    pytest.fail(f"Prometheus never served {expected} within {seconds}s; last seen {seen}")


class _Operator:
    """The operator's poll loop, reduced to its decision: query, record, decide."""

    def __init__(self, client: PrometheusClient, spec: DrafterSpec) -> None:
        self.client, self.spec = client, spec
        self.state, self.history, self.now = SlotState(), {}, 0.0
        self.reported: dict[str, tuple[WorkerState, float]] = {}
        self.max_seen = 0

    def poll(self) -> frozenset[str]:
        reading = self.client.utilization(NAMESPACE)
        self.history = record_utilization(self.history, reading, self.now, horizon=60.0)
        pods = [
            PodObservation(p, *self.reported.get(p, (None, None)), utilization=self.history.get(p, ())) for p in PODS
        ]
        decision = decide_slots(pods, self.state, self.now, self.spec)
        self.state, self.now = decision.state, self.now + POLL
        self.max_seen = max(self.max_seen, len(decision.enabled))
        return decision.enabled


def test_slots_follow_gpu_idleness_read_from_prometheus(prometheus, dcgm_exporter):
    spec = DrafterSpec(
        idle_window_seconds=10, busy_window_seconds=5, cooldown_seconds=10, max_trainers=2, idle_utilization=0.2
    )
    client = PrometheusClient.from_spec(MonitoringSpec(prometheus_url=prometheus), timeout=5.0)
    operator = _Operator(client, spec)
    dcgm_exporter.set("other", "rollout-9", IDLE)  # another namespace's pod: never ours

    for pod in PODS:
        dcgm_exporter.set(NAMESPACE, pod, BUSY)
    _wait_until_scraped(client, {p: 0.9 for p in PODS})
    assert [operator.poll() for _ in range(3)] == [frozenset()] * 3, "busy pods must not get slots"

    for pod in PODS[:3]:
        dcgm_exporter.set(NAMESPACE, pod, IDLE)
    _wait_until_scraped(client, {"rollout-0": 0.05, "rollout-1": 0.05, "rollout-2": 0.05, "rollout-3": 0.9})
    phase = [operator.poll() for _ in range(3)]
    assert phase[:2] == [frozenset()] * 2, "slots turned on before the idle window passed"
    assert phase[2] == {"rollout-0", "rollout-1"}, "idle pods must get slots, at most maxTrainers, by name"

    # rollout-1's GPU is now busy with its own trainer (it reports TRAINING): it keeps its slot;
    # rollout-0 is busy with rollout again and gives its slot to rollout-2, idle all along.
    operator.reported["rollout-1"] = (WorkerState.TRAINING, operator.now)
    dcgm_exporter.set(NAMESPACE, "rollout-0", [95.0, 60.0])
    dcgm_exporter.set(NAMESPACE, "rollout-1", BUSY)
    _wait_until_scraped(client, {"rollout-0": 0.775, "rollout-1": 0.9, "rollout-2": 0.05, "rollout-3": 0.9})
    phase = [operator.poll() for _ in range(3)]
    assert phase[0] == {"rollout-0", "rollout-1"}, "a slot turned off before the busy window passed"
    assert phase[-1] == {"rollout-1", "rollout-2"}

    assert operator.max_seen <= spec.max_trainers
