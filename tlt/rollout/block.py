"""Block drafts: a chain of k tokens per row from ONE block-drafter forward (`tlt.models.block_drafter`).

The drafter reads, per running row, its newest token x[L] and the target's features f[L-1] that
produced it (`RunningBatch.feature_buf`: the final-norm state the EAGLE drafter reads too, and the chosen
layers' outputs when the drafter reads them, `tlt.models.feature_layers`), and returns k predicted
features at once. Draft i + 1 is the head's argmax at output i, or, in a sampling batch, the coupled
guess with the uniform the target will draw that position with (`tlt.rollout.guess`).

The result is an ordinary chain (`chain_tree`, every row k drafts): the speculative stepper verifies it
exactly as an EAGLE or n-gram chain (greedy exact match, the coupled rule for sampled rows), so block
drafts are lossless by the same argument and tests. Nothing is cached between steps: no catch-up pass
after a switch of arms, and the arm's cost is its one forward plus the verify.

Compiled (`compile=True`, as the engine's steps): the forward, the head and the guesses are one graph per
(k, batch 1 or more, argmax or coupled), batch symbolic, the same code as eager (`block_draft_fn`); every
drafter of the process shares them, and after `warm_up_block` a rollout compiles nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from tlt.models.block_drafter import BlockDrafter
from tlt.rollout.batch import RunningBatch
from tlt.rollout.compiled import _COMPILES, _compiled
from tlt.rollout.drafting import Draft
from tlt.rollout.guess import GUESSES, coupled_guess, guess_inputs
from tlt.rollout.tree import chain_tree


def block_anchor(batch: RunningBatch) -> tuple[Tensor, Tensor]:
    """(tokens [B], features [B, F]): each running row's newest token x[L] and the target's f[L-1]."""
    if batch.feature_buf is None:
        raise ValueError("block drafting reads the target's hidden states: build the Engine with return_hidden=True")
    last = batch.lengths() - 1  # [B] the newest committed position L - 1
    return batch.last_token, batch.feature_buf[batch.wave_rows, last]


def block_guesses(logits: Tensor, u: Tensor | None, temperature: Tensor | None) -> Tensor:
    """logits [B, k, V] -> drafts [B, k] long: the argmax (u None), else the coupled guess with u,
    temperature [B, k] (a greedy row, temperature 0, takes the argmax)."""
    if u is None or temperature is None:
        return logits.argmax(dim=-1)
    b, k, v = logits.shape
    return coupled_guess(logits.reshape(b * k, v), u.reshape(-1), temperature.reshape(-1)).view(b, k)


_BLOCK_FNS: dict[int, Callable[..., Tensor]] = {}


def block_draft_fn(k: int) -> Callable[..., Tensor]:
    """fn(drafter, tokens [B], features [B, F], u=None, temperature=None) -> drafts [B, k] long: one
    forward, the head (the draft vocabulary's when set), the guesses (`block_guesses`). One object per k,
    so every compiled block drafter of the process shares its graphs."""
    if k not in _BLOCK_FNS:

        def block_draft(
            drafter: BlockDrafter,
            tokens: Tensor,
            features: Tensor,
            u: Tensor | None = None,
            temperature: Tensor | None = None,
        ) -> Tensor:
            return block_guesses(drafter.draft_logits(drafter(tokens, features, k)), u, temperature)

        _BLOCK_FNS[k] = block_draft
    return _BLOCK_FNS[k]


class CompiledBlock:
    """`block_draft_fn(k)` through inductor (`tlt.rollout.compiled`), batch symbolic (a batch of 1 is a
    graph of its own); `compiles` counts the graphs its calls compiled."""

    def __init__(self, k: int) -> None:
        self.fn = _compiled(block_draft_fn(k), None)
        self.compiles = 0

    def __call__(self, drafter: BlockDrafter, tokens: Tensor, features: Tensor, *extra: Tensor) -> Tensor:
        if tokens.shape[0] > 1:
            for t in (tokens, features, *extra):
                torch._dynamo.maybe_mark_dynamic(t, 0)
        before = _COMPILES[0]
        out = self.fn(drafter, tokens.contiguous(), features.contiguous(), *extra)
        self.compiles += _COMPILES[0] - before
        return out


class BlockChainDrafter:
    """Chains of k drafts per row from one block-drafter forward (2 <= k <= the drafter's block size)."""

    def __init__(self, drafter: BlockDrafter, k: int, guess: str = "coupled", compile: bool = False) -> None:
        if not 1 <= k <= drafter.block_size:
            raise ValueError(
                f"block arm depth must be in [1, {drafter.block_size}] (the block drafter's block_size), got {k}"
            )
        if guess not in GUESSES:
            raise ValueError(f"guess must be one of {GUESSES}, got {guess!r}")
        self.drafter, self.k, self.guess = drafter, k, guess
        self.step = CompiledBlock(k) if compile else block_draft_fn(k)

    @property
    def compiles(self) -> int:
        """Graphs compiled by this drafter's calls; 0 when eager."""
        return getattr(self.step, "compiles", 0)

    @torch.no_grad()
    def propose(self, batch: RunningBatch) -> Draft:
        tokens, features = block_anchor(batch)
        if features.shape[-1] != self.drafter.feature_size:
            raise ValueError(
                f"the engine keeps features of width {features.shape[-1]}; this block drafter reads "
                f"{self.drafter.feature_size} (feature_layers {list(self.drafter.feature_layers)}): build the "
                "Engine with feature_layers=drafter.feature_layers"
            )
        extra = guess_inputs(batch, self.k) if self.guess == "coupled" and batch.sampled else ()
        return Draft(chain_tree(batch.last_token, self.draft(tokens, features, *extra)), chain=True)

    def draft(self, tokens: Tensor, features: Tensor, *extra: Tensor) -> Tensor:
        """The drafts [B, k] of one block step (the drafter's graph: forward, head, guesses)."""
        return self.step(self.drafter, tokens, features, *extra)


@torch.no_grad()
def warm_up_block(drafter: BlockDrafter, depths: Iterable[int], guesses: Iterable[str] = GUESSES) -> int:
    """Compile the block graphs of `depths` (batch 1 and 2; argmax and / or coupled drafts) before a rollout;
    returns the graphs compiled. Later drafters of any batch size reuse them."""
    compiled = 0
    hidden, device = drafter.feature_size, drafter.device
    for k in sorted(set(depths)):
        step = CompiledBlock(k)
        for b in (1, 2):
            tokens = torch.ones(b, dtype=torch.long, device=device)
            features = torch.zeros(b, hidden, dtype=drafter.fc.weight.dtype, device=device)
            coupled = torch.ones(b, k, dtype=torch.float64, device=device)  # (u, temperature)
            kinds = {"argmax": (), "coupled": (coupled / 2, coupled)}
            for extra in (kinds[g] for g in GUESSES if g in set(guesses)):
                step(drafter, tokens, features, *extra)
        compiled += step.compiles
    return compiled
