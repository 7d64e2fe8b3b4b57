"""`build_loggers`: the backends `monitoring.loggers` names, jsonl first and always on."""

from __future__ import annotations

import errno
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tlt.monitoring.base import Loggers, MetricsLogger
from tlt.monitoring.jsonl import JsonlLogger
from tlt.spec.run import MonitoringSpec

METRICS_FILE = "metrics.jsonl"


def build_loggers(
    spec: MonitoringSpec, run_dir: str | Path, *, run_name: str = "tlt", config: Mapping[str, Any] | None = None
) -> Loggers:
    """Start every backend in `spec.loggers` for a run writing into `run_dir`. A backend whose
    library is missing raises `MissingBackendError` (with its pip command) before any step runs;
    the ones already started are closed first. `config` (the run's spec as JSON) goes to wandb."""
    run_dir = Path(run_dir)
    backends: list[MetricsLogger] = [JsonlLogger(run_dir / METRICS_FILE)]
    try:
        for name in dict.fromkeys(spec.loggers):
            if name != "jsonl":
                backends.append(_start(name, spec, run_dir, run_name, config or {}))
    except BaseException:
        Loggers(backends).close()
        raise
    return Loggers(backends)


def _start(name: str, spec: MonitoringSpec, run_dir: Path, run_name: str, config: Mapping[str, Any]) -> MetricsLogger:
    if name == "tensorboard":
        from tlt.monitoring.tensorboard import TENSORBOARD_DIR, TensorBoardLogger

        return TensorBoardLogger(run_dir / TENSORBOARD_DIR)
    if name == "prometheus":
        from tlt.monitoring.prometheus import PrometheusLogger

        try:
            return PrometheusLogger(spec.metrics_port)
        except OSError as exc:
            raise OSError(metrics_port_message(spec.metrics_port, exc)) from None
    if name == "wandb":
        from tlt.monitoring.wandb import WandbLogger

        return WandbLogger(run_dir, run_name, config)
    if name == "mlflow":
        from tlt.monitoring.mlflow import MlflowLogger

        return MlflowLogger(run_name)
    raise ValueError(
        f"monitoring.loggers: unknown logger {name!r}; allowed: jsonl, tensorboard, prometheus, wandb, mlflow"
    )


def metrics_port_message(port: int, exc: OSError) -> str:
    """The one line for a `monitoring.metricsPort` the Prometheus logger cannot bind (`exc`: bind's error)."""
    why = "is in use on this machine" if exc.errno == errno.EADDRINUSE else f"cannot be bound here ({exc.strerror})"
    return (
        f"spec.monitoring.metricsPort: port {port} {why}; stop what listens there or set "
        "monitoring.metricsPort to a free port (1024-65535)"
    )
