"""The shared operator against a tenant's Prometheus URL: only the admin's allowlist is
read, on the tracker's own threads, abandoned at a deadline, so a hung server freezes nothing else."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import prometheus_client
import pytest

from tlt.spec.run import MonitoringSpec, RunSpec
from tlt.spec.status import DrafterStatus
from tlt_operator.idleness import SlotTracker

T0 = 1_800_000_000.0
URL = "http://prometheus.monitoring:9090"


def _spec(url: str) -> RunSpec:
    return RunSpec.model_validate({"monitoring": {"prometheusUrl": url, "pollSeconds": 1}})


def _count(result: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value("tlt_operator_gpu_queries_total", {"result": result}) or 0


async def test_a_url_outside_the_allowlist_is_never_fetched() -> None:
    asked: list[str] = []

    def read(monitoring: MonitoringSpec, namespace: str) -> dict[str, float]:
        asked.append(monitoring.prometheus_url or "")
        return {}

    tracker = SlotTracker(read=read, clock=lambda: T0, allowlist=frozenset({URL}))
    refused = _count("refused")
    outcome = await tracker.poll("ns", "r", _spec("http://10.0.0.1:8080"), {}, DrafterStatus())
    assert outcome is not None and asked == [], "an internal address a tenant names is not probed"
    assert _count("refused") == refused + 1
    await tracker.poll("ns", "r2", _spec(URL + "/"), {}, DrafterStatus())
    assert asked == [URL + "/"], "the allowlisted server is read (trailing slash alike)"


async def test_a_hung_prometheus_neither_blocks_the_shared_executor_nor_the_poll() -> None:
    release = threading.Event()

    def hung(monitoring: MonitoringSpec, namespace: str) -> dict[str, float]:
        release.wait(10)
        return {}

    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(1))  # the API calls' pool, made tiny
    tracker = SlotTracker(read=hung, clock=lambda: T0, allowlist=frozenset({URL}), deadline=0.2)
    errors = _count("error")
    try:
        polls = [asyncio.create_task(tracker.poll("ns", f"r{i}", _spec(URL), {}, DrafterStatus())) for i in range(3)]
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 5) == "free"
        outcomes = await asyncio.wait_for(asyncio.gather(*polls), 5)
    finally:
        release.set()
    assert all(o is not None for o in outcomes), "each poll goes on with reported states only"
    assert _count("error") == errors + 3


async def test_a_metric_name_prometheus_would_refuse_does_not_break_the_poll() -> None:
    with pytest.raises(ValueError, match="gpuUtilMetric"):
        RunSpec.model_validate({"monitoring": {"gpuUtilMetric": "gpu util{x}"}})
    # Admission refuses these names now; a run stored before that must still reconcile.
    monitoring = MonitoringSpec.model_construct(
        prometheus_url=URL,
        poll_seconds=1,
        gpu_util_metric="gpu util{x}",
        pod_label="exported-pod",
        namespace_label="exported_namespace",
    )
    spec = RunSpec().model_copy(update={"monitoring": monitoring})
    tracker = SlotTracker(clock=lambda: T0, allowlist=frozenset({URL}))  # the real reader: refuses before any I/O
    outcome = await tracker.poll("ns", "r", spec, {}, DrafterStatus())
    assert outcome is not None
