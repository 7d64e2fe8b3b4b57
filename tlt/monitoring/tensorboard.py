"""TensorBoard event files under `<out>/tensorboard`: the step's scalars, the response-length
histogram, and the end-of-run report's figures as images (torch's SummaryWriter, which needs the
`tensorboard` package)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tlt.monitoring.base import require, scalars

TENSORBOARD_DIR = "tensorboard"


class TensorBoardLogger:
    """Scalars as `tlt/<metric>` at the step, `response_length` as a histogram when the step carries
    the lengths (the Ray runtime's `response_lengths`), figures as `report/<file stem>` images."""

    def __init__(self, log_dir: Path):
        require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log_step(self, metrics: Mapping[str, Any]) -> None:
        step = int(metrics["step"])
        for name, value in scalars(metrics).items():
            if name != "step":
                self.writer.add_scalar(f"tlt/{name}", value, step)
        lengths = metrics.get("response_lengths")
        if lengths:
            self.writer.add_histogram("response_length", np.asarray(lengths, dtype=np.float64), step)
        self.writer.flush()

    def log_figures(self, figures: Sequence[Path], step: int) -> None:
        from PIL import Image

        for path in figures:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"))  # [H, W, 3] uint8
            self.writer.add_image(f"report/{Path(path).stem}", pixels, step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
