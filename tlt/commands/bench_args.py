"""What every `tlt bench` sub-bench shares on its command line: integer-list flags and the JSON result."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def int_list(flag: str, least: int, what: str) -> Callable[[str], tuple[int, ...]]:
    """An argparse type: comma-separated integers, each >= `least`; errors name `flag`."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            out = tuple(int(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: comma-separated integers, got {text!r}") from None
        if not out or min(out) < least:
            raise argparse.ArgumentTypeError(f"{flag}: every {what} must be >= {least}, got {text!r}")
        return out

    return parse


batches = int_list("--batches", 1, "batch size")
depths = int_list("--depths", 1, "depth")
draft_vocabs = int_list("--draft-vocab", 0, "size (0: the whole vocabulary)")


def workload_file(path: Path | None) -> Path:
    """The `--workload` file (default: the pinned `bench/workload.yaml`); ValueError naming the flag when it is
    not a file."""
    from tlt.bench.workload import DEFAULT_WORKLOAD

    workload = Path(path) if path is not None else DEFAULT_WORKLOAD
    if not workload.is_file():
        raise ValueError(f"--workload: no such file {str(workload)!r}")
    return workload


def write_json(console: Any, path: Path | None, result: dict) -> int:
    """Write `result`, with the machine it was measured on, to `path` (when given) and say so; the bench's
    exit status (0)."""
    if path:
        from tlt.bench.machine import machine_info

        Path(path).write_text(json.dumps({**result, "machine": machine_info()}, indent=2) + "\n")
        console.print(f"wrote {path}")
    return 0
