"""Trainer slots through the operator: workers report their state on their pods (with the runtime's
own `k8s_slots` client), the operator enables slots of idle pods within maxTrainers, disables them
when busy, and shows it all in status, events and its metrics."""

from __future__ import annotations

import datetime
from typing import Any

import prometheus_client
from _operator_harness import NAMESPACE, Cluster, wait_for

from tlt.runtime.k8s_slots import SlotApi, worker_name

ROLLOUT = [f"r1-rollout-{i}" for i in range(3)]
SPEC = {
    "policy": {"replicas": 1},
    "rollout": {"replicas": 3, "resources": {"gpus": 1}},
    "verifier": {"replicas": 0},
    "drafter": {"idleWindowSeconds": 2, "busyWindowSeconds": 2, "cooldownSeconds": 0, "maxTrainers": 2},
    "monitoring": {"pollSeconds": 1},
}


def _workers(cluster: Cluster) -> dict[str, SlotApi]:
    return {p: SlotApi(cluster.fake.url, p, NAMESPACE, "r1", "r1-reports") for p in ROLLOUT}


def _ago(seconds: float) -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)


def _drafter(cluster: Cluster) -> dict[str, Any]:
    return (cluster.run("r1").get("status") or {}).get("drafter") or {}


class _Watch:
    """Reads the drafter status and remembers the most slots ever enabled at once."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.most = cluster, 0

    def slots(self) -> set[str] | None:
        listed = _drafter(self.cluster).get("enabledSlots")
        if listed is not None:
            self.most = max(self.most, len(listed))
        return None if listed is None else set(listed)


def test_slots_follow_reported_worker_states_within_max_trainers(cluster: Cluster, operator) -> None:
    cluster.create_run("r1", SPEC)
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    workers, watch = _workers(cluster), _Watch(cluster)
    assert "enabledSlots" not in _drafter(cluster), "a slot list before anything was observed"

    for api in workers.values():
        api.report_state("GENERATING")
    wait_for("an empty slot list once states are reported", lambda: watch.slots() == set())

    started = _ago(0)
    for api in workers.values():
        api.report_state("IDLE", started)
    on = wait_for("slots of idle pods enabled", lambda: (s := watch.slots()) and s)
    assert on == {"r1-rollout-0", "r1-rollout-1"}, "at most maxTrainers, longest idle then by name"
    waited = datetime.datetime.now(datetime.UTC) - started
    assert waited >= datetime.timedelta(seconds=2), "a slot turned on before idleWindowSeconds"
    assert workers["r1-rollout-2"].enabled_slots() == on, "the coordinator reads what the status shows"
    assert {worker_name(p) for p in on} == {"rollout-0", "rollout-1"}

    workers["r1-rollout-0"].report_state("TRAINING")
    workers["r1-rollout-1"].report_state("GENERATING", _ago(5))
    moved = wait_for(
        "the busy pod's slot handed to the idle one",
        lambda: watch.slots() == {"r1-rollout-0", "r1-rollout-2"} and _drafter(cluster),
    )
    assert moved["enabledTrainers"] == 2
    wait_for(
        "the TRAINING pod counted active and harvesting",
        lambda: (d := _drafter(cluster))["activeTrainers"] == 1 and d["harvestedGpuSeconds"] > 0,
    )
    drafter = _drafter(cluster)
    assert drafter["idleGpuSeconds"] >= drafter["harvestedGpuSeconds"] > 0
    assert watch.most <= 2, "more slots than maxTrainers were enabled"

    reasons = wait_for(
        "an event per slot change (posted after the status)",
        lambda: (r := [e.reason for e in cluster.events() if e.reason.startswith("TrainerSlot")]) and len(r) >= 4 and r,
    )
    assert reasons.count("TrainerSlotEnabled") == 3 and reasons.count("TrainerSlotDisabled") == 1
    sample = prometheus_client.REGISTRY.get_sample_value
    assert sample("tlt_operator_trainer_slots_enabled", {"namespace": NAMESPACE, "run": "r1"}) == 2
    assert sample("tlt_operator_trainers_active", {"namespace": NAMESPACE, "run": "r1"}) == 1
    assert (sample("tlt_operator_harvested_gpu_seconds_total", {"namespace": NAMESPACE, "run": "r1"}) or 0) > 0


def test_suspend_releases_every_slot(cluster: Cluster, operator) -> None:
    cluster.create_run("r1", {**SPEC, "drafter": {**SPEC["drafter"], "enabledSlots": "all"}})
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    for api in _workers(cluster).values():
        api.report_state("IDLE")
    wait_for("enabledSlots all, capped at maxTrainers", lambda: len(_drafter(cluster).get("enabledSlots", [])) == 2)
    cluster.patch_spec("r1", {"suspend": True})
    wait_for(
        "no slot while suspended",
        lambda: cluster.phase("r1") == "Suspended" and _drafter(cluster)["enabledSlots"] == [],
    )
