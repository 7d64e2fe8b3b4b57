"""The workers' side of the slot contract (`tlt.runtime.k8s_slots`) against the fake API server,
and the operator's reading of it (`reports.parse_reports`, `idleness.parse_worker_state`)."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

import pytest
from _operator_harness import NAMESPACE, Cluster
from test_manifests import _verb

from tlt.runtime import k8s_slots
from tlt.runtime.k8s_slots import SlotApi, SlotApiError, worker_name
from tlt.spec.run import RunSpec
from tlt_operator.builders import build_reports_configmap, build_worker_identity
from tlt_operator.builders.common import RunRef
from tlt_operator.idleness import parse_worker_state
from tlt_operator.reports import parse_reports, state_of_pod
from tlt_operator.slots import WorkerState

REF = RunRef("r1", NAMESPACE, "uid-1")


@dataclass
class ReportsChannel:
    """The run's reports ConfigMap, as the operator creates it, and the workers' API clients to it."""

    cluster: Cluster
    uid: str  # the run's: the ConfigMap's controller (a ConfigMap owned by no live run is garbage collected)

    def api(self, pod: str, uid: str | None = None) -> SlotApi:
        return SlotApi(self.cluster.fake.url, pod, NAMESPACE, "r1", "r1-reports", uid)

    def read(self) -> dict[str, Any]:
        live = self.cluster.core.read_namespaced_config_map("r1-reports", NAMESPACE)
        return self.cluster.core.api_client.sanitize_for_serialization(live)


@pytest.fixture
def reports(cluster: Cluster) -> ReportsChannel:
    uid = cluster.create_run("r1", {})["metadata"]["uid"]
    ref = RunRef("r1", NAMESPACE, uid)
    cluster.core.create_namespaced_config_map(NAMESPACE, build_reports_configmap(ref, RunSpec()))
    return ReportsChannel(cluster, uid)


def test_outside_a_cluster_both_calls_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("TLT_POD_NAME", "r1-rollout-0")
    assert SlotApi.from_environment() is None
    assert k8s_slots.report_state("IDLE") is False
    assert k8s_slots.enabled_slots() is None and k8s_slots.enabled_workers() is None


def test_in_a_pod_it_uses_the_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "6443",
        "TLT_POD_NAME": "r1-rollout-0",
        "TLT_NAMESPACE": "team",
        "TLT_RUN_NAME": "r1",
        "TLT_REPORTS_CONFIGMAP": "r1-reports",
        "TLT_POD_UID": "u-7",
    }.items():
        monkeypatch.setenv(key, value)
    api = SlotApi.from_environment()
    assert api is not None and api.base_url == "https://10.0.0.1:6443"
    assert (api.pod, api.namespace, api.run, api.reports, api.pod_uid) == (
        "r1-rollout-0",
        "team",
        "r1",
        "r1-reports",
        "u-7",
    )
    assert api.token_file == k8s_slots.SERVICE_ACCOUNT_DIR / "token"


def test_reported_state_lands_in_the_reports_configmap_and_the_operator_reads_it(reports: ReportsChannel) -> None:
    since = datetime.datetime(2026, 1, 2, 3, 4, 5, 250000, tzinfo=datetime.UTC)
    reports.api("r1-rollout-0", "pod-uid-0").report_state("TRAINING", since)
    reports.api("r1-rollout-1", "pod-uid-1").report_state("IDLE", since)
    live = reports.read()
    assert json.loads(live["data"]["state.rollout-0"]) == {
        "state": "TRAINING",
        "since": "2026-01-02T03:04:05.250000Z",
        "uid": "pod-uid-0",
    }
    assert live["metadata"]["ownerReferences"][0]["uid"] == reports.uid, "the workers' writes leave ownership alone"
    seen = parse_reports(live, reports.uid)
    assert parse_worker_state("r1-rollout-0", state_of_pod(seen, 0, "pod-uid-0")) == (
        WorkerState.TRAINING,
        since.timestamp(),
    )
    assert parse_worker_state("r1-rollout-1", state_of_pod(seen, 1, "pod-uid-1"))[0] is WorkerState.IDLE


def test_a_state_left_by_an_earlier_pod_of_the_same_name_does_not_count(reports: ReportsChannel) -> None:
    reports.api("r1-rollout-0", "old-pod").report_state("TRAINING")
    seen = parse_reports(reports.read(), reports.uid)
    assert state_of_pod(seen, 0, "new-pod") is None
    assert state_of_pod(seen, 0, "old-pod") is not None


def test_reports_in_a_configmap_the_run_does_not_control_are_ignored() -> None:
    planted = build_reports_configmap(RunRef("r1", NAMESPACE, "someone-else"), RunSpec())
    planted["data"] = {
        "progress": '{"step": 99}',
        "state.rollout-0": '{"state": "TRAINING", "since": "2026-01-01T00:00:00Z"}',
    }
    assert parse_reports(planted, "uid-1").progress == {} and parse_reports(planted, "uid-1").states == {}
    del planted["metadata"]["ownerReferences"]
    assert parse_reports(planted, "uid-1").progress == {}
    assert parse_reports(None, "uid-1").progress == {}


def test_enabled_slots_come_from_the_run_status(cluster: Cluster) -> None:
    cluster.create_run("r1", {})
    api = SlotApi(cluster.fake.url, "r1-rollout-0", NAMESPACE, "r1", "r1-reports")
    assert api.enabled_slots() is None, "no list yet must read as 'not decided', not 'none enabled'"
    cluster.custom.patch_namespaced_custom_object_status(
        "tlt.dev",
        "v1alpha1",
        NAMESPACE,
        "tltrainingruns",
        "r1",
        {"status": {"drafter": {"enabledSlots": ["r1-rollout-1"]}}},
    )
    assert api.enabled_slots() == {"r1-rollout-1"}


def test_api_errors_name_the_call(cluster: Cluster) -> None:
    api = SlotApi(cluster.fake.url, "r1-rollout-0", NAMESPACE, "r1", "missing-reports")
    with pytest.raises(SlotApiError, match="PATCH .*configmaps/missing-reports: HTTP 404"):
        api.report_state("IDLE")


def test_bad_states_and_names_are_refused() -> None:
    with pytest.raises(ValueError, match="worker state must be one of"):
        k8s_slots.state_report("SLEEPING", datetime.datetime.now(datetime.UTC))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a rollout pod name"):
        worker_name("r1-policy-0")
    assert worker_name("a-rollout-run-rollout-12") == "rollout-12"


def test_unreadable_worker_state_is_ignored() -> None:
    for raw in (
        "not json",
        '{"state": "SLEEPING", "since": "2026-01-01T00:00:00Z"}',
        '{"state": "IDLE"}',
        '{"state": "IDLE", "since": "yesterday"}',
    ):
        assert parse_worker_state("p", raw) is None, raw
    assert parse_worker_state("p", None) is None


def test_worker_rbac_allows_exactly_the_slot_calls(cluster: Cluster, reports: ReportsChannel) -> None:
    reports.api("r1-rollout-0").report_state("IDLE")
    reports.api("r1-policy-0").report_progress({"step": 1})
    reports.api("r1-rollout-0").enabled_slots()
    fake = cluster.fake.api
    used = {
        _verb(m, p)
        for (m, p), agent in zip(fake.requests, fake.agents, strict=True)
        if agent.startswith("Python-urllib")
    }
    assert used == {("", "configmaps", "patch"), ("tlt.dev", "tltrainingruns/status", "get")}
    objects = {("configmaps", "r1-reports"), ("tltrainingruns/status", "r1")}
    _, role, _ = build_worker_identity(REF, RunSpec())
    allowed = {
        (g, r, v, n)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
        for n in rule["resourceNames"]
    }
    assert {(g, r, v, n) for g, r, v in used for rr, n in objects if rr == r} <= allowed, (
        "the run's worker Role must allow every call of k8s_slots, on these objects by name"
    )
    assert not any(r in ("tltrainingruns", "pods") for _, r, _, _ in allowed), (
        "the run itself and every pod stay out of the workers' reach"
    )


def test_coordinator_progress_lands_in_the_reports_and_the_operator_reads_it(reports: ReportsChannel) -> None:
    """The `progress` report the operator mirrors into `.status.step` / `.status.drafter`."""
    reports.api("r1-policy-0").report_progress(
        {
            "step": 3,
            "step_seconds": 41.5,
            "drafter_version": 7,
            "accept_length": 2.25,
            "drafter_trainers": ["rollout-0", "rollout-1"],
            "reward_mean": 0.4,
            "eval_accuracy": 0.25,
            "eval_reward_mean": 0.3,
            "off_policy_fraction": 0.125,
        }
    )
    assert parse_reports(reports.read(), reports.uid).progress == {
        "step": 3,
        "lastStepSeconds": 41.5,
        "drafterVersion": 7,
        "acceptLength": 2.25,
        "evalAccuracy": 0.25,
        "evalReward": 0.3,
        "offPolicyFraction": 0.125,
        "activeTrainers": 2,
    }


def test_progress_leaves_out_what_the_step_did_not_report() -> None:
    assert json.loads(k8s_slots.progress_report({"step": 1, "accept_length": None})) == {"step": 1}
