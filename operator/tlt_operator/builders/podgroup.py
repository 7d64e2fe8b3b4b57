"""The PodGroup for gang scheduling (scheduler-plugins coscheduling or Volcano): all pods of the
run start together or none does."""

from __future__ import annotations

from typing import Any

from tlt.spec.run import RunSpec

from .. import names
from .common import RunRef, metadata, total_pods

SCHEDULER_NAMES = {"scheduler-plugins": "scheduler-plugins-scheduler", "volcano": "volcano"}


def build_podgroup(run: RunRef, spec: RunSpec) -> dict[str, Any] | None:
    """None when `schedulingPolicy.gang` is unset."""
    gang = spec.scheduling_policy.gang
    if gang is None:
        return None
    meta = metadata(run, spec, names.podgroup_name(run.name), "scheduling")
    if gang.scheduler == "volcano":
        body: dict[str, Any] = {"minMember": total_pods(spec)}
        if spec.scheduling_policy.priority_class_name:
            body["priorityClassName"] = spec.scheduling_policy.priority_class_name
        return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": meta, "spec": body}
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": meta,
        "spec": {"minMember": total_pods(spec), "scheduleTimeoutSeconds": gang.schedule_timeout_seconds},
    }
