"""Where a decode step's wall time goes, by part, counted around the engine's own calls.

`StepSplit` is a context manager: while it is open, every `PlainStepper.step` and
`SpeculativeStepper.step` of the process is timed as a whole, and inside it the calls it makes are
timed by part: the target's forward (`ModelRunner.forward`), its LM head, the drafter's proposal
(`propose`; inside it `draft_graph`, the fused EAGLE catch-up + chain call or the block drafter's one
forward, and `draft_inputs`, the catch-up's input gathering), the target's tokens at the nodes (`sample`:
sampling or argmax, with log-probs), acceptance (`verify`), the attention mask, cache compaction and
`commit`. `host` is the step's time outside the model calls (target forward and LM head, drafter graph):
the bookkeeping a faster engine would remove. Counters, not a profiler: perf_counter around each call costs ~0.1 us,
where cProfile's per-call overhead inflated the Python-heavy speculative step.

Steps are keyed by `label` (set it to tell callers apart, e.g. a bench's variants), stepper ("plain",
or "sd:<drafter class>[k]") and running-batch range; a speculative step that falls back to a plain one
near the context limit counts as speculative.
The patches are undone on exit. Timings belong in benches (`tlt bench worker --split`, `tlt bench run
--split`), never in tests.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable
from typing import Any

RANGES = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 1 << 30))
# Set to "1" in the environment of a run's processes: each rollout worker splits its decode steps and
# returns the table with its rollout (`step_split` in the step's metrics; `tlt bench run --split`).
STEP_SPLIT_ENV = "TLT_STEP_SPLIT"
MODEL_PARTS = ("target_forward", "lm_head", "draft_graph")


def _label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else (f"{lo}+" if hi == 1 << 30 else f"{lo}-{hi}")


def range_of(rows: int) -> str:
    """The running-batch range label of a step with `rows` rows ("1", "2-4", ..., "17+")."""
    for lo, hi in RANGES:
        if lo <= rows <= hi:
            return _label(lo, hi)
    raise ValueError(f"rows must be >= 1, got {rows}")


def seconds_by_range(by_running: dict[int, float]) -> dict[str, float]:
    """Decode seconds (or step counts) by running batch size -> summed by range ("1", "2-4", ..., "17+")."""
    return {_label(lo, hi): sum(s for size, s in by_running.items() if lo <= size <= hi) for lo, hi in RANGES}


def merge_tables(tables: list[dict[str, dict[str, dict[str, float]]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Pool `StepSplit.table()`s (each part's ms per step weighted by its table's steps)."""
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for table in tables:
        for name, ranges in table.items():
            for rng, cell in ranges.items():
                into = totals.setdefault((name, rng), {})
                for part, value in cell.items():
                    into[part] = into.get(part, 0.0) + (value if part == "steps" else value * cell["steps"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (name, rng), cell in sorted(totals.items()):
        n = cell["steps"]
        out.setdefault(name, {})[rng] = {"steps": int(n), **{p: v / n for p, v in sorted(cell.items()) if p != "steps"}}
    return out


def pool_ranges(ranges: dict[str, dict[str, float]]) -> dict[str, float]:
    """One stepper's cells of `StepSplit.table()` ({range: {"steps": n, <part>: ms per step}}) pooled over its
    ranges: {"steps": all steps, <part>: ms per step over all of them} (a part a range lacks counts 0 there)."""
    steps = sum(cell["steps"] for cell in ranges.values())
    parts = sorted({p for cell in ranges.values() for p in cell if p != "steps"})
    pooled = {p: sum(cell.get(p, 0.0) * cell["steps"] for cell in ranges.values()) / steps for p in parts}
    return {"steps": int(steps), **pooled}


class StepSplit:
    """Open it around decoding; `table()` then gives ms per step by stepper, range and part."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.steps: collections.Counter[tuple[str, str]] = collections.Counter()
        self._key: tuple[str, str] | None = None
        self._open: collections.Counter[str] = collections.Counter()
        self._undo: list[Callable[[], None]] = []
        self.label = ""

    def _part(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            key = self._key
            if key is None or self._open[name]:  # outside a step, or nested in the same part
                return fn(*args, **kwargs)
            self._open[name] += 1
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[(*key, name)] += time.perf_counter() - started
                self._open[name] -= 1

        return timed

    def _step(self, fn: Callable) -> Callable:
        split = self

        @functools.wraps(fn)
        def timed(stepper: Any, batch: Any) -> int:
            if split._key is not None:  # a speculative step's plain fallback: part of that step
                return fn(stepper, batch)
            drafter = getattr(stepper, "drafter", None)
            name = "plain" if drafter is None else f"sd:{type(drafter).__name__}{getattr(drafter, 'k', '')}"
            name = split.label + name
            split._key = (name, range_of(batch.num_rows))
            started = time.perf_counter()
            try:
                return fn(stepper, batch)
            finally:
                split.seconds[(*split._key, "total")] += time.perf_counter() - started
                split.steps[split._key] += 1
                split._key = None

        return timed

    def _patch(self, owner: Any, attr: str, wrap: Callable[[Callable], Callable]) -> None:
        original = owner.__dict__[attr]
        setattr(owner, attr, wrap(original))
        self._undo.append(lambda: setattr(owner, attr, original))

    def __enter__(self) -> StepSplit:
        from tlt.rollout import batch, block, decode_step, drafting, eagle_tree, history, mixed, runner, speculative

        try:
            self._patch(decode_step.PlainStepper, "step", self._step)
            self._patch(speculative.SpeculativeStepper, "step", self._step)
            for attr, part in (("forward", "target_forward"), ("logits", "lm_head"), ("compact", "compact")):
                self._patch(runner.ModelRunner, attr, functools.partial(self._part, part))
            self._patch(batch.RunningBatch, "commit", functools.partial(self._part, "commit"))
            self._patch(speculative, "_target_tokens", functools.partial(self._part, "sample"))
            self._patch(decode_step, "sample_tokens", functools.partial(self._part, "sample"))
            for attr in ("verify_chain_tokens", "verify_tree_tokens"):
                self._patch(speculative, attr, functools.partial(self._part, "verify"))
            for attr in ("chain_attention_mask", "tree_attention_mask"):
                self._patch(speculative, attr, functools.partial(self._part, "mask"))
            self._patch(decode_step, "causal_mask", functools.partial(self._part, "mask"))
            self._patch(drafting.EagleCache, "_catch_up_inputs", functools.partial(self._part, "draft_inputs"))
            self._patch(drafting.EagleCache, "_chain_step", self._timed_chain_step)
            self._patch(block.BlockChainDrafter, "draft", functools.partial(self._part, "draft_graph"))
            for cls in (
                block.BlockChainDrafter,
                drafting.NgramDrafter,
                drafting.EagleChainDrafter,
                eagle_tree.EagleTreeDrafter,
                history.HistoryDrafter,
                history.HistoryTreeDrafter,
                mixed.MixedDrafter,
            ):
                self._patch(cls, "propose", functools.partial(self._part, "propose"))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _timed_chain_step(self, original: Callable) -> Callable:
        part = self._part

        @functools.wraps(original)
        def chain_step(cache: Any, k: int) -> Callable:
            return part("draft_graph", original(cache, k))

        return chain_step

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            self._undo.pop()()

    def table(self) -> dict[str, dict[str, dict[str, float]]]:
        """{stepper: {range: {"steps": n, "total": ms per step, <part>: ms per step, "host": ms per step}}}.
        `propose` includes its `draft_graph` and `draft_inputs`; `host` = total - target_forward - lm_head
        - draft_graph."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (name, rng), n in sorted(self.steps.items()):
            cell = {part: 1e3 * s / n for (m, r, part), s in self.seconds.items() if (m, r) == (name, rng)}
            cell["host"] = cell["total"] - sum(cell.get(p, 0.0) for p in MODEL_PARTS)
            out.setdefault(name, {})[rng] = {"steps": n, **dict(sorted(cell.items()))}
        return out
