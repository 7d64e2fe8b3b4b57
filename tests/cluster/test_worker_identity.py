"""A worker's own identity on a real API server: the token of `<run>-worker` does exactly what the runtime's
reports client (`tlt.runtime.k8s_slots`) needs, and nothing on pods. A pod's labels are its NetworkPolicy
identity (`tlt.dev/run`), so a worker that could patch them could join another run's Ray cluster."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kube_view import KubeView, wait_for

from tlt.runtime.k8s_slots import SlotApi, SlotApiError


def small_run(name: str) -> dict[str, Any]:
    cpu = {"cpu": "250m", "memory": "256Mi", "gpus": 0}
    return {
        "apiVersion": "tlt.dev/v1alpha1",
        "kind": "TLTTrainingRun",
        "metadata": {"name": name},
        "spec": {
            "policy": {"replicas": 1, "resources": cpu},
            "rollout": {"replicas": 1, "resources": cpu},
            "verifier": {"replicas": 0},
        },
    }


def _patch(view: KubeView, token_file: Path, path: str, body: dict[str, Any]) -> int:
    """The HTTP status of a merge patch sent with the worker's token."""
    request = urllib.request.Request(
        view.plane.url + path,
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={
            "Authorization": f"Bearer {token_file.read_text().strip()}",
            "Content-Type": "application/merge-patch+json",
        },
    )
    context = ssl.create_default_context(cafile=str(view.plane.ca_file))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_workers_token_reports_but_cannot_touch_a_pod(view: KubeView, tmp_path: Path) -> None:
    view.apply(small_run("alpha"))
    view.apply(small_run("beta"))
    wait_for("both runs' pods", lambda: len(view.pods("alpha")) == 2 and len(view.pods("beta")) == 2, timeout=90)
    token_file = tmp_path / "token"
    token_file.write_text(view.kubectl("create", "token", "alpha-worker", "--duration=10m"))
    ns = view.namespace
    worker = SlotApi(
        view.plane.url, "alpha-rollout-0", ns, "alpha", "alpha-reports", "uid-x", token_file, view.plane.ca_file
    )
    coordinator = SlotApi(
        view.plane.url, "alpha-policy-0", ns, "alpha", "alpha-reports", None, token_file, view.plane.ca_file
    )

    worker.report_state("IDLE")
    coordinator.report_progress({"step": 4, "step_seconds": 2.5})
    worker.enabled_slots()  # get on its own run's status: allowed (raises SlotApiError otherwise)
    status = wait_for(
        "the operator mirrors the reported step",
        lambda: (s := view.status("alpha")).get("step", {}).get("current") == 4 and s,
    )
    assert status["step"]["lastStepSeconds"] == 2.5
    data = view.get("configmap", "alpha-reports")["data"]
    assert set(data) == {"progress", "state.rollout-0"}

    for pod in ("alpha-rollout-0", "alpha-policy-0", "beta-rollout-0"):
        for meta in ({"labels": {"tlt.dev/run": "beta"}}, {"annotations": {"x": "y"}}):
            code = _patch(view, token_file, f"/api/v1/namespaces/{ns}/pods/{pod}", {"metadata": meta})
            assert code == 403, (pod, meta, code)
    assert view.pods("alpha")["alpha-rollout-0"]["metadata"]["labels"]["tlt.dev/run"] == "alpha"
    other = SlotApi(view.plane.url, "beta-rollout-0", ns, "beta", "beta-reports", None, token_file, view.plane.ca_file)
    with pytest.raises(SlotApiError, match="HTTP 403"):
        other.report_state("TRAINING")
    with pytest.raises(SlotApiError, match="HTTP 403"):
        other.enabled_slots()
    config = view.plane.write_kubeconfig(tmp_path / "worker.kubeconfig", token_file.read_text().strip(), ns)
    for verb, what in (
        ("create", "pods"),
        ("delete", "pods"),
        ("get", "secrets"),
        ("list", "configmaps"),
        ("patch", "configmaps/alpha-spec"),
        ("patch", "tltrainingruns/alpha"),
    ):
        answer = view.plane.kubectl_result("auth", "can-i", verb, what, "-n", ns, kubeconfig_file=config)
        assert answer.stdout.strip() == "no", (verb, what, answer.stdout, answer.stderr)
