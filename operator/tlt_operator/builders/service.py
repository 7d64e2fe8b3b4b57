"""The headless Service: stable DNS names `<role>-<rank>.<service>` for every pod of the run."""

from __future__ import annotations

from typing import Any

from tlt.spec.run import RunSpec

from .. import names
from .common import RunRef, metadata


def build_service(run: RunRef, spec: RunSpec) -> dict[str, Any]:
    """Headless (no cluster IP), publishing not-ready pods so workers find the head while it starts."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(run, spec, names.service_name(run.name), "network"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.RUN_LABEL: names.label_value(run.name)},
            "ports": [
                {"name": "gcs", "port": names.GCS_PORT, "targetPort": names.GCS_PORT, "protocol": "TCP"},
                {
                    "name": "ray-client",
                    "port": names.RAY_CLIENT_PORT,
                    "targetPort": names.RAY_CLIENT_PORT,
                    "protocol": "TCP",
                },
                {
                    "name": "metrics",
                    "port": spec.monitoring.metrics_port,
                    "targetPort": spec.monitoring.metrics_port,
                    "protocol": "TCP",
                },
            ],
        },
    }
