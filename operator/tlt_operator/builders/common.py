"""What every child carries: owner reference, run labels, scheduling labels and annotations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tlt.spec.run import API_GROUP, API_VERSION, KIND, RunSpec

from .. import names


@dataclass(frozen=True)
class RunRef:
    """The owning `TLTTrainingRun`, as its children refer to it."""

    name: str
    namespace: str
    uid: str


def owner_reference(run: RunRef) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": run.name,
        "uid": run.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def total_pods(spec: RunSpec) -> int:
    return spec.policy.replicas + spec.rollout.replicas + spec.verifier.replicas


def scheduling_labels(run: RunRef, spec: RunSpec) -> dict[str, str]:
    """Kueue pod-group labels (when a queue is named) and the gang scheduler's group label."""
    policy = spec.scheduling_policy
    labels: dict[str, str] = {}
    if policy.queue:
        labels["kueue.x-k8s.io/queue-name"] = policy.queue
        labels["kueue.x-k8s.io/pod-group-name"] = names.label_value(names.podgroup_name(run.name))
    if policy.gang is not None and policy.gang.scheduler == "scheduler-plugins":
        labels["scheduling.x-k8s.io/pod-group"] = names.label_value(names.podgroup_name(run.name))
    return labels


def scheduling_annotations(run: RunRef, spec: RunSpec) -> dict[str, str]:
    """Kueue's pod-group size, and Volcano's group annotation for gang scheduling."""
    policy = spec.scheduling_policy
    annotations: dict[str, str] = {}
    if policy.queue:
        annotations["kueue.x-k8s.io/pod-group-total-count"] = str(total_pods(spec))
    if policy.gang is not None and policy.gang.scheduler == "volcano":
        annotations["scheduling.k8s.io/group-name"] = names.podgroup_name(run.name)
    return annotations


def metadata(
    run: RunRef,
    spec: RunSpec,
    name: str,
    component: str,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Metadata of a child: fixed name, the run's namespace, owner reference, run labels, and the
    scheduling labels and annotations (on every child, as Kueue's pod groups expect)."""
    all_labels = {
        **(labels or {}),
        **scheduling_labels(run, spec),
        "app.kubernetes.io/name": "tlt",
        "app.kubernetes.io/instance": names.label_value(run.name),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "tlt-operator",
        names.RUN_LABEL: names.label_value(run.name),
    }
    return {
        "name": name,
        "namespace": run.namespace,
        "labels": all_labels,
        "annotations": {**(annotations or {}), **scheduling_annotations(run, spec)},
        "ownerReferences": [owner_reference(run)],
    }
