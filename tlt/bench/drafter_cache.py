"""Bench drafters trained once and cached next to the warm-started policy, keyed by their settings.

A folder `<policy>/<prefix>-<key>` (key: a hash of the settings) holds the drafter (`save_drafter`) and
`bench.json` (its training info, with the settings and the key); it is written under a temporary name
and renamed when complete, so a run stopped halfway leaves no folder that looks trained.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tlt.models.drafter import BoundDrafter, save_drafter

D = TypeVar("D", bound=BoundDrafter)


def settings_key(settings: dict[str, Any]) -> str:
    """16 hex digits of the settings' canonical JSON."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def cached_drafter(
    folder: Path, prefix: str, settings: dict[str, Any], train: Callable[[], tuple[D, dict]], load: Callable[[Path], D]
) -> tuple[D, dict]:
    """(drafter, info): loaded from the cache folder of these settings, or `train()`ed and cached there
    (info gains "settings" and "cache_key")."""
    key = settings_key(settings)
    target = folder / f"{prefix}-{key}"
    if (target / "bench.json").is_file():
        return load(target), json.loads((target / "bench.json").read_text())
    drafter, info = train()
    info = {"settings": settings, "cache_key": key, **info}
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=folder))
    save_drafter(drafter, staging)
    (staging / "bench.json").write_text(json.dumps(info, indent=2))
    try:
        os.rename(staging, target)
    except OSError:  # another process cached the same settings first
        shutil.rmtree(staging, ignore_errors=True)
    return drafter, info
