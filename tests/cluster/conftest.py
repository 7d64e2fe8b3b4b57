"""The real control-plane tier: one control plane per test session (see controlplane.py), TLT installed
into it as a user would (`kubectl apply -k manifests/base`), the operator as a process holding a token of
ITS ServiceAccount (so RBAC is the real check), and a test node agent playing the kubelet of four
nodes: two GPU mocks (`nvidia.com/gpu: 8`, tainted as GPU nodes are), one CPU node (both hold pods
without running them) and one CPU node that runs pods as local processes (tainted so that only pods
that ask for it land there)."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from controlplane import ControlPlane, missing_binaries
from fake_node import FakeNode
from kube_view import KubeView
from node_agent import NodeAgent
from operator_process import OPERATOR_NAMESPACE, OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "operator"))  # the operator tests' harness and fake API server
from _operator_harness import NAMESPACE, Cluster, fake_server, installed_cluster, running_operator  # noqa: E402
from real_cluster import RealCluster  # noqa: E402

EXEC_TAINT = {"key": "tlt.test/local-processes", "value": "true", "effect": "NoSchedule"}
EXEC_LABEL = {"tlt.test/local-processes": "true"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODES = [
    FakeNode(
        "gpu-0",
        "hold",
        {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
        {"nvidia.com/gpu.present": "true"},
        [GPU_TAINT],
    ),
    FakeNode(
        "gpu-1",
        "hold",
        {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
        {"nvidia.com/gpu.present": "true"},
        [GPU_TAINT],
    ),
    FakeNode("cpu-0", "hold", {"cpu": "16", "memory": "64Gi", "pods": "110"}),
    FakeNode("local-0", "execute", {"cpu": "64", "memory": "256Gi", "pods": "110"}, EXEC_LABEL, [EXEC_TAINT]),
]

pytestmark = pytest.mark.apiserver


# What this tier started, stopped as soon as its last test is done (not at the end of the whole session, so
# the other tiers do not share the machine with a control plane, an operator and a node agent).
_RUNNING: list[Any] = []


def _in_tier(item: pytest.Item | None) -> bool:
    return item is not None and "tests/cluster/" in str(item.fspath)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _in_tier(item):
            item.add_marker(pytest.mark.apiserver)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the test's own fixtures are torn down first (they still talk to the control plane)
    if _in_tier(item) and not _in_tier(nextitem):
        while _RUNNING:
            _RUNNING.pop().stop()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    why = missing_binaries()
    if why:
        pytest.skip(f"skipped: {why}")
    plane = ControlPlane(tmp_path_factory.mktemp("controlplane")).start()
    _RUNNING.append(plane)
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def installed(control_plane: ControlPlane) -> ControlPlane:
    """`kubectl apply -k manifests/base`, as the README says, then the CRD Established. The operator's
    Deployment is scaled to zero: its image is not here; the same operator runs as a process below."""
    control_plane.kubectl("apply", "-k", str(ROOT / "manifests" / "base"))
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/tltrainingruns.tlt.dev")
    control_plane.kubectl("scale", "deployment/tlt-operator", "-n", OPERATOR_NAMESPACE, "--replicas=0")
    return control_plane


@pytest.fixture(scope="session")
def api(installed: ControlPlane) -> kubernetes.client.ApiClient:
    """An admin client (the tests' view)."""
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(installed.admin_kubeconfig), client_configuration=config)
    return kubernetes.client.ApiClient(config)


@pytest.fixture(scope="session")
def nodes(api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    # Not under /tmp: the pods mount their own /tmp over it, which would hide the volumes' sources.
    root = Path(tempfile.mkdtemp(prefix="tlt-node-agent-", dir="/var/tmp"))
    agent = NodeAgent(api, NODES, root).start()
    _RUNNING.append(agent)
    core = kubernetes.client.CoreV1Api(api)
    deadline = time.monotonic() + 90
    while any(t.key == "node.kubernetes.io/not-ready" for n in core.list_node().items for t in (n.spec.taints or [])):
        if time.monotonic() > deadline:
            raise TimeoutError("the node lifecycle controller did not lift the not-ready taints")
        time.sleep(0.5)
    yield agent
    agent.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def operator_process(
    installed: ControlPlane, nodes: NodeAgent, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(installed, tmp_path_factory.mktemp("operator")).start()
    _RUNNING.append(proc)
    yield proc
    proc.stop()


# What the API server says when RBAC denies the operator's ServiceAccount a verb (not, say, a write into a
# namespace being deleted, which is "forbidden" too).
RBAC_DENIED = f'forbidden: User "system:serviceaccount:{OPERATOR_NAMESPACE}:tlt-operator" cannot'


@pytest.fixture
def view(operator_process: OperatorProcess, installed: ControlPlane, nodes: NodeAgent) -> Iterator[KubeView]:
    """A fresh namespace; at the end, the operator's log of the test must show no RBAC denial (a verb the
    installed ClusterRole lacks)."""
    view = KubeView(installed).create_namespace()
    view.agent = nodes
    start = len(operator_process.text())
    yield view
    during = operator_process.text()[start:]
    view.delete_namespace()
    assert RBAC_DENIED not in during, during[-4000:]


@pytest.fixture(scope="session")
def real_cluster(operator_process: OperatorProcess, api: kubernetes.client.ApiClient) -> RealCluster:
    cluster = RealCluster(api)
    cluster.core.create_namespace({"metadata": {"name": NAMESPACE}})
    return cluster


@pytest.fixture(params=["fake", "real"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The operator tests' cluster, once on the fake API server (the operator under KopfRunner) and once on
    the real control plane (the operator process): the same test body holds the fake to the real."""
    if request.param == "fake":
        with fake_server(tmp_path, monkeypatch) as server:
            fake = installed_cluster(server)
            with running_operator():
                yield fake
        return
    real = request.getfixturevalue("real_cluster")
    try:
        yield real
    finally:
        real.clean()
