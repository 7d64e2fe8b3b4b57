"""Model-free n-gram drafter: propose what followed the most recent earlier occurrence of the context's tail.

For n from ngram_max down to ngram_min, look for the last n tokens (prompt + response so far) earlier in
the same context; at the most recent match, propose the up-to-k tokens that followed it. The first n
with a match wins. The drafts are deterministic (no q): verify them with the one-hot rule
(`verify.verify_deterministic_chain`). Short or empty contexts simply give no draft.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _check_args(k: int, ngram_min: int, ngram_max: int) -> None:
    if k < 0:
        raise ValueError(f"k (draft length) must be >= 0, got {k}")
    if not 1 <= ngram_min <= ngram_max:
        raise ValueError(f"need 1 <= ngram_min <= ngram_max, got ngram_min={ngram_min}, ngram_max={ngram_max}")


def ngram_draft_batch(tokens: Tensor, lengths: Tensor, k: int, ngram_min: int, ngram_max: int) -> tuple[Tensor, Tensor]:
    """N-gram drafts for a batch of right-padded contexts.

    tokens: [B, L] int64 (row b's context is tokens[b, :lengths[b]]); lengths: [B] int64.
    Returns (draft [B, k] int64, zero-padded; n_draft [B] int64, 0 where nothing matched).
    """
    _check_args(k, ngram_min, ngram_max)
    B, L = tokens.shape
    device = tokens.device
    draft = torch.zeros(B, k, dtype=torch.long, device=device)
    n_draft = torch.zeros(B, dtype=torch.long, device=device)
    if k == 0 or L == 0:
        return draft, n_draft
    found = torch.zeros(B, dtype=torch.bool, device=device)
    rows = torch.arange(B, device=device)
    for n in range(min(ngram_max, L - 1), ngram_min - 1, -1):
        # The tail and a match must not overlap the end: a match at start i needs i + n <= length - 1,
        # so at least one continuation token exists and the tail does not match itself.
        can = ~found & (lengths >= n + 1)
        if not can.any():
            continue
        tail_idx = (lengths[:, None] - n + torch.arange(n, device=device)[None, :]).clamp(0, L - 1)
        tail = tokens.gather(1, tail_idx)  # [B, n]
        windows = tokens.unfold(1, n, 1)  # [B, L - n + 1, n]
        starts = torch.arange(windows.shape[1], device=device)
        match = (windows == tail[:, None, :]).all(dim=-1) & (starts[None, :] + n <= lengths[:, None] - 1)
        match &= can[:, None]
        hit = match.any(dim=1)
        if not hit.any():
            continue
        last = torch.where(match, starts[None, :], -1).max(dim=1).values  # most recent match start
        begin = last + n  # first continuation token
        count = (lengths - begin).clamp(max=k)
        idx = (begin[:, None] + torch.arange(k, device=device)[None, :]).clamp(0, L - 1)
        cont = tokens.gather(1, idx).masked_fill(torch.arange(k, device=device)[None, :] >= count[:, None], 0)
        draft[rows[hit]] = cont[hit]
        n_draft[hit] = count[hit]
        found |= hit
    return draft, n_draft


def ngram_draft(context: Sequence[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """N-gram draft (up to k tokens) for one context given as a list of token ids."""
    _check_args(k, ngram_min, ngram_max)
    if not context:
        return []
    tokens = torch.tensor([list(context)], dtype=torch.long)
    draft, n_draft = ngram_draft_batch(tokens, torch.tensor([len(context)]), k, ngram_min, ngram_max)
    return draft[0, : int(n_draft[0])].tolist()
