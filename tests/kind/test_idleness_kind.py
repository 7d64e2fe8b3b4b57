"""Trainer slots on a real Kubernetes (kind): rollout pods requesting `nvidia.com/gpu` are scheduled
on nodes patched to advertise it, a fake DCGM exporter DaemonSet publishes the utilisation the test
sets, a real Prometheus scrapes it, and the operator (this checkout, against the kind API server)
turns slots on in idle pods and off in busy ones, never above maxTrainers. See README.md here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _kind_harness import Kind, free_port, prometheus_scraping, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE, EXPORTER_NAMESPACE = "tlt-kind", "gpu-operator"
WORKER_IMAGE, PYTHON_IMAGE, BUSYBOX = "tlt-sleeper:kind", "python:3.12-alpine", "busybox:1.36"
BUSY, IDLE = 90.0, 4.0
IDLE_WINDOW, BUSY_WINDOW, MAX_TRAINERS = 3, 2, 2
PODS = [f"r1-rollout-{i}" for i in range(3)]

EXPORTER = textwrap.dedent("""
    import http.server, json
    values = {}
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"] + [
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",exported_pod="{p}",exported_namespace="{n}"}} {v}'
                for (n, p), v in sorted(values.items())]
            body = ("\\n".join(lines) + "\\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)
        def do_PUT(self):
            data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            values[(data["namespace"], data["pod"])] = float(data["percent"])
            self.send_response(204)
            self.end_headers()
    http.server.ThreadingHTTPServer(("", 9400), Handler).serve_forever()
""")


def _sleeper_image(kind: Kind) -> None:
    """A worker image whose `tlt` only sleeps: the pods stay Running, the test plays the workers."""
    dockerfile = f"FROM {BUSYBOX}\nRUN printf '#!/bin/sh\\nexec sleep 2147483647\\n' > /bin/tlt && chmod 755 /bin/tlt\n"
    subprocess.run(["docker", "build", "-t", WORKER_IMAGE, "-"], input=dockerfile.encode(), check=True, timeout=600)
    subprocess.run(["docker", "pull", PYTHON_IMAGE], check=True, timeout=600)
    for image in (WORKER_IMAGE, PYTHON_IMAGE):
        kind.load_image(image)


def _advertise_gpus(kind: Kind, per_node: int = 4) -> None:
    """What the NVIDIA device plugin would do: each node's capacity lists `nvidia.com/gpu`."""
    for node in kind.get("nodes")["items"]:
        patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(per_node)}]
        kind.kubectl(
            "patch", "node", node["metadata"]["name"], "--subresource=status", "--type=json", "-p", json.dumps(patch)
        )
    wait_until(
        "nodes allocatable nvidia.com/gpu",
        lambda: all(
            n["status"]["allocatable"].get("nvidia.com/gpu") == str(per_node) for n in kind.get("nodes")["items"]
        ),
    )


def _exporter(kind: Kind) -> None:
    kind.kubectl("create", "namespace", EXPORTER_NAMESPACE)
    kind.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "fake-dcgm", "namespace": EXPORTER_NAMESPACE},
            "data": {"exporter.py": EXPORTER},
        }
    )
    labels = {"app": "fake-dcgm-exporter"}
    kind.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "fake-dcgm-exporter", "namespace": EXPORTER_NAMESPACE},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "exporter",
                                "image": PYTHON_IMAGE,
                                "imagePullPolicy": "IfNotPresent",
                                "command": ["python", "/exporter/exporter.py"],
                                "ports": [{"containerPort": 9400, "name": "metrics"}],
                                "volumeMounts": [{"name": "code", "mountPath": "/exporter"}],
                            }
                        ],
                        "volumes": [{"name": "code", "configMap": {"name": "fake-dcgm"}}],
                    },
                },
            },
        }
    )
    kind.kubectl("rollout", "status", "-n", EXPORTER_NAMESPACE, "daemonset/fake-dcgm-exporter", "--timeout=180s")


