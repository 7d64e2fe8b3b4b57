"""Run metrics where users look: metrics.jsonl always, TensorBoard, Prometheus, W&B, MLflow on request."""

from tlt.monitoring.base import Loggers, MetricsLogger, MissingBackendError, scalars, sd_on_fraction
from tlt.monitoring.factory import METRICS_FILE, build_loggers

__all__ = [
    "METRICS_FILE",
    "Loggers",
    "MetricsLogger",
    "MissingBackendError",
    "build_loggers",
    "scalars",
    "sd_on_fraction",
]
