"""Which checkpoint a run resumes from when the newest one is damaged (`checkpoint.onCorrupt`).

- fail: the newest checkpoint's `CheckpointError` stops the run; nothing on disk is touched.
- fallback (the default): the run resumes from the newest checkpoint, at or below the one LATEST names,
  whose every file matches its manifest's sha256. Each damaged folder newer than it is moved aside to
  `corrupt-<name>` (kept for inspection: not a `step-*` folder any more, so it is never pruned and never in
  the way of that step's rewrite) and LATEST is pointed at the resume point. With no intact checkpoint at all
  the run stops: starting afresh would silently throw the run away.

It only reads and hashes files, so a run calls it before Ray starts: a damaged checkpoint is found in
seconds, not after the cluster is up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tlt.checkpoint.store import LATEST, Checkpoint, CheckpointError, load_checkpoint, load_latest, point_latest

log = logging.getLogger(__name__)

CORRUPT_PREFIX = "corrupt-"


@dataclass(frozen=True)
class Skipped:
    """A damaged checkpoint passed over: its folder name, why, and where it was moved."""

    folder: str
    reason: str
    moved_to: str


def _candidates(root: Path) -> list[Path]:
    """`step-*` folders, newest first, at or below the one LATEST names (all of them without LATEST): a
    folder past LATEST was renamed into place by a run killed before LATEST moved, and is no resume point."""
    folders = sorted((p for p in root.glob("step-*") if p.is_dir()), reverse=True)
    pointer = root / LATEST
    if pointer.is_file():
        named = pointer.read_text().strip()
        folders = [p for p in folders if p.name <= named]
    return folders


def _move_aside(folder: Path) -> Path:
    target = folder.with_name(CORRUPT_PREFIX + folder.name)
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{CORRUPT_PREFIX}{folder.name}-{n}")
    folder.rename(target)
    return target


def resume_point(root: str | Path, on_corrupt: str) -> tuple[Checkpoint | None, list[Skipped]]:
    """The checkpoint to resume from under `root` (None: there is none yet) and the damaged ones passed over.

    `on_corrupt` is `checkpoint.onCorrupt`: "fail" raises the newest checkpoint's CheckpointError; "fallback"
    falls back as the module says, logging one warning per damaged checkpoint, and raises CheckpointError only
    when no checkpoint is intact."""
    if on_corrupt not in ("fallback", "fail"):
        raise ValueError(f"checkpoint.onCorrupt must be 'fallback' or 'fail', got {on_corrupt!r}")
    root = Path(root)
    try:
        return load_latest(root), []
    except CheckpointError as newest:
        if on_corrupt == "fail":
            raise
        first_error = newest
    damaged: list[tuple[Path, str]] = []
    found: Checkpoint | None = None
    for folder in _candidates(root):
        try:
            found, good = load_checkpoint(folder), folder.name
        except CheckpointError as exc:
            damaged.append((folder, str(exc)))
            continue
        break
    if found is None:
        raise CheckpointError(
            f"{first_error}; no intact checkpoint under {root} to fall back to (checkpoint.onCorrupt: fallback)"
        ) from first_error
    skipped = [Skipped(folder.name, reason, _move_aside(folder).name) for folder, reason in damaged]
    point_latest(root, good)
    if not skipped:  # LATEST itself was missing or named a missing folder
        skipped = [Skipped(LATEST, str(first_error), "")]
    for s in skipped:
        log.warning(
            "CHECKPOINT DAMAGED: %s; resuming from the intact %s instead (checkpoint.onCorrupt: fallback)%s",
            s.reason,
            good,
            f"; the damaged folder is kept as {s.moved_to}" if s.moved_to else "",
        )
    return found, skipped


def cannot_resume(out: Path, error: Exception) -> str:
    """The line of a run that cannot resume from `out`'s checkpoints (a damaged one, another run's)."""
    return (
        f"cannot resume from {out}: {error}; the checkpoints were left as they are: fix or move them, "
        "set checkpoint.onCorrupt: fallback, or train into another --out"
    )
