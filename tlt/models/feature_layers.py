"""The target features a block drafter reads: the final-norm state and the outputs of chosen decoder layers.

A block drafter predicts k tokens from one anchor, so everything it knows of the context comes through
the target's state at that position. The final-norm state is tuned for the very next token; DFlash and
EAGLE-3 read the residual stream of a few layers spread over the depth as well (low: what the tokens
are, middle and high: where the sequence is heading). Wide features are laid out as
`[final-norm | layer a | layer b | ...]`, [..., H * (1 + n)]: the first H are what the EAGLE drafter and
the head read, so one buffer serves both (`RunningBatch.hidden_buf` is that slice).

Layer i's output is the residual stream after decoder layer i (Hugging Face's `hidden_states[i + 1]`);
the last layer is not allowed (its output is what the final norm reads).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel


def check_feature_layers(layers: Sequence[int], num_layers: int, field: str) -> tuple[int, ...]:
    """`layers` as a sorted tuple; ValueError naming `field` unless they are distinct ints in [0, num_layers - 1)."""
    out = tuple(sorted(int(i) for i in layers))
    if len(set(out)) != len(out) or any(not 0 <= i < num_layers - 1 for i in out):
        raise ValueError(
            f"{field}: {list(layers)} must be distinct decoder layer indices in [0, {num_layers - 2}] "
            f"(the target has {num_layers} layers; the last one's output is the final-norm state)"
        )
    return out


def feature_width(hidden_size: int, layers: Sequence[int]) -> int:
    """The width of wide features: H * (1 + len(layers))."""
    return hidden_size * (1 + len(layers))


@torch.no_grad()
def wide_features(
    policy: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layers: Sequence[int],
) -> torch.Tensor:
    """The target's wide features [B, T, H * (1 + len(layers))] for tokens [B, T] (a training batch's; the
    engine computes the same in every step, `tapped_decoder_forward`)."""
    out = policy.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=bool(layers))
    if not layers:
        return out.last_hidden_state
    return torch.cat([out.last_hidden_state, *(out.hidden_states[i + 1] for i in layers)], dim=-1)
