"""Compile a compiled engine's graphs before its first timed rollout.

A compiled step builds its graphs on first use: four for the target (batch 1 or more, width 1 or
more), four for the EAGLE drafter's step (trees; the catch-up pass pads its width to >= 2) and four per
chain depth for the drafter's fused catch-up + chain call (batch 1 or more; argmax or coupled drafts).
Left to the first rollout, that compile time (seconds warm, minutes cold) would land in step 0's rollout
time, and more of it in variants that draft. `warm_up` runs each shape class once on scratch cache
entries (a new wave starts the cache afresh) and returns the seconds it took. A run warms up only the
drafter graphs its arms and sampling can reach (`tlt.adaptive.arms.drafter_graphs`): a sampling run's
chains draft coupled guesses only, and only trees run the drafter's step (at width topk), so a run
usually needs only some of the 12 drafter graphs. Block arms' graphs (one per depth, batch 1 or
more, argmax or coupled) are `warm_up_blocks`'s (`tlt.rollout.block.warm_up_block`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from tlt.models.block_drafter import BlockDrafter
from tlt.models.drafter import EagleDrafter
from tlt.rollout.block import warm_up_block
from tlt.rollout.drafting import GUESSES, EagleCache
from tlt.rollout.engine import Engine
from tlt.rollout.runner import causal_mask


def _inputs(rows: int, width: int, context: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """token ids, positions = slots [rows, width] after `context` cached slots, and the causal mask."""
    lengths = torch.full((rows,), context, dtype=torch.long, device=device)
    slots = lengths[:, None] + torch.arange(width, device=device)[None, :]
    tokens = torch.ones(rows, width, dtype=torch.long, device=device)
    return tokens, slots, causal_mask(lengths, width, context + width)


@torch.no_grad()
def warm_up(
    engine: Engine,
    drafter: EagleDrafter | None = None,
    *,
    context: int = 4,
    width: int = 3,
    chain_depths: Iterable[int] = (),
    target: bool = True,
    batches: Iterable[int] | None = None,
    step_widths: Iterable[int] = (1, 2),
    guesses: Iterable[str] = GUESSES,
) -> float:
    """Run every shape class of the engine's compiled target step (and of `drafter`'s, when given) once;
    with `chain_depths`, also the drafter's fused catch-up + chain graphs of those depths (the chain arms').
    `target=False` skips the target's graphs and `batches` (a subset of {1, 2}: one row, several rows)
    the other batch classes: `tlt.runtime.precompile` compiles those parts in separate processes.
    `step_widths` (a subset of {1, 2}: width 1, width > 1) are the drafter step's width classes to warm
    up and `guesses` (of "argmax", "coupled") the chains' draft kinds; the defaults: all of them.

    No-op (0.0) for an eager engine. The drafter's graphs are shared by every EagleCache built later
    for a drafter of the same shapes (dynamo keys graphs on code and input shapes, not on objects).
    """
    if not engine.compiled:
        return 0.0
    started = time.perf_counter()
    runner = engine.runner
    every = sorted({1, min(2, engine.max_batch_size)})
    rows = [b for b in every if batches is None or b in set(batches)]
    context = min(context, engine.max_context - width - 1)
    for b in rows if target else ():
        for w in (1, width):
            tokens, slots, mask = _inputs(b, w, context, runner.device)
            runner.forward(tokens, slots, slots, mask)
    if drafter is not None:
        state = EagleCache(drafter, runner.model.get_input_embeddings(), max(every), engine.max_context, compile=True)
        widths = [w for w in (1, width) if min(w, 2) in set(step_widths)]
        for b in rows:
            for w in widths:
                tokens, slots, mask = _inputs(b, w, context, runner.device)
                features = torch.zeros(
                    b, w, drafter.config.hidden_size, dtype=drafter.fc.weight.dtype, device=runner.device
                )
                state.forward(tokens, features, slots, slots, mask)
        for k in sorted(set(chain_depths)):
            for b in rows:
                tokens, slots, _ = _inputs(b, 2, context, runner.device)
                mask = causal_mask(slots[:, 0], 2, context + 2 + k - 1)
                features = torch.zeros(
                    b, 2, drafter.config.hidden_size, dtype=drafter.fc.weight.dtype, device=runner.device
                )
                state.cache.ensure_capacity(mask.shape[-1])
                coupled = torch.ones(b, k, dtype=torch.float64, device=runner.device)  # (u, temperature)
                kinds = {"argmax": (), "coupled": (coupled / 2, coupled)}  # coupled: sampling batches' guesses
                for extra in (kinds[g] for g in GUESSES if g in set(guesses)):
                    state._chain_step(k)(
                        state.step, tokens, slots, slots.clone(), mask, state.cache.k, state.cache.v, features, *extra
                    )
    return time.perf_counter() - started


def warm_up_blocks(
    engine: Engine, block: BlockDrafter | None, *, depths: Iterable[int] = (), guesses: Iterable[str] = GUESSES
) -> float:
    """Compile the block-draft graphs of `depths` (the block arms', `tlt.adaptive.arms.block_graphs`) and
    `guesses` for `block`; returns the seconds it took. No-op (0.0) for an eager engine or without a block
    drafter."""
    if not engine.compiled or block is None or not list(depths):
        return 0.0
    started = time.perf_counter()
    warm_up_block(block, depths, guesses)
    return time.perf_counter() - started
