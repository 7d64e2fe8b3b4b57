"""Costs measured on this machine: `tlt bench engine --json`'s `costs` section or `tlt bench run`'s
`costs.json` (a target forward of 1..k tokens per row at each measured batch, and one drafter step, on
the bench's warm-started policy at a fixed number of cached tokens) plus the policy update's seconds
per token from a `tlt train` run.

Between measured batches the plain-step time is linear; past the largest it grows along the last
segment's slope. Width ratios come from `tlt.bench.cost_timing.cost_ratio`, the function the adaptive
engine's calibration uses; widths past the largest measured one (a prefill) scale linearly from it.

Context: a file with a `contexts` section ({context: {verify, drafter}}, `python -m tlt.sim.measure`)
gives the plain-step and drafter costs at several cached-token counts; between them the cost is
linear in the context (the attention over the cache grows with it), past the outer ones it follows
the outer segment. Without one the costs are those of the single measured context (the bench's 128),
whatever the context: on the deep bench policy a batch-16 plain step costs 15 ms at context 128 and
20 ms at 320, so that over- or under-estimates long and short responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tlt.bench.cost_timing import CostPoint, cost_ratio


def _linear(x: float, xs: list[int], ys: list[float]) -> float:
    """Piecewise-linear through (xs, ys), extended past both ends along the outer segments."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = 0 if x <= xs[0] else len(xs) - 2 if x >= xs[-1] else max(j for j in range(len(xs) - 1) if xs[j] <= x)
    (x0, x1), (y0, y1) = xs[i : i + 2], ys[i : i + 2]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 1e-9)


def _points(rows: list[dict[str, Any]], width_one: bool) -> tuple[tuple[int, float], ...]:
    return tuple(
        sorted((int(r["batch"]), float(r["seconds"])) for r in rows if not width_one or int(r.get("width", 1)) == 1)
    )


def context_points(
    costs: dict[str, Any],
) -> tuple[tuple[int, tuple[tuple[int, float], ...], tuple[tuple[int, float], ...]], ...]:
    """A costs file's `contexts` section as (context, plain points, drafter points), by context; () when absent."""
    section = costs.get("contexts") or {}
    out = []
    for context, part in section.items():
        plain, drafter = (
            _points(part["verify"], True),
            _points(part.get("drafter", part.get("drafter_step", [])), False),
        )
        if not plain or not drafter:
            raise ValueError(f"costs.contexts[{context}] needs width-1 verify points and drafter points")
        out.append((int(context), plain, drafter))
    return tuple(sorted(out))


def _by_context(batch: int, context: int, curves: list[tuple[int, tuple[tuple[int, float], ...]]]) -> float:
    """Seconds at (batch, context): piecewise-linear in batch on each measured context's curve, then in context."""
    at = [_linear(batch, [b for b, _ in pts], [s for _, s in pts]) for _, pts in curves]
    return _linear(context, [c for c, _ in curves], at) if len(curves) > 1 else at[0]


@dataclass(frozen=True)
class MeasuredCost:
    """`CostModel` from measured points. verify: CostPoints (batch, width, seconds, ratio) with width 1
    at every batch; drafter: (batch, seconds) of one drafter step."""

    verify: tuple[CostPoint, ...]
    drafter: tuple[tuple[int, float], ...]
    update_seconds_per_token: float
    sync_cost_seconds: float
    name: str = "measured"
    # Optional: (context, plain (batch, seconds) points, drafter (batch, seconds) points) per measured
    # context, sorted by context; when given, plain steps and drafter steps depend on the context.
    contexts: tuple[tuple[int, tuple[tuple[int, float], ...], tuple[tuple[int, float], ...]], ...] = ()

    def __post_init__(self) -> None:
        batches = {p.batch for p in self.verify}
        plain = {p.batch for p in self.verify if p.width == 1}
        if not batches or batches != plain:
            raise ValueError(
                f"costs.verify needs a width-1 point at every measured batch; batches {sorted(batches)},"
                f" width 1 at {sorted(plain)}"
            )
        if not self.drafter:
            raise ValueError("costs.drafter_step must hold at least one (batch, seconds) point")
        if self.update_seconds_per_token < 0 or self.sync_cost_seconds < 0:
            raise ValueError("update_seconds_per_token and sync_seconds must be >= 0")

    @classmethod
    def from_bench(
        cls, bench: dict[str, Any], update_seconds_per_token: float, sync_seconds: float, name: str = "measured"
    ) -> MeasuredCost:
        """From `tlt bench engine --json` output (its `costs` section: `verify` and `drafter_step`) or
        `tlt bench run --work-dir`'s `costs.json` (`verify` and `drafter`)."""
        costs = bench.get("costs", bench)
        drafter_key = "drafter_step" if "drafter_step" in costs else "drafter"
        if not isinstance(costs, dict) or "verify" not in costs or drafter_key not in costs:
            raise ValueError(
                "bench JSON has no costs.verify / costs.drafter_step: run `tlt bench engine --part sd --json"
                " FILE` (the sd part writes them), or use `tlt bench run --work-dir DIR`'s DIR/costs.json"
            )
        fields = ("batch", "width", "seconds", "ratio", "ratio_min", "ratio_max")
        verify = tuple(CostPoint(**{k: p[k] for k in fields}) for p in costs["verify"])
        drafter = tuple(sorted((int(d["batch"]), float(d["seconds"])) for d in costs[drafter_key]))
        return cls(verify, drafter, update_seconds_per_token, sync_seconds, name, context_points(costs))

    def _plain(self, batch: int, context: int | None = None) -> float:
        if self.contexts and context is not None:
            return _by_context(batch, context, [(c, plain) for c, plain, _ in self.contexts])
        points = sorted((p.batch, p.seconds) for p in self.verify if p.width == 1)
        return _linear(batch, [b for b, _ in points], [s for _, s in points])

    def target_seconds(self, batch: int, width: int, context: int) -> float:
        widest = max(p.width for p in self.verify)
        ratio = cost_ratio(list(self.verify), batch, min(width, widest))
        return self._plain(batch, context) * ratio * max(1.0, width / widest)

    def drafter_seconds(self, batch: int, context: int) -> float:
        if self.contexts:
            return _by_context(batch, context, [(c, d) for c, _, d in self.contexts])
        return _linear(batch, [b for b, _ in self.drafter], [s for _, s in self.drafter])

    def update_seconds(self, tokens: int, gpus: int) -> float:
        return self.update_seconds_per_token * tokens / gpus

    def sync_seconds(self) -> float:
        return self.sync_cost_seconds