@pytest.fixture(scope="module")
def stage(kind_cluster: Kind, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cluster set up, the exporter port-forwarded, Prometheus scraping it, the operator running."""
    kind, work = kind_cluster, tmp_path_factory.mktemp("stage")
    _sleeper_image(kind)
    _advertise_gpus(kind)
    _exporter(kind)
    kind.kubectl("apply", "-f", str(ROOT / "crds" / "tlt.dev_tltrainingruns.yaml"))
    kind.kubectl("create", "namespace", NAMESPACE)
    exporter_pod = kind.get("pods", "-n", EXPORTER_NAMESPACE, "-l", "app=fake-dcgm-exporter")["items"][0]
    port = free_port()
    forward = subprocess.Popen(
        [
            "kubectl",
            "--kubeconfig",
            str(kind.kubeconfig),
            "port-forward",
            "-n",
            EXPORTER_NAMESPACE,
            f"pod/{exporter_pod['metadata']['name']}",
            f"{port}:9400",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    target_labels = {"pod": exporter_pod["metadata"]["name"], "namespace": EXPORTER_NAMESPACE}
    operator_log = (work / "operator.log").open("wb")
    processes = [forward]
    try:
        with prometheus_scraping(f"127.0.0.1:{port}", target_labels, work) as prometheus:
            env = {
                **os.environ,
                "KUBECONFIG": str(kind.kubeconfig),
                "TLT_OPERATOR_RECONCILE_SECONDS": "1",
                "TLT_OPERATOR_PROMETHEUS_URLS": prometheus,
            }  # the admin's allowlist
            processes.append(
                subprocess.Popen(
                    [
                        str(Path(sys.executable).with_name("tlt-operator")),
                        "--metrics-port",
                        "0",
                        "--health-port",
                        str(free_port()),
                    ],
                    env=env,
                    stdout=operator_log,
                    stderr=subprocess.STDOUT,
                )
            )
            yield {
                "kind": kind,
                "prometheus": prometheus,
                "exporter": f"http://127.0.0.1:{port}",
                "operator_log": work / "operator.log",
            }
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=30)
        operator_log.close()


def _set(exporter: str, pods: list[str], percent: float) -> None:
    for pod in pods:
        body = json.dumps({"namespace": NAMESPACE, "pod": pod, "percent": percent}).encode()
        urllib.request.urlopen(urllib.request.Request(exporter, data=body, method="PUT"), timeout=10).close()


def test_slots_follow_dcgm_idleness_on_a_real_cluster(stage: dict[str, Any]) -> None:
    kind: Kind = stage["kind"]
    _set(stage["exporter"], PODS, BUSY)
    worker = {"image": WORKER_IMAGE, "resources": {"cpu": "100m", "memory": "64Mi"}}
    kind.apply(
        {
            "apiVersion": "tlt.dev/v1alpha1",
            "kind": "TLTTrainingRun",
            "metadata": {"name": "r1", "namespace": NAMESPACE},
            "spec": {
                "policy": {**worker, "replicas": 1},
                "verifier": {**worker, "replicas": 0},
                "rollout": {**worker, "replicas": len(PODS), "resources": {**worker["resources"], "gpus": 1}},
                "drafter": {
                    "idleWindowSeconds": IDLE_WINDOW,
                    "busyWindowSeconds": BUSY_WINDOW,
                    "cooldownSeconds": 0,
                    "maxTrainers": MAX_TRAINERS,
                },
                "monitoring": {"prometheusUrl": stage["prometheus"], "pollSeconds": 1},
            },
        }
    )
    most = 0

    def slots() -> set[str] | None:
        nonlocal most
        listed = ((kind.get("tltrainingruns", "r1", "-n", NAMESPACE).get("status") or {}).get("drafter") or {}).get(
            "enabledSlots"
        )
        most = max(most, len(listed or []))
        return None if listed is None else set(listed)

    try:
        wait_until(
            "Running with GPU-requesting rollout pods",
            lambda: (kind.get("tltrainingruns", "r1", "-n", NAMESPACE).get("status") or {}).get("phase") == "Running",
            timeout=300,
        )
        wait_until("busy GPUs: a slot list with nothing enabled", lambda: slots() == set())
        _set(stage["exporter"], PODS[:2], IDLE)
        wait_until("idle GPUs get slots", lambda: slots() == {"r1-rollout-0", "r1-rollout-1"})
        _set(stage["exporter"], PODS[:1], BUSY)
        _set(stage["exporter"], PODS[2:], IDLE)
        wait_until("the busy GPU's slot moves to the idle one", lambda: slots() == {"r1-rollout-1", "r1-rollout-2"})
    except AssertionError as exc:
        raise AssertionError(f"{exc}\noperator log:\n{stage['operator_log'].read_text()[-4000:]}") from exc
    assert most <= MAX_TRAINERS, "more slots than maxTrainers were enabled"
