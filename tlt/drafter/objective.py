"""The drafter's training objective: input alignment, loss, a small optimiser loop, top-1 agreement.

Alignment (the part an off-by-one silently breaks): f[t] is the target's final-norm output at
position t, the state whose logits produced x[t+1]. Drafter position t reads (x[t+1], f[t]) and
regresses f[t+1]; its soft-CE target is softmax(head(f[t+1])), the target's distribution for x[t+2].
A position counts in the loss when its input token x[t+1] is a response token: that is exactly
where the drafter runs during rollout (the first draft reads the first response token).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from tlt.models.drafter import EagleDrafter

log = logging.getLogger(__name__)

SOFT_CE_WEIGHT = 0.1


class DrafterBatch(NamedTuple):
    """Aligned drafter training data, one row per sequence, T-1 positions (t = 0 .. T-2)."""

    input_ids: torch.Tensor  # [B, T-1]    x[t+1]
    features: torch.Tensor  # [B, T-1, F] f[t] (F = H, or wide features: `tlt.models.feature_layers`)
    target: torch.Tensor  # [B, T-1, F] f[t+1] (the losses read its final-norm part, the first H)
    position_ids: torch.Tensor  # [B, T-1]    t
    mask: torch.Tensor  # [B, T-1]    bool, x[t+1] is a response token


class DrafterLoss(NamedTuple):
    total: torch.Tensor  # scalar: regression + SOFT_CE_WEIGHT * soft_ce
    regression: torch.Tensor  # scalar: SmoothL1 on features, mean over H and masked positions
    soft_ce: torch.Tensor  # scalar: cross-entropy to the target's distribution, mean over masked positions


def drafter_inputs(
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> DrafterBatch:
    """Align a sequence batch for the drafter.

    tokens [B, T] are x[0..T-1]; hidden [B, T, H] are f[0..T-1] (final-norm outputs);
    mask [B, T] marks response tokens (all True when omitted); position_ids [B, T] default to 0..T-1.
    Returns a DrafterBatch of T-1 positions: (x[t+1], f[t]) -> f[t+1], masked by mask[t+1].
    """
    if tokens.shape != hidden.shape[:2]:
        raise ValueError(f"tokens {tuple(tokens.shape)} and hidden {tuple(hidden.shape)} must share [B, T]")
    if tokens.shape[1] < 2:
        raise ValueError(f"sequences need at least 2 tokens to align, got T={tokens.shape[1]}")
    if mask is None:
        mask = torch.ones_like(tokens, dtype=torch.bool)
    if position_ids is None:
        position_ids = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return DrafterBatch(
        input_ids=tokens[:, 1:],
        features=hidden[:, :-1],
        target=hidden[:, 1:],
        position_ids=position_ids[:, :-1],
        mask=mask[:, 1:].bool(),
    )


def drafter_loss(
    pred: torch.Tensor,
    pred_logits: torch.Tensor,
    target_feat: torch.Tensor,
    target_logits: torch.Tensor,
    mask: torch.Tensor,
) -> DrafterLoss:
    """EAGLE's loss on masked positions: SmoothL1(pred, target) + 0.1 * soft-CE.

    pred, target_feat [B, T, H]; pred_logits = head(pred), target_logits = head(target_feat) [B, T, V];
    mask [B, T] (bool). soft-CE = -sum_v softmax(target_logits) * log_softmax(pred_logits).
    """
    weight = mask.to(pred.dtype)
    count = weight.sum().clamp_min(1.0)
    target_feat = target_feat[..., : pred.shape[-1]]  # wide target features: their final-norm part
    regression = F.smooth_l1_loss(pred, target_feat.to(pred.dtype), reduction="none").mean(-1)  # [B, T]
    target_probs = torch.softmax(target_logits.float(), dim=-1)  # [B, T, V]
    soft_ce = -(target_probs * torch.log_softmax(pred_logits.float(), dim=-1)).sum(-1)  # [B, T]
    regression = (regression * weight).sum() / count
    soft_ce = (soft_ce.to(pred.dtype) * weight).sum() / count
    return DrafterLoss(total=regression + SOFT_CE_WEIGHT * soft_ce, regression=regression, soft_ce=soft_ce)


def batch_loss(drafter: EagleDrafter, batch: DrafterBatch) -> DrafterLoss:
    """Run the drafter on one aligned batch and score it against the target's features and head."""
    pred = drafter(batch.input_ids, batch.features, batch.position_ids)  # [B, T-1, H]
    with torch.no_grad():
        target_logits = drafter.logits(batch.target)  # [B, T-1, V]
    return drafter_loss(pred, drafter.logits(pred), batch.target, target_logits, batch.mask)


# Gradient clip of every drafter optimizer step (the hub's and the spot trainers').
MAX_GRAD_NORM = 1.0


def make_optimizer(drafter: EagleDrafter, lr: float) -> torch.optim.AdamW:
    """AdamW with betas (0.9, 0.95) and weight decay 0.01 over the drafter's own parameters."""
    return torch.optim.AdamW(drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)


def train_drafter_steps(
    drafter: EagleDrafter,
    batches: Sequence[DrafterBatch],
    steps: int,
    lr: float,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Plain training loop (tests, the bench drafter): `steps` optimiser steps cycling over `batches`; returns
    the losses. on_step(steps done, loss) after each step."""
    if not batches:
        raise ValueError("train_drafter_steps needs at least one batch")
    optimizer = make_optimizer(drafter, lr)
    drafter.train()
    losses: list[float] = []
    for step in range(steps):
        loss = batch_loss(drafter, batches[step % len(batches)])
        optimizer.zero_grad(set_to_none=True)
        loss.total.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), max_norm=1.0)
        optimizer.step()
        losses.append(loss.total.item())
        if on_step is not None:
            on_step(step + 1, losses[-1])
    drafter.eval()
    log.debug("drafter trained %d steps, loss %.4f -> %.4f", steps, losses[0], losses[-1])
    return losses


@torch.no_grad()
def top1_agreement(
    drafter: EagleDrafter, tokens: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor | None = None
) -> float:
    """Fraction of masked positions where argmax head(drafter) equals argmax head(f[t+1]).

    tokens [B, T], hidden [B, T, H] (the target's true final-norm outputs), mask [B, T] as in drafter_inputs.
    """
    batch = drafter_inputs(tokens, hidden, mask)
    pred = drafter(batch.input_ids, batch.features, batch.position_ids)
    agree = drafter.logits(pred).argmax(-1) == drafter.logits(batch.target).argmax(-1)  # [B, T-1]
    return (agree & batch.mask).sum().item() / max(batch.mask.sum().item(), 1)
