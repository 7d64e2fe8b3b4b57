"""A reduced draft vocabulary: the drafter proposes from the N tokens the policy emits most often.

A one-layer drafter's step is its layer plus the policy's LM head, and for a real vocabulary the
head dominates: Qwen2.5-0.5B's is 896 x 151936 (136M weights against the layer's ~15M), so a
drafter step costs ~0.22 of a target step on this CPU, weight reads that a GPU pays alike. EAGLE-3
drafts from the most frequent tokens only; this does the same with TLT's own data: the tokens this
rollout worker has seen (its prompts and the responses it generated), recounted before every
rollout, so the subset follows the policy as it drifts.

Lossless whatever the subset: a draft is only a guess and verification compares it with the
target's own token (`tlt.rollout.verify`). A target token outside the subset is never drafted, so
the subset costs acceptance exactly where the policy emits a rare token; `DraftVocabTracker`
reports that rate (`coverage`: the share of generated tokens inside the subset drafted from).

Shapes: `DraftVocab.logits` maps predicted features [..., H] to logits [..., V] over the FULL
vocabulary, -inf outside the subset, so every consumer (argmax, the coupled guess's inverse CDF
in token-id order, a tree's top-k) reads them as the full head's, restricted. Its tensors keep
their identity and shape for the drafter's life (refreshed in place), so compiled drafter graphs
stay valid when the subset or the policy's head changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def top_tokens(counts: Tensor, size: int, always: Sequence[int] = ()) -> Tensor:
    """The `size` most counted token ids, ascending: every id of `always` first (e.g. stop tokens, so a
    draft can end), then by count, ties to the lower id. counts [V] (int) -> ids [size] long."""
    vocab = counts.shape[0]
    if not 1 <= size <= vocab:
        raise ValueError(f"draft vocabulary size must be in [1, {vocab}] (the vocabulary), got {size}")
    forced = sorted({int(t) for t in always})
    if any(not 0 <= t < vocab for t in forced):
        raise ValueError(f"always-drafted ids {forced[:5]} outside the vocabulary [0, {vocab})")
    if len(forced) > size:
        raise ValueError(f"{len(forced)} always-drafted ids do not fit a draft vocabulary of {size}")
    score = counts.to(torch.float64).clone()
    if forced:
        score[forced] = float("inf")
    order = torch.sort(-score, stable=True).indices  # by count descending, ties by id ascending
    return order[:size].sort().values


class DraftVocab:
    """The subset (ids [N], ascending) and the LM head's rows for it ([N, H], plus bias rows [N] when the
    head has a bias), allocated once and refreshed in place (`update`)."""

    def __init__(self, head: nn.Linear, size: int) -> None:
        vocab = head.out_features
        if not 1 <= size < vocab:
            raise ValueError(
                f"speculative.draftVocab must be in [1, {vocab - 1}] for this policy (its vocabulary "
                f"has {vocab} tokens; 0 drafts from all of them), got {size}"
            )
        self.vocab_size = vocab
        weight = head.weight
        self.ids = torch.arange(size, dtype=torch.long, device=weight.device)
        self.rows = torch.empty(size, weight.shape[1], dtype=weight.dtype, device=weight.device)
        self.bias = None if head.bias is None else torch.empty(size, dtype=head.bias.dtype, device=weight.device)
        self.update(self.ids.clone(), head)

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    @torch.no_grad()
    def update(self, ids: Tensor, head: nn.Linear) -> None:
        """Draft from `ids` [N] (distinct, ascending, in range) with `head`'s current rows (call again after
        the policy's weights change: the rows are copies)."""
        if ids.shape != self.ids.shape:
            raise ValueError(f"a draft vocabulary of {self.size} ids, got shape {tuple(ids.shape)}")
        ids = ids.to(self.ids.device)
        if self.size > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("draft vocabulary ids must be distinct and ascending")
        if int(ids[0]) < 0 or int(ids[-1]) >= self.vocab_size:
            raise ValueError(f"draft vocabulary ids outside [0, {self.vocab_size})")
        self.ids.copy_(ids)
        torch.index_select(head.weight.detach(), 0, self.ids, out=self.rows)
        if self.bias is not None:
            torch.index_select(head.bias.detach(), 0, self.ids, out=self.bias)

    def logits(self, pred: Tensor) -> Tensor:
        """pred [..., H] -> logits [..., V]: the head's over the subset, -inf elsewhere."""
        sub = F.linear(pred.to(self.rows.dtype), self.rows, self.bias)  # [..., N]
        full = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy(-1, self.ids, sub)


class DraftVocabTracker:
    """A rollout worker's token counts and the drafter's subset chosen from them.

    `before(prompts, always)` counts the prompts about to be generated from and re-picks the subset, with
    `always` (the requests' stop tokens) in it; the first rollout drafts from its prompts' tokens alone.
    `after(responses)` counts the generated tokens and returns (inside, total): how many of them the
    subset in use held."""

    def __init__(self, vocab: DraftVocab, head: nn.Linear) -> None:
        self.vocab, self.head = vocab, head
        self.counts = torch.zeros(vocab.vocab_size, dtype=torch.long)

    def load_counts(self, counts: Tensor) -> None:
        """Resume from a checkpoint's counts [V] (the next `before` picks from them); counts of another
        vocabulary are refused."""
        if counts.shape != self.counts.shape:
            raise ValueError(
                f"draft vocabulary counts of {tuple(counts.shape)} tokens; this policy has {self.counts.shape[0]}"
            )
        self.counts = counts.to(torch.long).cpu().clone()

    def _count(self, token_lists: Iterable[Sequence[int]]) -> list[int]:
        flat = [t for tokens in token_lists for t in tokens]
        if flat:
            self.counts += torch.bincount(torch.tensor(flat, dtype=torch.long), minlength=self.counts.shape[0])
        return flat

    def before(self, prompts: Iterable[Sequence[int]], always: Sequence[int] = ()) -> None:
        self._count(prompts)
        if len(set(always)) > self.vocab.size:
            raise ValueError(
                f"speculative.draftVocab ({self.vocab.size}) must hold the requests' {len(set(always))} stop tokens"
            )
        self.vocab.update(top_tokens(self.counts, self.vocab.size, always), self.head)

    def after(self, responses: Iterable[Sequence[int]]) -> tuple[int, int]:
        inside = torch.zeros(self.counts.shape[0], dtype=torch.bool)
        inside[self.vocab.ids.cpu()] = True
        flat = self._count(responses)
        return (int(inside[torch.tensor(flat, dtype=torch.long)].sum()) if flat else 0), len(flat)
