"""Reward plug-ins: `verifier.reward: "module:function"`, a user's reward beside the built-in answer formats.

The function is called as `function(prompt, response, record) -> float` (prompt: the problem's prompt
text, template applied; response: the decoded response; record: the dataset record as a dict, empty
for the built-in task). `load_reward` imports it where verification runs and at `tlt validate` / start,
so a module that does not import or a name that is not a function is a clear error before any step.
`call_reward` runs it for one sample: an exception, or a return that is not a finite real number, fails
that sample only (reward 0.0) and comes back as a `RewardError` with the traceback, which the runtime
records in the run's events (`reward_errors.jsonl`) and counts in its metrics (`reward_errors`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
import numbers
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REWARD_ERRORS_FILE = "reward_errors.jsonl"
RewardFn = Callable[[str, str, Mapping[str, Any]], float]


class RewardPluginError(ValueError):
    """`verifier.reward` cannot be loaded: malformed, the module does not import, or no such function."""


@dataclass(frozen=True)
class RewardError:
    """One sample whose plug-in reward failed (scored 0.0): where it was and the traceback."""

    sample: str
    error: str


def load_reward(target: str) -> RewardFn:
    """The function `target` ("package.module:function") names, imported now."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise RewardPluginError(f"verifier.reward must be 'module:function', got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module failing
        raise RewardPluginError(
            f"verifier.reward {target!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}); is it on PYTHONPATH where the verifiers run?"
        ) from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise RewardPluginError(f"verifier.reward {target!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise RewardPluginError(f"verifier.reward {target!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def plugin_search_path(target: str) -> str | None:
    """The sys.path entry from which this process imports `target`'s module, or None where it does not
    import here (a plug-in installed only on the verifier pods) or it lives in site-packages.

    Ray actors start with the cluster's PYTHONPATH, not the driver's sys.path: a plug-in beside the
    run file (the driver's working directory, or a folder a test prepended) would not import in the
    verifiers. The runtime passes this entry to the verifier actors' PYTHONPATH."""
    module_name = target.partition(":")[0]
    if not module_name:
        return None
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or found.origin in ("built-in", "frozen"):
        return None
    origin = Path(found.origin).resolve()
    root = origin.parent.parent if found.submodule_search_locations is not None else origin.parent
    for _ in module_name.split(".")[1:]:
        root = root.parent
    if "site-packages" in root.parts or "dist-packages" in root.parts:
        return None
    return str(root)


def call_reward(
    fn: RewardFn, prompt: str, response: str, record: Mapping[str, Any], sample: str
) -> tuple[float, RewardError | None]:
    """(the reward of one sample, None), or (0.0, the error) when `fn` raises or returns a non-number."""
    try:
        value = fn(prompt, response, dict(record))
    except Exception:  # noqa: BLE001 - a user's reward failing fails its sample, never the run
        return 0.0, RewardError(sample, traceback.format_exc())
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        return 0.0, RewardError(
            sample, f"reward function returned {value!r} ({type(value).__name__}); it must return a finite float"
        )
    return float(value), None


def record_reward_errors(path: Path, step: int, errors: list[RewardError]) -> None:
    """Append one JSON line per failed sample ({"step", "sample", "error"}) to `path` and log a warning."""
    if not errors:
        return
    with Path(path).open("a", encoding="utf-8") as handle:
        for error in errors:
            handle.write(json.dumps({"step": step, "sample": error.sample, "error": error.error}) + "\n")
    last_line = errors[0].error.strip().splitlines()[-1]
    log.warning(
        "step %d: the reward plug-in failed on %d samples (scored 0.0; tracebacks in %s); first: %s",
        step,
        len(errors),
        path,
        last_line,
    )
