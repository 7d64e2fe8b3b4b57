"""`drafter.placement: sidecar`: rollout pods carry a real drafter-trainer container (a native sidecar, restarted
by the kubelet while the worker runs) that shares the worker's GPU through one DRA ResourceClaim per pod;
refused without a DeviceClass."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest
from _operator_harness import NAMESPACE, Cluster, wait_for
from pydantic import ValidationError
from test_builders import RUN, TOKEN_SECRET, check_against_model

from tlt.spec.crd import MSG_SIDECAR
from tlt.spec.run import RunSpec
from tlt_operator.builders import build_pod, build_resource_claim_template

SIDECAR = {
    "rollout": {"replicas": 2, "resources": {"gpus": 1}},
    "policy": {"resources": {"gpus": 1}},
    "drafter": {"placement": "sidecar", "deviceClassName": "gpu.nvidia.com"},
}


def _claim_template_crd() -> dict[str, Any]:
    """resource.k8s.io's ResourceClaimTemplate, as far as the fake API needs to serve it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "resourceclaimtemplates.resource.k8s.io"},
        "spec": {
            "group": "resource.k8s.io",
            "scope": "Namespaced",
            "names": {
                "plural": "resourceclaimtemplates",
                "singular": "resourceclaimtemplate",
                "kind": "ResourceClaimTemplate",
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def test_rollout_pods_share_one_claim_between_worker_and_trainer() -> None:
    spec = RunSpec.model_validate(SIDECAR)
    pod = build_pod(RUN, spec, "rollout", 0, TOKEN_SECRET)
    (worker,), (trainer,) = pod["spec"]["containers"], pod["spec"]["initContainers"]
    assert (worker["name"], trainer["name"]) == ("worker", "drafter-trainer")
    assert trainer["command"] == ["tlt", "drafter-trainer", "--spec", "/etc/tlt/run.yaml"]
    assert trainer["restartPolicy"] == "Always", "a plain second container that dies leaves a Running pod"
    assert (trainer["env"], trainer["volumeMounts"]) == (worker["env"], worker["volumeMounts"]), (
        "the sidecar joins as the same pod: same contract environment, same /tmp, spec and /dev/shm"
    )
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "demo-rollout-gpu"}]
    for container in (worker, trainer):
        assert container["resources"]["claims"] == [{"name": "gpu"}]
        assert "nvidia.com/gpu" not in {**container["resources"]["requests"], **container["resources"]["limits"]}, (
            "a sidecar with its own nvidia.com/gpu request would get a different GPU"
        )
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    policy = build_pod(RUN, spec, "policy", 0, TOKEN_SECRET)
    assert [c["name"] for c in policy["spec"]["containers"]] == ["worker"], "only rollout pods have slots"
    assert "initContainers" not in policy["spec"]
    assert policy["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The client models the Kubernetes 1.30 PodResourceClaim (`source`); DRA v1 needs 1.34+, whose
    # PodResourceClaim names the template directly. Everything else must match the models.
    checked = {**pod, "spec": {k: v for k, v in pod["spec"].items() if k != "resourceClaims"}}
    assert check_against_model(checked, "V1Pod", "Pod") == []


def test_claim_template_asks_the_device_class_for_the_pods_gpus() -> None:
    template = build_resource_claim_template(RUN, RunSpec.model_validate(SIDECAR))
    assert template is not None and template["metadata"]["name"] == "demo-rollout-gpu"
    assert template["metadata"]["ownerReferences"][0]["uid"] == RUN.uid
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1},
    }
    assert build_resource_claim_template(RUN, RunSpec()) is None, "in-container placement needs no claim"


def test_sidecar_without_device_class_is_refused_with_a_clear_message(cluster: Cluster) -> None:
    with pytest.raises(ValidationError, match="deviceClassName is required"):
        RunSpec.model_validate({"drafter": {"placement": "sidecar"}})
    with pytest.raises(kubernetes.client.ApiException) as refused:
        cluster.create_run("r1", {"drafter": {"placement": "sidecar"}})
    assert refused.value.status == 422 and MSG_SIDECAR in refused.value.body


def test_operator_creates_the_claim_template_and_sidecar_pods(cluster: Cluster, operator) -> None:
    cluster.crds.create_custom_resource_definition(_claim_template_crd())
    cluster.create_run("r1", SIDECAR)
    wait_for("Running", lambda: cluster.phase("r1") == "Running")
    template = cluster.custom.get_namespaced_custom_object(
        "resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates", "r1-rollout-gpu"
    )
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    pod = cluster.core.read_namespaced_pod("r1-rollout-1", NAMESPACE)
    assert [c.name for c in pod.spec.containers] == ["worker"]
    assert [(c.name, c.restart_policy) for c in pod.spec.init_containers] == [("drafter-trainer", "Always")]
