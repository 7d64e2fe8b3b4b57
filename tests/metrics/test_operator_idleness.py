"""End to end: the operator, against the fake API server, reads per-pod GPU utilisation from a real
Prometheus scraping a fake DCGM exporter, and turns rollout pods' trainer slots on when idle and
off when busy, never above maxTrainers and never before the configured windows.

Real parts: the operator under kopf, Prometheus and its HTTP API, the DCGM-shaped exporter (with
the `exported_pod` relabelling a DCGM scrape job produces), the worker's `k8s_slots` client. The
clock is the wall clock; windows are seconds long so the test stays short.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import prometheus_client
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))  # the operator tier's fake API

from _operator_harness import NAMESPACE, Cluster, running_operator, wait_for  # noqa: E402
from fakekube import FakeKube  # noqa: E402
from fakekube.validation import crd_validator  # noqa: E402

from tlt.runtime.k8s_slots import SlotApi  # noqa: E402
from tlt.spec.crd import build_crd  # noqa: E402

PODS = [f"r1-rollout-{i}" for i in range(4)]
BUSY, IDLE = [92.0, 88.0], [3.0, 7.0]
IDLE_WINDOW, BUSY_WINDOW, MAX_TRAINERS = 3, 2, 2


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    server = FakeKube(validator_factory=crd_validator).start()
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE))
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
    cluster = Cluster(server)
    cluster.crds.create_custom_resource_definition(build_crd())
    cluster.core.create_namespace({"metadata": {"name": NAMESPACE}})
    yield cluster
    server.stop()


class _Watch:
    """Polls the run's enabled slots, remembering the most ever enabled at once."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.most = cluster, 0

    def drafter(self) -> dict[str, Any]:
        return (self.cluster.run("r1").get("status") or {}).get("drafter") or {}

    def slots(self) -> set[str] | None:
        listed = self.drafter().get("enabledSlots")
        if listed is not None:
            self.most = max(self.most, len(listed))
        return None if listed is None else set(listed)

    def until(self, what: str, wanted: set[str]) -> float:
        """Wait until the enabled slots are `wanted`; returns when that was seen (monotonic)."""
        wait_for(what, lambda: self.slots() == wanted)
        return time.monotonic()

    def stays(self, what: str, wanted: set[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.slots() == wanted, what
            time.sleep(0.2)


def _set(exporter: Any, pods: list[str], percent: list[float]) -> None:
    for pod in pods:
        exporter.set(NAMESPACE, pod, percent)


def test_operator_enables_slots_of_idle_gpus_read_from_prometheus(
    cluster, prometheus, dcgm_exporter, monkeypatch
) -> None:
    monkeypatch.setenv("TLT_OPERATOR_PROMETHEUS_URLS", prometheus)  # the admin's allowlist
    _set(dcgm_exporter, PODS, BUSY)
    dcgm_exporter.set("elsewhere", "r1-rollout-3", IDLE)  # same pod name, other namespace: never ours
    spec = {
        "policy": {"replicas": 1},
        "verifier": {"replicas": 0},
        "rollout": {"replicas": len(PODS), "resources": {"gpus": 2}},
        "drafter": {
            "idleWindowSeconds": IDLE_WINDOW,
            "busyWindowSeconds": BUSY_WINDOW,
            "cooldownSeconds": 0,
            "maxTrainers": MAX_TRAINERS,
            "idleUtilization": 0.2,
        },
        "monitoring": {"prometheusUrl": prometheus, "pollSeconds": 1},
    }
    with running_operator():
        cluster.create_run("r1", spec)
        watch = _Watch(cluster)
        watch.until("a slot decision from utilisation alone, nothing enabled while busy", set())
        watch.stays("a busy GPU got a slot", set(), IDLE_WINDOW + 1)

        went_idle = time.monotonic()
        _set(dcgm_exporter, PODS[:3], IDLE)
        on = watch.until("slots of idle GPUs on", {"r1-rollout-0", "r1-rollout-1"})
        assert on - went_idle >= IDLE_WINDOW, "a slot turned on before idleWindowSeconds"

        # rollout-1's GPU is now busy with its own trainer, as its worker reports: it keeps its slot.
        # rollout-0 is busy with rollout again: its slot goes to rollout-2, idle all along.
        SlotApi(cluster.fake.url, "r1-rollout-1", NAMESPACE, "r1", "r1-reports").report_state("TRAINING")
        went_busy = time.monotonic()
        _set(dcgm_exporter, ["r1-rollout-0", "r1-rollout-1"], BUSY)
        off = watch.until("the busy GPU's slot handed over", {"r1-rollout-1", "r1-rollout-2"})
        assert off - went_busy >= BUSY_WINDOW, "a slot turned off before busyWindowSeconds"
        drafter = wait_for(
            "harvested GPU-seconds counted", lambda: (d := watch.drafter()).get("harvestedGpuSeconds", 0) > 0 and d
        )
        reasons = wait_for(
            "an event per slot change (posted after the status)",
            lambda: (
                (r := [e.reason for e in cluster.events() if e.reason.startswith("TrainerSlot")]) and len(r) >= 4 and r
            ),
        )

    assert watch.most <= MAX_TRAINERS, "more slots than maxTrainers were enabled"
    assert drafter["enabledTrainers"] == 2 and drafter["activeTrainers"] == 1
    assert drafter["idleGpuSeconds"] > drafter["harvestedGpuSeconds"] > 0
    assert (prometheus_client.REGISTRY.get_sample_value("tlt_operator_gpu_queries_total", {"result": "ok"}) or 0) > 0
    assert reasons.count("TrainerSlotEnabled") == 3 and reasons.count("TrainerSlotDisabled") == 1
