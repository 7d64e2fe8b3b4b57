"""train(mode=cluster): creates a TLTTrainingRun, follows its status to Succeeded / Failed, logs
progress, fails on failure, and deletes the run when cancelled (SIGTERM) or timed out. Unit tests
use a stubbed CustomObjectsApi; one test runs against the fake API server of the operator tests
(real HTTP, CRD schema validation)."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from tlt.spec.crd import build_crd
from tlt.spec.manifest_io import parse_run
from tlt.spec.run import API_GROUP, API_VERSION, PLURAL
from tlt_components.cluster import RunCancelled, RunFailed, follow_run, run_manifest, train_on_cluster
from tlt_components.prepare import prepare_dataset
from tlt_components.train import export_trained_drafter, run_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from fakekube import FakeKube  # noqa: E402
from fakekube.validation import crd_validator  # noqa: E402

SPEC = {"dataset": {"builtin": {"numTrain": 16, "numEval": 8}}, "algorithm": {"steps": 2}}


class StubApi:
    """CustomObjectsApi stand-in: each read returns the next scripted status (an exception is raised,
    a callable is called first); the last one repeats."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.created: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str]] = []
        self.reads = 0

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        assert (group, version, plural) == (API_GROUP, API_VERSION, PLURAL)
        self.created.append(body)
        meta = dict(body["metadata"])
        meta.setdefault("name", meta.get("generateName", "") + "x7k2q")
        return {**body, "metadata": meta}

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.reads += 1
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if callable(item):
            item = item()
        if isinstance(item, Exception):
            raise item
        return {"metadata": {"name": name}, "status": item}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.deleted.append((namespace, name))


def no_sleep(_seconds: float) -> None:
    return None


def run_of(spec: dict[str, Any] | None = None):
    return parse_run(spec or SPEC)


def test_follows_progress_to_succeeded_and_logs_it(caplog):
    api = StubApi(
        [
            {},
            {"phase": "Pending"},
            {"phase": "Running", "step": {"current": 1, "total": 2}},
            {"phase": "Succeeded", "step": {"current": 2, "total": 2}, "drafter": {"acceptLength": 2.5}},
        ]
    )
    with caplog.at_level(logging.INFO, logger="tlt_components.cluster"):
        name, status = train_on_cluster(
            run_of(), namespace="ml", name="", poll_seconds=1, timeout_seconds=0, api=api, sleep=no_sleep
        )
    assert name == "tlt-run-x7k2q" and status["phase"] == "Succeeded"
    assert api.created[0]["metadata"]["generateName"] == "tlt-run-" and api.deleted == []
    assert "step 1/2" in caplog.text and "phase Succeeded, step 2/2, accept length 2.5" in caplog.text


def test_failed_run_fails_the_component_and_is_kept_for_inspection():
    api = StubApi([{"phase": "Running"}, {"phase": "Failed", "message": "backoffLimit 3 exceeded"}])
    with pytest.raises(RunFailed, match="backoffLimit 3 exceeded"):
        train_on_cluster(
            run_of(), namespace="ml", name="r1", poll_seconds=1, timeout_seconds=0, api=api, sleep=no_sleep
        )
    assert api.deleted == []


def test_failure_reason_comes_from_the_condition_without_a_message():
    condition = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "ran 3600 s"}
    api = StubApi([{"phase": "Failed", "conditions": [condition]}])
    with pytest.raises(RunFailed, match="DeadlineExceeded: ran 3600 s"):
        follow_run(api, "ml", "r1", poll_seconds=1, timeout_seconds=0, sleep=no_sleep)


def test_run_deleted_by_someone_else_fails():
    api = StubApi([{"phase": "Running"}, ApiException(status=404, reason="Not Found")])
    with pytest.raises(RunFailed, match="was deleted"):
        follow_run(api, "ml", "r1", poll_seconds=1, timeout_seconds=0, sleep=no_sleep)


def test_transient_api_errors_are_retried_others_are_not():
    api = StubApi([ApiException(status=503), ApiException(status=429), {"phase": "Succeeded"}])
    assert follow_run(api, "ml", "r1", poll_seconds=1, timeout_seconds=0, sleep=no_sleep)["phase"] == "Succeeded"
    with pytest.raises(ApiException):
        follow_run(StubApi([ApiException(status=403)]), "ml", "r1", poll_seconds=1, timeout_seconds=0, sleep=no_sleep)


def test_timeout_deletes_the_run():
    now = [0.0]

    def tick(seconds: float) -> None:
        now[0] += seconds

    api = StubApi([{"phase": "Running"}])
    with pytest.raises(TimeoutError, match="within 30 s"):
        follow_run(api, "ml", "r1", poll_seconds=10, timeout_seconds=30, sleep=tick, clock=lambda: now[0])
    with pytest.raises(TimeoutError):
        train_on_cluster(
            run_of(),
            namespace="ml",
            name="r1",
            poll_seconds=1,
            timeout_seconds=1e-9,
            api=api,
            sleep=lambda s: time.sleep(0.001),
        )
    assert api.deleted == [("ml", "r1")]


