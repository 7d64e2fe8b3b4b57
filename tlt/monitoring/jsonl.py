"""The always-on backend: one JSON object per finished step appended to `<out>/metrics.jsonl`; `rewrite_jsonl`
sets the file back to a checkpoint's steps on resume."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def rewrite_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Replace `path` atomically with one JSON line per row (keys sorted): a resumed run's metrics file holds
    exactly its checkpoint's steps."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(dict(row), sort_keys=True) + "\n" for row in rows))
    os.replace(tmp, path)


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
