"""The ConfigMap holding the run's manifest; pods mount it as the file /etc/tlt/run.yaml."""

from __future__ import annotations

from typing import Any

import yaml

from tlt.spec.run import ObjectMeta, RunSpec, TLTTrainingRun

from .. import names
from .common import RunRef, metadata


def build_configmap(run: RunRef, spec: RunSpec) -> dict[str, Any]:
    """The spec as a full `TLTTrainingRun` manifest (what `tlt train run.yaml` reads), camelCase."""
    manifest = TLTTrainingRun(metadata=ObjectMeta(name=run.name, namespace=run.namespace), spec=spec)
    body = manifest.model_dump(mode="json", by_alias=True, exclude={"status"})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(run, spec, names.configmap_name(run.name), "spec"),
        "data": {names.SPEC_FILE: yaml.safe_dump(body, sort_keys=False)},
    }
