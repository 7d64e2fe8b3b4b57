"""Operator tests: kopf (through `KopfRunner`, as `kopf run` would) against the fake API server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from _operator_harness import NAMESPACE, Cluster, podgroup_crd, running_operator
from fakekube import FakeKube
from fakekube.validation import crd_validator
from kopf.testing import KopfRunner

from tlt.crd import build_crd


@pytest.fixture
def fake(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    server = FakeKube(validator_factory=crd_validator).start()
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE))
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    # The client reads $KUBECONFIG once, at import: point its default at this server's file.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
    yield server
    server.stop()


@pytest.fixture
def cluster(fake: FakeKube) -> Cluster:
    cluster = Cluster(fake)
    cluster.crds.create_custom_resource_definition(build_crd())
    cluster.crds.create_custom_resource_definition(podgroup_crd("scheduling.x-k8s.io", "v1alpha1"))
    cluster.crds.create_custom_resource_definition(podgroup_crd("scheduling.volcano.sh", "v1beta1"))
    cluster.core.create_namespace({"metadata": {"name": NAMESPACE}})
    return cluster


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    with running_operator() as runner:
        yield runner