def test_cancel_deletes_the_run():
    """KFP cancels a task by deleting its pod: SIGTERM. The run must not outlive the component."""

    def cancel() -> dict[str, Any]:
        signal.raise_signal(signal.SIGTERM)
        return {"phase": "Running"}

    before = signal.getsignal(signal.SIGTERM)
    api = StubApi([{"phase": "Running"}, cancel])
    with pytest.raises(RunCancelled):
        train_on_cluster(
            run_of(), namespace="ml", name="r1", poll_seconds=1, timeout_seconds=0, api=api, sleep=no_sleep
        )
    assert api.deleted == [("ml", "r1")]
    assert signal.getsignal(signal.SIGTERM) == before, "the SIGTERM handler is restored"


def test_manifest_is_the_validated_spec_under_the_given_name():
    body = run_manifest(
        run_of(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "demo", "labels": {"team": "a"}},
                "spec": SPEC,
            }
        ),
        namespace="ml",
        name="demo-7",
    )
    assert body["metadata"] == {
        "name": "demo-7",
        "namespace": "ml",
        "labels": {"team": "a", "tlt.dev/created-by": "kubeflow-pipelines"},
    }
    assert body["spec"]["algorithm"]["steps"] == 2 and body["kind"] == "TLTTrainingRun" and "status" not in body


def test_run_train_cluster_validates_then_records_where_outputs_are(tmp_path: Path):
    prepare_dataset(SPEC, tmp_path / "data")
    dirs = {"policy_dir": tmp_path / "policy", "drafter_dir": tmp_path / "drafter"}
    with pytest.raises(ValueError, match="parameter 'mode' must be one of cluster, local; got 'remote'"):
        run_train(SPEC, tmp_path / "data", mode="remote", **dirs)
    with pytest.raises(ValueError, match="parameter 'namespace' must be a Kubernetes object name"):
        run_train(SPEC, tmp_path / "data", mode="cluster", namespace="ML; rm -rf /", api=StubApi([{}]), **dirs)
    other = {**SPEC, "dataset": {"builtin": {"numTrain": 32, "numEval": 8}}}
    with pytest.raises(ValueError, match=r"different dataset section \(fields \['builtin'\]\)"):
        run_train(other, tmp_path / "data", mode="cluster", api=StubApi([{}]), **dirs)

    with pytest.raises(ValueError, match="checkpoint.claimName is required in cluster mode"):
        run_train(SPEC, tmp_path / "data", mode="cluster", api=StubApi([{}]), **dirs)
    claimed = {**SPEC, "checkpoint": {"claimName": "tlt-ckpt"}}
    mismatch = "'checkpoint_claim' is 'other' but run_spec checkpoint.claimName is 'tlt-ckpt'"
    with pytest.raises(ValueError, match=mismatch):
        run_train(claimed, tmp_path / "data", mode="cluster", checkpoint_claim="other", api=StubApi([{}]), **dirs)

    api = StubApi([{"phase": "Succeeded", "step": {"current": 2, "total": 2}, "drafter": {"acceptLength": 3.0}}])
    result = run_train(
        claimed,
        tmp_path / "data",
        mode="cluster",
        namespace="ml",
        run_name="r9",
        poll_seconds=1,
        checkpoint_claim="tlt-ckpt",
        api=api,
        **dirs,
    )
    assert result.metrics == {"steps": 2.0, "restarts": 0.0, "accept_length": 3.0}
    for folder in ("policy", "drafter"):
        location = json.loads((tmp_path / folder / "location.json").read_text())
        assert location == {
            "location": "cluster",
            "namespace": "ml",
            "run": "r9",
            "claimName": "tlt-ckpt",
            "checkpointPath": "checkpoints",
            "pathInClaim": ".",
            "step": 2,
        }
    assert result.drafter_metadata == location
    with pytest.raises(FileNotFoundError, match="claim 'tlt-ckpt' of TLTTrainingRun ml/r9 is not mounted at"):
        export_trained_drafter(
            tmp_path / "drafter",
            result.drafter_metadata,
            tmp_path / "policy",
            tmp_path / "eagle",
            dtype="auto",
            mount=tmp_path / "not-mounted",
        )


def test_against_the_fake_api_server(tmp_path: Path):
    """Real HTTP and the CRD's schema: the created run validates; a status written by another
    client (the operator's role here) is followed to Succeeded."""
    fake = FakeKube(validator_factory=crd_validator).start()
    try:
        config = kubernetes.client.Configuration()
        config.host = fake.url
        client = kubernetes.client.ApiClient(config)
        kubernetes.client.ApiextensionsV1Api(client).create_custom_resource_definition(build_crd())
        kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": "ml"}})
        api = kubernetes.client.CustomObjectsApi(client)

        def operator() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                items = api.list_namespaced_custom_object(API_GROUP, API_VERSION, "ml", PLURAL)["items"]
                if items:
                    name = items[0]["metadata"]["name"]
                    for status in (
                        {"phase": "Running", "step": {"current": 1, "total": 2}},
                        {"phase": "Succeeded", "step": {"current": 2, "total": 2}},
                    ):
                        api.patch_namespaced_custom_object_status(
                            API_GROUP, API_VERSION, "ml", PLURAL, name, {"status": status}
                        )
                        time.sleep(0.2)
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=operator, daemon=True)
        thread.start()
        name, status = train_on_cluster(
            run_of(), namespace="ml", name="", poll_seconds=0.1, timeout_seconds=30, api=api
        )
        thread.join(timeout=5)
        assert name.startswith("tlt-run-") and status["step"]["current"] == 2
        stored = api.get_namespaced_custom_object(API_GROUP, API_VERSION, "ml", PLURAL, name)
        assert stored["spec"]["algorithm"]["steps"] == 2
    finally:
        fake.stop()
