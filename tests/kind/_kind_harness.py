"""Harness of the kind tier: which tools are missing, a kind cluster handle, a Prometheus on
loopback, and polling."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def missing_tool() -> str | None:
    """Why this tier cannot run here, or None."""
    for tool in ("docker", "kind", "kubectl", "prometheus"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        return "no Docker engine answers `docker info`"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Kind:
    """One kind cluster and kubectl against it."""

    name: str
    kubeconfig: Path

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr[-2000:]}")
        return result.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def load_image(self, image: str) -> None:
        subprocess.run(["kind", "load", "docker-image", image, "--name", self.name], check=True, timeout=600)


def wait_until(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, KeyError, OSError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what} (last: {last!r})")


@contextlib.contextmanager
def prometheus_scraping(target: str, target_labels: dict[str, str], workdir: Path) -> Iterator[str]:
    """A Prometheus on loopback scraping `target` every 500 ms, the target carrying
    `target_labels` as a Kubernetes-discovered DCGM target would; yields its base URL."""
    config = workdir / "prometheus.yml"
    labels = ", ".join(f"{k}: {v}" for k, v in target_labels.items())
    config.write_text(
        "global:\n  scrape_interval: 500ms\nscrape_configs:\n  - job_name: dcgm\n"
        f"    static_configs:\n      - targets: ['{target}']\n        labels: {{{labels}}}\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (workdir / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_until("Prometheus ready", lambda: _ready(url), timeout=30)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return False
