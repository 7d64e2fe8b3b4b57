"""The operator's health endpoint and Prometheus metrics."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import urllib.request

import prometheus_client
from _operator_harness import Cluster, wait_for
from kopf.testing import KopfRunner


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sample(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def test_health_endpoint_and_metrics(cluster: Cluster) -> None:
    port = _free_port()
    created_before = _sample("tlt_operator_children_created_total", kind="Pod")
    args = [
        "run",
        "--standalone",
        "--all-namespaces",
        "-m",
        "tlt_operator.handlers",
        f"--liveness=http://127.0.0.1:{port}/healthz",
    ]
    with KopfRunner(args, timeout=60):
        cluster.create_run("r1", {"rollout": {"replicas": 2}})
        wait_for("Running", lambda: cluster.phase("r1") == "Running")
        health = wait_for(
            "healthz answers", lambda: json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2))
        )
        assert "runs" in health
        assert _sample("tlt_operator_runs", phase="Running") >= 1
    assert _sample("tlt_operator_children_created_total", kind="Pod") - created_before == 4
    assert _sample("tlt_operator_reconciles_total", result="ok") > 0
    assert _sample("tlt_operator_reconcile_seconds_count") > 0


def test_console_script_serves_health_and_metrics(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    metrics_port, health_port = _free_port(), _free_port()
    env = {**os.environ, "KUBECONFIG": str(cluster.fake.write_kubeconfig(tmp_path / "kubeconfig"))}
    command = [
        str(pathlib.Path(sys.executable).with_name("tlt-operator")),
        "--metrics-port",
        str(metrics_port),
        "--health-port",
        str(health_port),
    ]
    with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:
        try:
            cluster.create_run("r1", {})
            wait_for("Running", lambda: cluster.phase("r1") == "Running")
            wait_for(
                "healthz",
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=2).status == 200,
            )
            text = wait_for(
                "metrics",
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read().decode(),
            )
            assert 'tlt_operator_children_created_total{kind="Pod"} 3.0' in text
            assert 'tlt_operator_runs{phase="Running"} 1.0' in text
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()[-2000:]
