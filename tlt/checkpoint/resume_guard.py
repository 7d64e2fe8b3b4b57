"""What a resume must keep: refusing a checkpoint written by a different run before anything loads it.

The trainer (`tlt.runtime.trainer`) reads the checkpoint to resume from, then asks here before an executor
starts: its spec must equal the run file's in the fields of `RESUME_SECTIONS` (`algorithm.steps` may grow), and
its drafter must fit the drafter this run learns (`tlt.checkpoint.drafter_fit`; the arms and the drafter layout
may change what that is). Otherwise `ResumeError`, one message the CLI prints as `cannot resume from ...`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from tlt.checkpoint.drafter_fit import drafter_resume_problem
from tlt.checkpoint.store import Checkpoint, drafter_of
from tlt.spec.plan import LearnedDrafters

# Spec sections a resumed run must share with the run that wrote the checkpoint
# (algorithm.steps may grow: resuming with more steps extends a finished run).
RESUME_SECTIONS = ("model", "dataset", "algorithm")


class ResumeError(RuntimeError):
    """The output folder holds a checkpoint written by a different run (spec or drafter)."""


def resume_conflicts(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted spec fields (in RESUME_SECTIONS, except algorithm.steps) whose values differ."""
    found = []
    for section in RESUME_SECTIONS:
        old, new = saved.get(section, {}), current.get(section, {})
        for key in sorted(set(old) | set(new)):
            if (section, key) != ("algorithm", "steps") and old.get(key) != new.get(key):
                found.append(f"{section}.{key}: checkpoint {old.get(key)!r}, run file {new.get(key)!r}")
    return found


def check_same_run(ckpt: Checkpoint | None, root: Path, spec: dict[str, Any]) -> None:
    """Raise ResumeError when `ckpt` (under `root`) was written by a run whose spec (JSON, by alias)
    differs from `spec` in a field a resume must keep (`resume_conflicts`)."""
    conflicts = [] if ckpt is None else resume_conflicts(ckpt.state.get("spec", {}), spec)
    if conflicts:
        raise ResumeError(
            f"{root} holds a checkpoint of a different run; use another --out or checkpoint.path, "
            "or restore the run file. Differences:\n  " + "\n  ".join(conflicts)
        )


def check_drafter_fits(ckpt: Checkpoint | None, root: Path, target: PretrainedConfig, learned: LearnedDrafters) -> None:
    """Raise ResumeError when `ckpt` (under `root`) holds a drafter hub whose parameters do not fit the one a
    run learning `learned` for a target of config `target` holds (nothing to check without a drafter)."""
    hub = None if ckpt is None else drafter_of(ckpt)[0]
    if hub is None:
        return
    problem = drafter_resume_problem(hub["params"], target, learned)
    if problem is not None:
        raise ResumeError(f"the checkpoint of step {ckpt.step} under {root}: {problem}")
