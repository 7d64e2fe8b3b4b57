"""Block drafts: a chain of k tokens per row from ONE block-drafter forward (`tlt.models.block_drafter`).

The drafter reads, per running row, its newest token x[L] and the target's final-norm state f[L-1] that
produced it (`RunningBatch.hidden_buf`, what the EAGLE drafter reads too), and returns k predicted
features at once. Draft i + 1 is the head's argmax at output i, or, in a sampling batch, the coupled
guess with the uniform the target will draw that position with (`tlt.rollout.guess`).

The result is an ordinary chain (`chain_tree`, every row k drafts): the speculative stepper verifies it
exactly as an EAGLE or n-gram chain (greedy exact match, the coupled rule for sampled rows), so block
drafts are lossless by the same argument and tests. Nothing is cached between steps: no catch-up pass
after a switch of arms, and the arm's cost is its one forward plus the verify.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tlt.models.block_drafter import BlockDrafter
from tlt.rollout.batch import RunningBatch
from tlt.rollout.drafting import Draft
from tlt.rollout.guess import GUESSES, coupled_guess, guess_inputs
from tlt.rollout.tree import chain_tree


def block_anchor(batch: RunningBatch) -> tuple[Tensor, Tensor]:
    """(tokens [B], features [B, H]): each running row's newest token x[L] and the target's f[L-1]."""
    if batch.hidden_buf is None:
        raise ValueError("block drafting reads the target's hidden states: build the Engine with return_hidden=True")
    last = batch.lengths() - 1  # [B] the newest committed position L - 1
    return batch.last_token, batch.hidden_buf[batch.wave_rows, last]


def block_guesses(logits: Tensor, u: Tensor | None, temperature: Tensor | None) -> Tensor:
    """logits [B, k, V] -> drafts [B, k] long: the argmax (u None), else the coupled guess with u,
    temperature [B, k] (a greedy row, temperature 0, takes the argmax)."""
    if u is None or temperature is None:
        return logits.argmax(dim=-1)
    b, k, v = logits.shape
    return coupled_guess(logits.reshape(b * k, v), u.reshape(-1), temperature.reshape(-1)).view(b, k)


class BlockChainDrafter:
    """Chains of k drafts per row from one block-drafter forward (2 <= k <= the drafter's block size)."""

    def __init__(self, drafter: BlockDrafter, k: int, guess: str = "coupled") -> None:
        if not 1 <= k <= drafter.block_size:
            raise ValueError(f"block arm depth must be in [1, {drafter.block_size}] (the block drafter's "
                             f"block_size), got {k}")
        if guess not in GUESSES:
            raise ValueError(f"guess must be one of {GUESSES}, got {guess!r}")
        self.drafter, self.k, self.guess = drafter, k, guess

    @torch.no_grad()
    def propose(self, batch: RunningBatch) -> Draft:
        tokens, features = block_anchor(batch)
        logits = self.drafter.draft_logits(self.drafter(tokens, features, self.k))  # [B, k, V]
        u, temperature = guess_inputs(batch, self.k) if self.guess == "coupled" and batch.sampled else (None, None)
        return Draft(chain_tree(batch.last_token, block_guesses(logits, u, temperature)), chain=True)
