"""Operator tests: kopf (through `KopfRunner`, as `kopf run` would) against the fake API server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _operator_harness import Cluster, fake_server, installed_cluster, running_operator
from fakekube import FakeKube
from kopf.testing import KopfRunner


@pytest.fixture
def fake(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    with fake_server(tmp_path, monkeypatch) as server:
        yield server


@pytest.fixture
def cluster(fake: FakeKube) -> Cluster:
    return installed_cluster(fake)


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    with running_operator() as runner:
        yield runner
