"""One trainer-slot poll as a pure function (`idleness.step`): accounting, caution after a restart,
what reaches the status; and the tracker's poll cadence and Prometheus trouble."""

from __future__ import annotations

import datetime
import json

import prometheus_client

from tlt.spec.run import MonitoringSpec, RunSpec
from tlt.spec.status import DrafterStatus
from tlt_operator.gpu_metrics import PrometheusError
from tlt_operator.idleness import RunSlots, SlotTracker, due, step

T0 = 1_800_000_000.0


def _spec(**drafter: object) -> RunSpec:
    return RunSpec.model_validate(
        {"rollout": {"replicas": 2, "resources": {"gpus": 2}}, "monitoring": {"pollSeconds": 10}, "drafter": drafter}
    )


def _state(state: str, at: float) -> str:
    since = datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat()
    return json.dumps({"state": state, "since": since})


def test_idle_and_harvested_gpu_seconds_add_up_per_poll() -> None:
    spec = _spec()
    pods = {"r-rollout-0": _state("IDLE", T0 - 100), "r-rollout-1": _state("TRAINING", T0 - 100)}
    memory, first = step(RunSlots(), spec, pods, None, DrafterStatus(), T0)
    assert first.idle_gpu_seconds == 0.0, "the first poll has no interval behind it"
    memory, second = step(memory, spec, pods, None, first.drafter, T0 + 10)
    assert second.idle_gpu_seconds == 10 * 2 * 2, "both pods idle (TRAINING counts idle), 2 GPUs each"
    assert second.harvested_gpu_seconds == 10 * 2 * 1
    assert second.drafter.idle_gpu_seconds == 40.0 and second.drafter.harvested_gpu_seconds == 20.0
    assert second.drafter.active_trainers == 1
    _, late = step(memory, spec, pods, None, second.drafter, T0 + 10 + 3600)
    assert late.idle_gpu_seconds == 3 * 10 * 2 * 2, "time the operator did not watch is not counted"


def test_after_a_restart_enabled_slots_are_kept_for_the_cooldown() -> None:
    spec = _spec(cooldownSeconds=30, busyWindowSeconds=5)
    pods = {"r-rollout-0": _state("GENERATING", T0 - 600), "r-rollout-1": _state("GENERATING", T0 - 600)}
    old = DrafterStatus(enabled_slots=["r-rollout-0"])
    memory, outcome = step(RunSlots(), spec, pods, None, old, T0)
    assert outcome.drafter.enabled_slots == ["r-rollout-0"], "a restart must not flip a slot at once"
    _, outcome = step(memory, spec, pods, None, outcome.drafter, T0 + 30)
    assert outcome.drafter.enabled_slots == [] and outcome.decision.turned_off == {"r-rollout-0"}
    assert [e[1] for e in outcome.events] == ["TrainerSlotDisabled"]
    assert "busyWindowSeconds" in outcome.events[0][2]


def test_nothing_observed_leaves_the_status_alone() -> None:
    _, outcome = step(RunSlots(), _spec(), {"r-rollout-0": None}, None, DrafterStatus(version=3), T0)
    assert outcome.drafter == DrafterStatus(version=3), "no list must mean 'not decided yet'"


def test_utilisation_of_pods_not_in_the_run_is_ignored() -> None:
    spec = _spec(idleWindowSeconds=10)
    pods = {"r-rollout-0": None}
    reading = {"r-rollout-0": 0.01, "someone-else": 0.0}
    memory, _ = step(RunSlots(), spec, pods, reading, DrafterStatus(), T0)
    memory, outcome = step(memory, spec, pods, reading, DrafterStatus(), T0 + 10)
    assert set(memory.history) == {"r-rollout-0"}
    assert outcome.drafter.enabled_slots == ["r-rollout-0"], "idle by utilisation for idleWindowSeconds"


def test_a_poll_is_due_every_poll_seconds() -> None:
    spec = _spec()
    assert due(RunSlots(), spec, T0)
    assert not due(RunSlots(last_poll=T0), spec, T0 + 9.9)
    assert due(RunSlots(last_poll=T0), spec, T0 + 10)


async def test_prometheus_trouble_falls_back_to_reported_states_and_is_counted() -> None:
    def unreachable(monitoring: MonitoringSpec, namespace: str) -> dict[str, float]:
        raise PrometheusError(f"Prometheus at {monitoring.prometheus_url} is unreachable")

    clock = iter([T0, T0 + 1, T0 + 11])
    tracker = SlotTracker(read=unreachable, clock=lambda: next(clock), allowlist=frozenset({"http://prometheus:9090"}))
    spec = RunSpec.model_validate(
        {
            "monitoring": {"prometheusUrl": "http://prometheus:9090", "pollSeconds": 10},
            "drafter": {"idleWindowSeconds": 5},
        }
    )
    pods = {"r-rollout-0": _state("IDLE", T0 - 60)}
    errors = prometheus_client.REGISTRY.get_sample_value("tlt_operator_gpu_queries_total", {"result": "error"}) or 0
    first = await tracker.poll("ns", "r", spec, pods, DrafterStatus())
    assert first is not None and first.drafter.enabled_slots == ["r-rollout-0"]
    assert await tracker.poll("ns", "r", spec, pods, first.drafter) is None, "polled before pollSeconds"
    assert await tracker.poll("ns", "r", spec, pods, first.drafter) is not None
    after = prometheus_client.REGISTRY.get_sample_value("tlt_operator_gpu_queries_total", {"result": "error"})
    assert after == errors + 2
