"""The documented install on a real API server: `kubectl apply -k manifests/base` succeeds, the CRD is
Established, every example and sample is accepted (client-side, server-side and with strict field
validation), and every invalid manifest is refused by the server with the message the fake's validator
(tlt.spec.crd_validate, which `tlt validate` and the fake API server use) gives for it: they cannot disagree
unnoticed."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tlt.spec.crd import MSG_MANAGED_BY, MSG_MODEL, MSG_QUEUED_REPLICAS
from tlt.spec.crd_validate import validate_run

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "schema"))
from invalid_runs import INVALID, manifest  # noqa: E402

MANIFESTS = [
    ROOT / "examples" / "run.yaml",
    ROOT / "examples" / "demo.yaml",
    ROOT / "manifests" / "samples" / "run.yaml",
    ROOT / "manifests" / "samples" / "gang-kueue.yaml",
]


@pytest.fixture
def namespace(installed):
    name = f"t-{uuid.uuid4().hex[:8]}"
    installed.kubectl("create", "namespace", name)
    yield name
    installed.kubectl("delete", "namespace", name, "--wait=false")


def test_base_installs_with_kubectl_apply_k(installed):
    crd = json.loads(installed.kubectl("get", "crd", "tltrainingruns.tlt.dev", "-o", "json"))
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    again = installed.kubectl("apply", "-k", str(ROOT / "manifests" / "base"))
    assert "customresourcedefinition.apiextensions.k8s.io/tltrainingruns.tlt.dev unchanged" in again
    account = json.loads(installed.kubectl("get", "serviceaccount", "tlt-operator", "-n", "tlt-system", "-o", "json"))
    assert account["metadata"]["name"] == "tlt-operator"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.parametrize("how", ["client-side", "server-side", "strict-dry-run"])
def test_every_example_and_sample_is_accepted(installed, namespace, path, how):
    args = {
        "client-side": ["apply", "-f"],
        "server-side": ["apply", "--server-side", "-f"],
        "strict-dry-run": ["create", "--dry-run=server", "--validate=strict", "-f"],
    }[how]
    out = installed.kubectl(*args, str(path), "-n", namespace)
    assert ".tlt.dev/" in out and ("created" in out or "serverside-applied" in out), out


def _server_refusal(installed, namespace: str, doc: dict) -> str:
    result = installed.kubectl_result("create", "--validate=strict", "-n", namespace, "-f", "-", stdin=json.dumps(doc))
    assert result.returncode != 0, f"the server accepted {doc['spec']}"
    return result.stderr


@pytest.mark.parametrize(("case", "spec", "path"), INVALID, ids=[c[0] for c in INVALID])
def test_server_refuses_each_invalid_manifest_as_the_fake_does(installed, namespace, case, spec, path):
    doc = manifest(spec, name=f"r-{uuid.uuid4().hex[:6]}")
    server = _server_refusal(installed, namespace, doc)
    assert path in server, server
    for message in validate_run(doc).messages():
        assert message in server, f"the fake says {message!r}; the server said:\n{server}"


@pytest.mark.parametrize("name", ["my.run", "1run", "x" * 54])
def test_server_refuses_a_bad_run_name_as_the_fake_does(installed, namespace, name):
    doc = manifest({}, name=name)
    server = _server_refusal(installed, namespace, doc)
    for message in validate_run(doc).messages():
        assert message in server, f"the fake says {message!r}; the server said:\n{server}"


@pytest.mark.parametrize(
    ("case", "old", "new", "message"),
    [
        ("model", {}, {"model": {"maxContext": 2048}}, f"spec.model: Invalid value: {MSG_MODEL}"),
        (
            "managedBy",
            {"managedBy": "tlt.dev/operator"},
            {"managedBy": "kueue.x-k8s.io/multikueue"},
            f'spec.managedBy: Invalid value: "kueue.x-k8s.io/multikueue": {MSG_MANAGED_BY}',
        ),
        (
            "queued replicas",
            {"schedulingPolicy": {"queue": "team-a"}},
            {"schedulingPolicy": {"queue": "team-a"}, "rollout": {"replicas": 4}},
            f"spec: Invalid value: {MSG_QUEUED_REPLICAS}",
        ),
    ],
)
def test_transition_rules_refuse_the_update_on_the_server(installed, namespace, case, old, new, message):
    name = f"r-{uuid.uuid4().hex[:6]}"
    installed.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(manifest(old, name=name)))
    live = json.loads(installed.kubectl("get", "tltrun", name, "-n", namespace, "-o", "json"))
    live["spec"] = {**live["spec"], **yaml.safe_load(json.dumps(new))}
    if "rollout" in new:
        live["spec"]["rollout"] = {**live["spec"]["rollout"], **new["rollout"]}
    result = installed.kubectl_result("replace", "-n", namespace, "-f", "-", stdin=json.dumps(live))
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert message in validate_run(manifest(new, name=name), old=manifest(old, name=name)).messages()
