"""The kind tier: a real Kubernetes (kind, in Docker) with nodes patched to advertise
`nvidia.com/gpu`, the operator run from this checkout against it, a fake DCGM exporter DaemonSet
and a real Prometheus on loopback. Skips, saying why, without Docker, kind, kubectl or prometheus.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from _kind_harness import Kind, missing_tool


@pytest.fixture(scope="module")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    reason = missing_tool()
    if reason is not None:
        pytest.skip(f"kind tier skipped: {reason}")
    name = f"tlt-kind-{os.getpid()}"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    subprocess.run(
        ["kind", "create", "cluster", "--name", name, "--kubeconfig", str(kubeconfig), "--wait", "120s"],
        check=True,
        timeout=600,
    )
    try:
        yield Kind(name, kubeconfig)
    finally:
        subprocess.run(["kind", "delete", "cluster", "--name", name], timeout=300, check=False)
