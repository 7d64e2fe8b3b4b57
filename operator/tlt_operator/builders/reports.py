"""The ConfigMap `<run>-reports`: the one object a run's workers may write.

Workers tell the operator two things: the coordinator (policy rank 0) the step's progress, each rollout
worker its state (GENERATING / IDLE / TRAINING, for trainer slots). Both go into this ConfigMap's `data`
by JSON merge patch, one key per writer (`progress`, `state.rollout-<rank>`), under a Role that grants
`patch` on this one object by name (`builders.security`). Workers get no verb on pods: a pod's labels are
its NetworkPolicy identity, so no worker may change them.

The operator creates it without `data` and never writes `data` again (`Kube.apply` merges what it owns:
the metadata), so reports survive every reconcile. See `tlt_operator.reports` for the reading side and
`tlt.runtime.k8s_slots` for the writing side.
"""

from __future__ import annotations

from typing import Any

from tlt.spec.run import RunSpec

from .. import names
from .common import RunRef, metadata


def build_reports_configmap(run: RunRef, spec: RunSpec) -> dict[str, Any]:
    """ConfigMap `<run>-reports`, controlled by the run, with no data (the workers fill it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(run, spec, names.reports_name(run.name), "reports"),
    }
