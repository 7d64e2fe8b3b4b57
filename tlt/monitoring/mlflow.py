"""MLflow: the step's scalars as metrics at the step, the report's figures as artifacts. The library
is imported when the logger starts; the tracking server and experiment come from mlflow's own
environment variables (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tlt.monitoring.base import require, scalars


class MlflowLogger:
    def __init__(self, run_name: str):
        self.mlflow = require("mlflow", "mlflow")
        self.run = self.mlflow.start_run(run_name=run_name)

    def log_step(self, metrics: Mapping[str, Any]) -> None:
        values = scalars(metrics)
        step = int(values.pop("step"))
        self.mlflow.log_metrics(values, step=step)

    def log_figures(self, figures: Sequence[Path], step: int) -> None:
        for path in figures:
            self.mlflow.log_artifact(str(path), artifact_path="report")

    def close(self) -> None:
        self.mlflow.end_run()
