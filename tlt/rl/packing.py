"""Micro-batch layouts for the policy forward: which sequences share a forward, and how they sit in it.

B sequences, each a (prompt, response) pair of L_b = P_b + R_b tokens, T = max_b R_b.

- padded:  the batch's order, `micro_batch_size` sequences per forward, each right-padded to the
           longest sequence of its micro-batch (the original layout).
- sorted:  the same, after sorting sequences by length (longest first), so each micro-batch pads
           only to sequences of nearly its own length; the long tail no longer pads the short ones.
- packed:  the sorted micro-batches, each laid end to end in ONE row with position ids restarting
           at 0 per sequence and no attention mask (veRL's remove-padding). transformers (>= 4.54)
           turns restarting position ids into a block-diagonal causal mask when `attention_mask` is
           None and there is no cache (`masking_utils.find_packed_sequence_indices`), for the eager
           and sdpa kernels, so every token still attends only to earlier tokens of its own
           sequence. No token of padding is computed, but attention is still a dense [N, N]
           product over the row with the other sequences masked out (the CPU sdpa kernel has no
           varlen path; flash-attention varlen needs CUDA), so packing b sequences costs b times
           the attention of sorting them. Measured on this CPU (32 sequences, responses mean 70 /
           max 229 tokens, micro-batch 8, update seconds): 16 layers x 128 wide padded 2.7-3.6,
           sorted 1.4-1.5, packed 2.1-2.4; 4 layers x 512 wide padded 5.3-5.9, sorted 2.9-3.0,
           packed 3.1-3.4. Hence `sorted` is the default; `packed` pays where attention is cheap
           against the MLP or with a varlen kernel.

Loss terms are normalised by whole-batch counts (`tlt.rl.grpo.aggregate`), so how sequences are
grouped changes only the floating-point summation order, never the gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

Layout = Literal["padded", "sorted", "packed"]
LAYOUTS: tuple[str, ...] = ("padded", "sorted", "packed")


def micro_batches(lengths: Sequence[int], size: int, layout: str) -> list[list[int]]:
    """Row indices of each micro-batch: `size` sequences each, in batch order (padded) or by
    decreasing length `lengths[b]` (sorted, packed; ties keep batch order)."""
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    if layout not in LAYOUTS:
        raise ValueError(f"algorithm.updateLayout must be one of {list(LAYOUTS)}, got {layout!r}")
    order = list(range(len(lengths)))
    if layout != "padded":
        order.sort(key=lambda b: -lengths[b])
    return [order[i : i + size] for i in range(0, len(order), size)]


@dataclass(frozen=True)
class ForwardInputs:
    """One forward's inputs and where its response predictions are.

    input_ids [R, N]; attention_mask [R, N] and position_ids None when padded (positions are the
    column index); when packed, attention_mask None and position_ids [1, N] restarting at 0 per
    sequence (they carry the boundaries); flat_index [b, T] indexes the forward's logits flattened to [R * N, V]:
    entry (i, j) is the position whose logits predict response token j of sequence i (clamped
    for j past the response, masked later); targets [b, T] the response tokens (pad beyond).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor | None
    flat_index: torch.Tensor
    targets: torch.Tensor


def forward_inputs(
    prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], *, packed: bool, pad_id: int = 0
) -> ForwardInputs:
    """The forward of b sequences: b right-padded rows, or one packed row of sum_b L_b tokens."""
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    resp_width = max(len(r) for r in response_ids)
    rows, width = (1, sum(lengths)) if packed else (len(lengths), max(lengths))
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((rows, width), dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    flat_index = torch.zeros((len(lengths), resp_width), dtype=torch.long)
    targets = torch.full((len(lengths), resp_width), pad_id, dtype=torch.long)
    offset = 0
    for b, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
        row, start = (0, offset) if packed else (b, 0)
        end = start + lengths[b]
        input_ids[row, start:end] = torch.tensor(list(prompt) + list(response), dtype=torch.long)
        position_ids[row, start:end] = torch.arange(lengths[b])
        attention[row, start:end] = 1
        # logits at position P_b - 1 + j predict response token j
        local = (len(prompt) - 1 + torch.arange(resp_width)).clamp(max=lengths[b] - 1)
        flat_index[b] = row * width + start + local
        targets[b, : len(response)] = torch.tensor(list(response), dtype=torch.long)
        offset = end
    if packed:
        return ForwardInputs(input_ids, None, position_ids, flat_index, targets)
    return ForwardInputs(input_ids, attention, None, flat_index, targets)
