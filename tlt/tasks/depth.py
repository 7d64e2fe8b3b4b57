"""Is every layer of a deep policy used? Held-out loss with each decoder layer skipped in turn.

A deep model whose layers are near-identity has a real model's cost but a shallow model's
predictability, and would flatter speculative decoding. Skipping layer i (its residual branch
removed: the layer's input passes straight through) and measuring the held-out loss shows what each
layer contributes: a layer that carries computation raises the loss clearly when skipped.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel


class _Skip(nn.Module):
    """Stands in for a decoder layer: returns its hidden-state input unchanged."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden_states


@torch.no_grad()
def heldout_loss(model: PreTrainedModel, batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> float:
    """Mean token loss over batches of (input_ids [B, T], attention_mask [B, T], labels [B, T], -100 ignored)."""
    total, count = 0.0, 0
    for input_ids, mask, labels in batches:
        logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
        )
        total += float(loss)
        count += int((target != -100).sum())
    if count == 0:
        raise ValueError("batches hold no labelled tokens")
    return total / count


@torch.no_grad()
def layer_skip_losses(model: PreTrainedModel, batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict:
    """{"full": loss, "skipped": [loss with layer i skipped, for each i]} on held-out batches.

    The model is restored (every layer back in place) before returning, also on error.
    """
    layers = model.model.layers
    full = heldout_loss(model, batches)
    skipped = []
    for i in range(len(layers)):
        original = layers[i]
        layers[i] = _Skip()
        try:
            skipped.append(heldout_loss(model, batches))
        finally:
            layers[i] = original
    return {"full": full, "skipped": skipped}
