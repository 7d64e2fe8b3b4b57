"""The verify cost curve: what one target forward of k tokens per row costs relative to one token.

Speculative decoding pays while verifying k + 1 tokens costs little more than decoding 1, i.e.
while the running batch is small. `measure_costs` times the engine's own forward (runner + LM
head) over a cache filled to `context` slots, for every (batch, width) pair, the widths of a batch
interleaved within each repeat so machine load hits them alike (batches one after another: a ratio
compares widths within a batch, and a call after a larger batch's reads slow). On a shared machine wall time mostly
measures
the scheduler: by default the clock is this process's CPU time (exact with one torch thread,
which also avoids OpenMP threads spinning while their partner is descheduled) and the estimate
is the fastest repeat (interference only adds time); the per-repeat ratios give the spread.
`ideal_speedup` turns an accept length, a verify cost ratio and the drafter's cost into the speedup
SD would reach (`measure_drafter_costs` times a drafter step against a target step);
`pick_threshold` is the largest batch where an arm still pays.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import PreTrainedModel

from tlt.rollout.runner import ModelRunner, causal_mask

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


@dataclass(frozen=True)
class CostPoint:
    """Verify cost at one (batch, width): seconds per forward (fastest repeat) and the ratio to width 1.

    ratio: fastest t(batch, width) over fastest t(batch, 1); ratio_min / ratio_max: the range of
    the per-repeat ratios t(batch, width) / t(batch, 1) (the noise of a shared machine).
    """

    batch: int
    width: int
    seconds: float
    ratio: float
    ratio_min: float
    ratio_max: float


def forward_fn(runner: ModelRunner, batch: int, width: int, context: int):
    """A call of the runner's forward + LM head over `width` tokens for each of `batch` rows after
    `context` cached slots (the cache's lengths must already say so)."""
    lengths = torch.full((batch,), context, dtype=torch.long, device=runner.device)
    slots = lengths[:, None] + torch.arange(width, device=runner.device)[None, :]  # [B, W]
    mask = causal_mask(lengths, width, context + width)  # [B, W, S]
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, runner.model.config.vocab_size, (batch, width), generator=generator).to(runner.device)

    def go() -> None:
        runner.logits(runner.forward(tokens, slots, slots, mask))

    return go


def _timed_rounds(
    fns: dict,
    repeats: int,
    now: Callable[[], float],
    sync: Callable[[], None] = lambda: None,
    block: Callable[[Any], Any] = lambda key: key[0],
) -> dict:
    """Block by block (keys grouped by `block(key)`, by default their first element: the batch), `repeats`
    rounds of the block's fns; in each, every fn called twice in a row and the second call timed: key ->
    [seconds]. A decode loop runs a shape back to back; a call timed right after another shape's pays for
    what that one evicted (measured: up to 1.3x slow), and after a larger batch's, more than a second call
    restores: a one-row, one-token forward of the 16 x 96 bench policy (compiled, 1 thread) read 1.5-1.9 ms
    in rounds over batches 1-16 against 0.94-1.0 ms in rounds of its own batch, which put the one-row verify
    ratios at 0.72-0.94 where a one-row decode loop pays 1.09-1.42 (AVX-512 CPU, 2026-11-28). Ratios compare widths
    within a batch, so each batch's rounds run together. `sync` waits for the device's queued work (a CUDA
    device runs kernels asynchronously: without it the clock reads the launches, not the work)."""
    seconds: dict = {key: [] for key in fns}
    blocks: dict = {}
    for key in fns:
        blocks.setdefault(block(key), []).append(key)
    for keys in blocks.values():
        for key in keys:  # settle into this block's shapes before its first timed round
            fns[key]()
        sync()
        for _ in range(repeats):
            for key in keys:
                fns[key]()
                sync()
                t0 = now()
                fns[key]()
                sync()
                seconds[key].append(max(now() - t0, 1e-9))
    return seconds


