"""Attention over packed sequences, one causal segment at a time (the drafter trainer's packed rows).

A packed row holds several sequences back to back; the dense way to keep them apart is a block-diagonal
[T, T] mask, which makes attention cost T^2 whatever the sequences' lengths. Run per segment with
`is_causal`, it costs the sum of the squared lengths (a 512-token row of seven ~70-token sequences:
~1/7) and needs no mask. Registered with transformers' `AttentionInterface` as `SEGMENT_ATTENTION`, so a
Hugging Face decoder layer uses it when its config names it; a call without `segments` is plain SDPA.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SEGMENT_ATTENTION = "tlt_segments"


def segment_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    segments: Sequence[int] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [1, heads, T, D], key / value [1, kv_heads, T, D]; segments: the packed sequences' lengths in
    row order (sum T). Returns the attention output [1, T, heads, D] (transformers' layout) and None.

    Without `segments`: transformers' SDPA attention, unchanged (attention_mask and kwargs as given)."""
    if segments is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if attention_mask is not None:
        raise ValueError("segment attention takes segments or an attention_mask, not both")
    if query.shape[0] != 1:
        raise ValueError(f"segment attention runs on one packed row, got a batch of {query.shape[0]}")
    if sum(segments) != query.shape[2] or min(segments, default=0) < 1:
        raise ValueError(f"segments {list(segments)} must be positive and sum to the row's {query.shape[2]} positions")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    outputs, start = [], 0
    for length in segments:
        end = start + length
        outputs.append(
            F.scaled_dot_product_attention(
                query[:, :, start:end],
                key[:, :, start:end],
                value[:, :, start:end],
                dropout_p=dropout,
                scale=scaling,
                is_causal=True,
            )
        )
        start = end
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(SEGMENT_ATTENTION, segment_attention)
