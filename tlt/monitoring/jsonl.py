"""The always-on backend: one JSON object per finished step appended to `<out>/metrics.jsonl`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class JsonlLogger:
    """Appends each step's whole metrics dict (keys sorted) to `path`; figures stay files beside it."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def log_step(self, metrics: Mapping[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(dict(metrics), sort_keys=True) + "\n")

    def log_figures(self, figures: Sequence[Path], step: int) -> None:
        pass

    def close(self) -> None:
        pass
