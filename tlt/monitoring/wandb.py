"""Weights & Biases: the step's scalars at the step, the report's figures as images. The library is
imported when the logger starts; project, entity and mode come from wandb's own environment
variables (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tlt.monitoring.base import require, scalars


class WandbLogger:
    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any]):
        self.wandb = require("wandb", "wandb")
        self.run = self.wandb.init(name=run_name, dir=str(run_dir), config=dict(config))

    def log_step(self, metrics: Mapping[str, Any]) -> None:
        values = scalars(metrics)
        step = int(values.pop("step"))
        self.run.log(values, step=step)

    def log_figures(self, figures: Sequence[Path], step: int) -> None:
        self.run.log({f"report/{Path(p).stem}": self.wandb.Image(str(p)) for p in figures}, step=step)

    def close(self) -> None:
        self.run.finish()
