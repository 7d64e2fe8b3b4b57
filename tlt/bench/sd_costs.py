"""What the SD bench's drafters cost per step: one EAGLE drafter step and one block-drafter forward (its
deepest block), per running batch, the batches interleaved and the fastest of `repeats` rounds kept."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel

from tlt.models.block_drafter import BlockDrafter
from tlt.models.drafter import EagleDrafter
from tlt.rollout.block import CompiledBlock, block_draft_fn
from tlt.rollout.drafting import EagleCache
from tlt.rollout.runner import causal_mask


def drafter_step_costs(
    batches: tuple[int, ...], ctx: int, repeats: int, drafter: EagleDrafter, policy: PreTrainedModel
) -> list[dict]:
    """Seconds of one drafter step (one token per row after `ctx` cached slots, plus the head), per batch."""
    state = EagleCache(drafter, policy.get_input_embeddings(), max(batches), ctx + 2)
    fns = {}
    for b in batches:
        L = torch.full((b,), ctx, dtype=torch.long)
        tokens = torch.ones(b, 1, dtype=torch.long)
        feats = torch.zeros(b, 1, policy.config.hidden_size, dtype=policy.dtype)
        mask = causal_mask(L, 1, ctx + 1)

        def go(
            b: int = b,
            L: torch.Tensor = L,
            tokens: torch.Tensor = tokens,
            feats: torch.Tensor = feats,
            mask: torch.Tensor = mask,
        ) -> None:
            state.cache.start(b)
            state.drafter.logits(state.forward(tokens, feats, L[:, None], L[:, None], mask))

        fns[b] = go
    return fastest(fns, repeats)


def block_step_costs(
    batches: tuple[int, ...],
    depths: tuple[int, ...],
    repeats: int,
    block: BlockDrafter,
    policy: PreTrainedModel,
    compile: bool = False,
) -> list[dict]:
    """Seconds of one block draft of each block variant's depth per batch: the drafter's forward, the head and
    the argmax drafts (`block_draft_fn`; compiled: `CompiledBlock`, as a compiled engine's block arms run it),
    what a block step drafts with (a chain of k pays k drafter steps). [{batch, block, seconds,
    seconds_median}], batch-major; the depths are timed interleaved within each round."""
    steps = {k: CompiledBlock(k) if compile else block_draft_fn(k) for k in depths}
    fns = {}
    for b in batches:
        tokens = torch.ones(b, dtype=torch.long)
        feats = torch.zeros(b, block.feature_size, dtype=policy.dtype)
        for k in depths:
            fns[(b, k)] = lambda tokens=tokens, feats=feats, k=k: steps[k](block, tokens, feats)
    return [{**point, "batch": point["batch"][0], "block": point["batch"][1]} for point in fastest(fns, repeats)]


def block_cost_fraction(
    costs: dict[str, Any], part: str = "block_step", target: str = "verify"
) -> dict[str, dict[str, float]]:
    """{block depth: {batch: one block draft / one target step}} of the bench's `costs[part]` (fastest
    repeats; the target step is `costs[target]`'s one-token step of that batch)."""
    step = {p["batch"]: p["seconds"] for p in costs[target] if p["width"] == 1}
    out: dict[str, dict[str, float]] = {}
    for p in costs[part]:
        out.setdefault(str(p["block"]), {})[str(p["batch"])] = p["seconds"] / step[p["batch"]]
    return out


def fastest(fns: dict[Any, Callable[[], object]], repeats: int) -> list[dict]:
    """[{batch, seconds (fastest), seconds_median}] of each batch's call over `repeats` rounds after an
    untimed one, the batches interleaved within a round."""
    seconds: dict[int, list[float]] = {b: [] for b in fns}
    with torch.no_grad():
        for _ in range(repeats + 1):
            for b, go in fns.items():
                t0 = time.perf_counter()
                go()
                seconds[b].append(time.perf_counter() - t0)
    return [{"batch": b, "seconds": min(s[1:]), "seconds_median": statistics.median(s[1:])} for b, s in seconds.items()]
