"""The rollout pods' ResourceClaimTemplate for `drafter.placement: sidecar` (Kubernetes DRA,
resource.k8s.io/v1): each rollout pod gets its own claim from it, and both of the pod's containers
(worker and drafter-trainer) name that claim, so they share the same device(s)."""

from __future__ import annotations

from typing import Any

from tlt.spec.run import RunSpec

from .. import names
from .common import RunRef, metadata
from .pod import GPU_CLAIM, sidecar_placement


def build_resource_claim_template(run: RunRef, spec: RunSpec) -> dict[str, Any] | None:
    """None unless the placement is `sidecar`; asks for `rollout.resources.gpus` devices (at least
    one) of `drafter.deviceClassName`."""
    if not sidecar_placement(spec, "rollout"):
        return None
    request = {
        "name": GPU_CLAIM,
        "exactly": {
            "deviceClassName": spec.drafter.device_class_name,
            "allocationMode": "ExactCount",
            "count": max(1, spec.rollout.resources.gpus),
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": metadata(run, spec, names.claim_template_name(run.name), "rollout"),
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