def _clock_for(clock: str, device: torch.device) -> tuple[Callable[[], float], Callable[[], None]]:
    """(clock, device sync) for timing forwards on `device`. On CUDA only the wall clock measures the device's
    work: the process's CPU time counts the host's launches (and its waits, spinning or not)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    if device.type == "cuda":
        if clock != "wall":
            raise ValueError(f"clock {clock!r} cannot time a CUDA device's work; use clock 'wall'")
        return CLOCKS[clock], lambda: torch.cuda.synchronize(device)
    return CLOCKS[clock], lambda: None


@torch.no_grad()
def measure_costs(
    model: PreTrainedModel,
    *,
    batches: list[int],
    widths: list[int],
    context: int,
    repeats: int,
    clock: Literal["cpu", "wall"] = "cpu",
    compile: bool = False,
) -> list[CostPoint]:
    """Time a forward of `width` tokens per row for `batch` rows after `context` cached slots.

    Width 1 (plain decoding) is always measured. One warm-up round, then per batch `repeats` rounds, each
    running every width twice and timing the second call (`_timed_rounds`: a decode loop runs a shape back
    to back, and a call timed right after another shape's pays for what that one evicted). clock: "cpu"
    (process CPU time; see the module docstring) or "wall". compile: time the compiled step (as `Engine(compile=True)`
    runs). Returns one
    CostPoint per pair, batch-major.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    now, sync = _clock_for(clock, model.device)
    widths = sorted(set(widths) | {1})
    runner = ModelRunner(
        model,
        max_batch_size=max(batches),
        max_context=context + max(widths) + 1,
        capacity=context + max(widths) + 1,
        compile=compile,
    )
    runner.cache.start(max(batches))
    runner.cache.lengths = [context] * max(batches)  # slots hold zeros: cost does not depend on values
    fns = {(b, w): forward_fn(runner, b, w, context) for b in batches for w in widths}
    for fn in fns.values():
        fn()
    sync()
    seconds = _timed_rounds(fns, repeats, now, sync)
    out = []
    for b in batches:
        base = seconds[(b, 1)]
        for w in widths:
            ratios = [t / t1 for t, t1 in zip(seconds[(b, w)], base)]
            fastest = min(seconds[(b, w)])
            out.append(CostPoint(b, w, fastest, fastest / min(base), min(ratios), max(ratios)))
    return out


@dataclass(frozen=True)
class DrafterCost:
    """One EAGLE drafter step (fc + its layer + the LM head, one token per row) at `batch` rows after
    `context` cached slots: seconds (fastest repeat) and `ratio` to the target's 1-token forward at
    the same batch (fastest over fastest), measured interleaved with it. draft_vocab: the head's tokens
    (`tlt.models.draft_vocab`; 0: the whole vocabulary)."""

    batch: int
    seconds: float
    ratio: float
    draft_vocab: int = 0


@torch.no_grad()
def measure_drafter_costs(
    model: PreTrainedModel,
    *,
    batches: list[int],
    context: int,
    repeats: int,
    clock: Literal["cpu", "wall"] = "cpu",
    compile: bool = False,
    draft_vocabs: tuple[int, ...] = (0,),
) -> list[DrafterCost]:
    """Time one drafter step against one target step (1 token per row) for every batch and every head
    size of `draft_vocabs` (0: the whole vocabulary; else a reduced draft vocabulary of that many random
    tokens), all interleaved; a drafter of `model`'s shape with random weights (the cost does not depend
    on the values). compile: the drafter's layer and the target compiled. Batch-major, then head size."""
    from tlt.models.draft_vocab import DraftVocab
    from tlt.models.drafter import EagleDrafter, drafter_config_from_target
    from tlt.rollout.drafting import EagleCache

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    now, sync = _clock_for(clock, model.device)
    drafter = EagleDrafter(drafter_config_from_target(model.config)).to(model.device, model.dtype).eval()
    drafter.bind_policy(model)
    head = model.get_output_embeddings()
    generator = torch.Generator().manual_seed(0)
    heads = {}
    for n in dict.fromkeys(draft_vocabs):
        if n == 0:
            heads[n] = drafter.logits
            continue
        vocab = DraftVocab(head, n)
        vocab.update(torch.randperm(vocab.vocab_size, generator=generator)[:n].sort().values, head)
        heads[n] = vocab.logits
    rows = max(batches)
    state = EagleCache(drafter, model.get_input_embeddings(), rows, context + 2, compile)
    state.cache.start(rows)
    state.cache.lengths = [context] * rows
    runner = ModelRunner(model, max_batch_size=rows, max_context=context + 2, capacity=context + 2, compile=compile)
    runner.cache.start(rows)
    runner.cache.lengths = [context] * rows
    hidden = model.config.hidden_size

    def draft_fn(b: int, logits: Callable):
        pos = torch.full((b, 1), context, dtype=torch.long, device=runner.device)
        mask = causal_mask(torch.full((b,), context, dtype=torch.long, device=runner.device), 1, context + 1)
        token = torch.ones(b, 1, dtype=torch.long, device=runner.device)
        feature = torch.zeros(b, 1, hidden, dtype=model.dtype, device=runner.device)
        return lambda: logits(state.forward(token, feature, pos, pos, mask))

    fns = {}
    for b in batches:
        fns[(b, "target")] = forward_fn(runner, b, 1, context)
        fns.update({(b, n): draft_fn(b, logits) for n, logits in heads.items()})
    for fn in fns.values():
        fn()
    sync()
    seconds = _timed_rounds(fns, repeats, now, sync)
    return [
        DrafterCost(b, min(seconds[(b, n)]), min(seconds[(b, n)]) / min(seconds[(b, "target")]), n)
        for b in batches
        for n in heads
    ]


def drafter_ratio(costs: list[DrafterCost], batch: int, draft_vocab: int = 0) -> float:
    """A drafter step's cost relative to a target step at `batch` (linear between measured batches), for the
    head over `draft_vocab` tokens (0: the whole vocabulary)."""
    ordered = sorted((c for c in costs if c.draft_vocab == draft_vocab), key=lambda c: c.batch)
    if not ordered:
        raise ValueError(f"no drafter cost measured with draft_vocab={draft_vocab}")
    return _interp(batch, [c.batch for c in ordered], [c.ratio for c in ordered])


def cost_ratio(points: list[CostPoint], batch: int, width: int) -> float:
    """Cost ratio at (batch, width), interpolated linearly in batch and width between measured points
    (clamped at the measured ends)."""
    batches = sorted({p.batch for p in points})
    table = {(p.batch, p.width): p.ratio for p in points}

    def at_batch(b: int) -> float:
        widths = sorted(w for (bb, w) in table if bb == b)
        return _interp(width, widths, [table[(b, w)] for w in widths])

    return _interp(batch, batches, [at_batch(b) for b in batches])


def _interp(x: float, xs: list[int], ys: list[float]) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x < x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise ValueError(f"measured points must be ascending, got {xs}")


def amdahl(share: float, speedup: float) -> float:
    """Whole speed-up when a `share` of the time runs `speedup` times faster and the rest as before."""
    if not 0.0 <= share <= 1.0 or speedup <= 0:
        raise ValueError(f"share must be in [0, 1] and speedup > 0, got {share} and {speedup}")
    return 1.0 / (1.0 - share + share / speedup)


def ideal_speedup(accept_length: float, ratio: float, drafter_steps: float = 0.0) -> float:
    """Speedup of SD over plain decoding: tokens per step over the step's cost relative to a plain
    step (accept_length counts the target's own next token, so >= 1). `ratio` is the verify cost;
    `drafter_steps` the drafter's cost in plain steps (0: a free drafter; a chain of depth d costs
    d drafter steps, each `drafter_ratio`)."""
    if ratio <= 0:
        raise ValueError(f"ratio must be > 0, got {ratio}")
    if drafter_steps < 0:
        raise ValueError(f"drafter_steps must be >= 0, got {drafter_steps}")
    return accept_length / (ratio + drafter_steps)


def pick_threshold(points: list[CostPoint], width: int, accept_length: float) -> int:
    """Largest measured batch where an arm of `width` verify tokens with `accept_length` still pays
    (ideal speedup > 1); 0 when it pays nowhere. Linear interpolation between measured batches."""
    batches = sorted({p.batch for p in points})
    best = 0
    for b in range(1, max(batches) + 1):
        if ideal_speedup(accept_length, cost_ratio(points, b, width)) > 1.0:
            best = b
    return best
