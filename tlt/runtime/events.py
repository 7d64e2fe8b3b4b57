"""The run's event log, `<out>/events.jsonl`: one JSON object per line with `type`, `time` and `step` (the
step under way or next), appended as things happen (actors started, phases, trainers, checkpoints, restarts,
a graceful stop, a damaged checkpoint passed over). The report and the live display read it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


def append_event(out_dir: Path, kind: str, step: int, **info: Any) -> dict[str, Any]:
    """Append one event to `<out_dir>/events.jsonl` and return it."""
    event = {"type": kind, "time": time.time(), "step": step, **info}
    with (Path(out_dir) / EVENTS_FILE).open("a") as fh:
        fh.write(json.dumps(event, sort_keys=True, default=str) + "\n")
    return event
