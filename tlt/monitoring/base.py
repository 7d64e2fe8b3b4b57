"""The metrics interface of the runtime: one small protocol, backends chosen in `monitoring.loggers`.

The coordinator hands every finished step's metrics (the dict it writes to metrics.jsonl) to a
`Loggers` fan-out; each backend is a thin adapter over its library's official client and picks the
values it understands. The pure helpers here turn a step's dict into what those libraries take:
`scalars` (flat name -> float), `sd_on_fraction` (share of decode steps that drafted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol


class MissingBackendError(ValueError):
    """A logger named in `monitoring.loggers` whose library is not installed (a spec the environment
    cannot run, reported like other bad input)."""


class MetricsLogger(Protocol):
    """A metrics backend: one call per finished step, the report's figures at the end, then close."""

    def log_step(self, metrics: Mapping[str, Any]) -> None: ...

    def log_figures(self, figures: Sequence[Path], step: int) -> None: ...

    def close(self) -> None: ...


def require(module: str, backend: str) -> Any:
    """Import `module` for the logger `backend`, or fail with the command that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingBackendError(
            f"monitoring.loggers includes {backend!r} but the {module} library is not installed: "
            f"pip install {module} (or remove {backend!r} from monitoring.loggers)"
        ) from err


def sd_on_fraction(arms_chosen: Mapping[str, int]) -> float | None:
    """Share of the step's decode steps that drafted: arms other than 'plain' over all arms chosen
    (`sd_arms`, {arm label: steps}); None when the bandit chose nothing (speculative decoding off)."""
    total = sum(arms_chosen.values())
    if total == 0:
        return None
    return sum(n for arm, n in arms_chosen.items() if arm != "plain") / total


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The step's finite numbers, flat: top-level ints and floats (bools and None left out), plus
    `sd_on_fraction` when the step has `sd_arms`. Nested values (traces, per-worker states) are dropped."""
    out = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    arms = metrics.get("sd_arms")
    on = sd_on_fraction(arms) if isinstance(arms, Mapping) else None
    if on is not None:
        out["sd_on_fraction"] = on
    return out


class Loggers:
    """Fan-out over the configured backends, in order (jsonl first)."""

    def __init__(self, backends: Sequence[MetricsLogger]):
        self.backends = list(backends)

    def log_step(self, metrics: Mapping[str, Any]) -> None:
        for backend in self.backends:
            backend.log_step(metrics)

    def log_figures(self, figures: Sequence[Path], step: int) -> None:
        for backend in self.backends:
            backend.log_figures(figures, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
