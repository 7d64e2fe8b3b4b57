"""A real Prometheus on loopback scraping a fake DCGM exporter whose values the test drives.

Needs the `prometheus` binary (Debian: `apt-get install -y prometheus`); without it the tier
skips and says so. Both processes are torn down by the fixtures, whatever the test did.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

SCRAPE_INTERVAL = "500ms"
STARTUP_SECONDS = 30.0


@dataclass
class FakeDcgmExporter:
    """DCGM_FI_DEV_GPU_UTIL (percent) per GPU, labelled with the workload pod as DCGM does."""

    gauge: Gauge
    port: int

    def set(self, namespace: str, pod: str, percent_per_gpu: list[float]) -> None:
        for gpu, percent in enumerate(percent_per_gpu):
            self.gauge.labels(gpu=str(gpu), exported_pod=pod, exported_namespace=namespace).set(percent)


@pytest.fixture
def dcgm_exporter() -> Iterator[FakeDcgmExporter]:
    registry = CollectorRegistry()
    gauge = Gauge(
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilisation (percent).",
        ["gpu", "exported_pod", "exported_namespace"],
        registry=registry,
    )
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield FakeDcgmExporter(gauge, server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1.0) as response:
            return response.status == 200
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return False


@contextmanager
def running_prometheus(tmp_path: Path, job: str, target: str, labels: str = "{}") -> Iterator[str]:
    """Base URL of a Prometheus that scrapes `target` (host:port) as `job` every 500 ms, with the
    extra target `labels` (a YAML flow mapping); skips the test when the binary is absent."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the `prometheus` binary is not installed (Debian: apt-get install -y prometheus)")
    config = tmp_path / f"prometheus-{job}.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  evaluation_interval: {SCRAPE_INTERVAL}\n"
        f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n"
        f"      - targets: ['{target}']\n"
        f"        labels: {labels}\n"
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / f"prometheus-{job}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / f'data-{job}'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prometheus did not become ready:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def prometheus(tmp_path: Path, dcgm_exporter: FakeDcgmExporter) -> Iterator[str]:
    """Base URL of a Prometheus that scrapes `dcgm_exporter` every 500 ms, as a DCGM job would:
    the target carries the exporter's own `pod` / `namespace`, so the workload's are `exported_*`.
    """
    with running_prometheus(
        tmp_path, "dcgm", f"127.0.0.1:{dcgm_exporter.port}", "{pod: dcgm-exporter-x1, namespace: gpu-operator}"
    ) as url:
        yield url


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[str, str], str]]:
    """`start(job, target)` -> base URL of a Prometheus scraping `target`; stopped after the test."""
    with ExitStack() as stack:
        yield lambda job, target: stack.enter_context(running_prometheus(tmp_path, job, target))


@pytest.fixture
def free_port() -> int:
    """A loopback port nothing listens on (for a server the test starts)."""
    return _free_port()
