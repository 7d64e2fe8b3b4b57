"""Which rollout workers' trainer slots are enabled (the slow timescale's answer, read by the coordinator).

`drafter.enabledSlots`: `all` / `none` are fixed. `auto` follows a slot list written by someone
else, read at each decision (a change takes effect at the next worker that turns idle):
- in a cluster, the operator's `.status.drafter.enabledSlots` (`tlt.runtime.k8s_slots`);
- on one machine, a JSON file `{"enabled": ["rollout-0", ...]}` at `$TLT_SLOTS_FILE`, else
  `<out>/slots.json`, written by hand or by a script.
While no list has been written, every slot is enabled.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from tlt.runtime import k8s_slots

log = logging.getLogger(__name__)

SLOTS_FILE = "slots.json"


class SlotSource:
    def __init__(self, mode: str, out_dir: Path) -> None:
        if mode not in ("auto", "all", "none"):
            raise ValueError(f"drafter.enabledSlots must be auto, all or none, got {mode!r}")
        self.mode = mode
        self.path = Path(os.environ.get("TLT_SLOTS_FILE", out_dir / SLOTS_FILE))

    def enabled(self, worker: str) -> bool:
        if self.mode != "auto":
            return self.mode == "all"
        from_operator = k8s_slots.enabled_workers()
        if from_operator is not None:
            return worker in from_operator
        if not self.path.exists():
            return True
        try:
            listed = json.loads(self.path.read_text()).get("enabled", [])
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            raise ValueError(f"{self.path}: expected {{\"enabled\": [worker names]}}: {exc}") from exc
        return worker in listed
