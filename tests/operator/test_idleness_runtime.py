"""The workers' side of the slot contract (`tlt.runtime.k8s_slots`) against the fake API server,
and the operator's reading of it (`idleness.parse_worker_state`)."""

from __future__ import annotations

import datetime
import json

import pytest
from _operator_harness import NAMESPACE, Cluster
from test_manifests import _verb
from tlt_operator.builders import build_worker_identity
from tlt_operator.builders.common import RunRef
from tlt_operator.idleness import parse_worker_state
from tlt_operator.slots import WorkerState

from tlt.config import RunSpec
from tlt.runtime import k8s_slots
from tlt.runtime.k8s_slots import SlotApi, SlotApiError, worker_name

POD = {"metadata": {"name": "r1-rollout-0", "labels": {"tlt.dev/run": "r1"}},
       "spec": {"containers": [{"name": "worker", "image": "tlt:dev"}]}}


def test_outside_a_cluster_both_calls_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("TLT_POD_NAME", "r1-rollout-0")
    assert SlotApi.from_environment() is None
    assert k8s_slots.report_state("IDLE") is False
    assert k8s_slots.enabled_slots() is None and k8s_slots.enabled_workers() is None


def test_in_a_pod_it_uses_the_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443",
                       "TLT_POD_NAME": "r1-rollout-0", "TLT_NAMESPACE": "team", "TLT_RUN_NAME": "r1"}.items():
        monkeypatch.setenv(key, value)
    api = SlotApi.from_environment()
    assert api is not None and api.base_url == "https://10.0.0.1:6443"
    assert (api.pod, api.namespace, api.run) == ("r1-rollout-0", "team", "r1")
    assert api.token_file == k8s_slots.SERVICE_ACCOUNT_DIR / "token"


def test_reported_state_lands_on_the_pod_and_the_operator_reads_it(cluster: Cluster) -> None:
    cluster.core.create_namespaced_pod(NAMESPACE, POD)
    api = SlotApi(cluster.fake.url, "r1-rollout-0", NAMESPACE, "r1")
    since = datetime.datetime(2026, 1, 2, 3, 4, 5, 250000, tzinfo=datetime.UTC)
    api.report_state("TRAINING", since)
    annotations = cluster.core.read_namespaced_pod("r1-rollout-0", NAMESPACE).metadata.annotations
    assert json.loads(annotations["tlt.dev/worker-state"]) == {"state": "TRAINING",
                                                               "since": "2026-01-02T03:04:05.250000Z"}
    assert parse_worker_state("r1-rollout-0", annotations) == (WorkerState.TRAINING, since.timestamp())


def test_enabled_slots_come_from_the_run_status(cluster: Cluster) -> None:
    cluster.create_run("r1", {})
    api = SlotApi(cluster.fake.url, "r1-rollout-0", NAMESPACE, "r1")
    assert api.enabled_slots() is None, "no list yet must read as 'not decided', not 'none enabled'"
    cluster.custom.patch_namespaced_custom_object_status(
        "tlt.dev", "v1alpha1", NAMESPACE, "tltrainingruns", "r1",
        {"status": {"drafter": {"enabledSlots": ["r1-rollout-1"]}}})
    assert api.enabled_slots() == {"r1-rollout-1"}


def test_api_errors_name_the_call(cluster: Cluster) -> None:
    api = SlotApi(cluster.fake.url, "missing-rollout-0", NAMESPACE, "r1")
    with pytest.raises(SlotApiError, match="PATCH .*missing-rollout-0: HTTP 404"):
        api.report_state("IDLE")


def test_bad_states_and_names_are_refused() -> None:
    with pytest.raises(ValueError, match="worker state must be one of"):
        k8s_slots.state_annotation("SLEEPING", datetime.datetime.now(datetime.UTC))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a rollout pod name"):
        worker_name("r1-policy-0")
    assert worker_name("a-rollout-run-rollout-12") == "rollout-12"


def test_unreadable_worker_state_is_ignored() -> None:
    for raw in ("not json", '{"state": "SLEEPING", "since": "2026-01-01T00:00:00Z"}', '{"state": "IDLE"}',
                '{"state": "IDLE", "since": "yesterday"}'):
        assert parse_worker_state("p", {"tlt.dev/worker-state": raw}) is None, raw
    assert parse_worker_state("p", {}) is None


def test_worker_rbac_allows_exactly_the_slot_calls(cluster: Cluster) -> None:
    cluster.core.create_namespaced_pod(NAMESPACE, POD)
    cluster.create_run("r1", {})
    api = SlotApi(cluster.fake.url, "r1-rollout-0", NAMESPACE, "r1")
    api.report_state("IDLE")
    api.enabled_slots()
    fake = cluster.fake.api
    used = {_verb(m, p) for (m, p), agent in zip(fake.requests, fake.agents, strict=True)
            if agent.startswith("Python-urllib")}
    assert used == {("", "pods", "patch"), ("tlt.dev", "tltrainingruns/status", "get")}
    objects = {("pods", "r1-rollout-0"), ("tltrainingruns/status", "r1")}
    _, role, _ = build_worker_identity(RunRef("r1", NAMESPACE, "uid-1"), RunSpec())
    allowed = {(g, r, v, n) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"] for n in rule["resourceNames"]}
    assert {(g, r, v, n) for g, r, v in used for rr, n in objects if rr == r} <= allowed, \
        "the run's worker Role must allow every call of k8s_slots, on these objects by name"
    assert not any(r == "tltrainingruns" for _, r, _, _ in allowed), "the run itself stays out of the workers' reach"


def test_coordinator_progress_lands_on_its_pod_and_the_operator_reads_it(cluster: Cluster) -> None:
    """The `tlt.dev/progress` annotation the operator mirrors into `.status.step` / `.status.drafter`."""
    from tlt_operator.lifecycle import view_pod

    head = {"metadata": {"name": "r1-policy-0", "labels": {"tlt.dev/run": "r1"}},
            "spec": {"containers": [{"name": "worker", "image": "tlt:dev"}]}}
    cluster.core.create_namespaced_pod(NAMESPACE, head)
    api = SlotApi(cluster.fake.url, "r1-policy-0", NAMESPACE, "r1")
    api.report_progress({"step": 3, "step_seconds": 41.5, "drafter_version": 7, "accept_length": 2.25,
                         "drafter_trainers": ["rollout-0", "rollout-1"], "reward_mean": 0.4})
    pod = cluster.core.api_client.sanitize_for_serialization(cluster.core.read_namespaced_pod("r1-policy-0", NAMESPACE))
    assert view_pod(pod, run_uid="").progress == {"step": 3, "lastStepSeconds": 41.5, "drafterVersion": 7,
                                                  "acceptLength": 2.25, "activeTrainers": 2}


def test_progress_leaves_out_what_the_step_did_not_report() -> None:
    assert json.loads(k8s_slots.progress_annotation({"step": 1, "accept_length": None})) == {"step": 1}
