"""GRPO as pure tensor functions: group advantages, clipped surrogate, k3 KL, loss aggregation.

Shapes: P prompts, G responses per prompt (the group), B = P*G sequences, T response tokens
(padded). `mask` [B, T] is 1 on real response tokens, 0 on padding. Every function is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
LOSS_AGGS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def group_advantages(rewards: torch.Tensor, *, eps: float = 1e-6, normalize_std: bool = True) -> torch.Tensor:
    """Group-normalised advantages.

    rewards [P, G] -> advantages [P, G] = (r - mean_g r) / (std_g r + eps), std unbiased over
    the group; with `normalize_std=False` only the mean is removed (r - mean_g r). A group whose
    rewards are all equal gets advantage 0.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [P, G] with G >= 2, got shape {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not normalize_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate loss per token, with separate clip range below and above 1.

    logp, old_logp [B, T]; advantages [B] (one per sequence) or [B, T].
    ratio = exp(logp - old_logp); loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A).
    Returns (loss [B, T], clipped [B, T] bool: where the clipped branch was taken).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = torch.exp(logp - old_logp)
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return torch.maximum(unclipped, clipped), clipped > unclipped


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(policy || reference) per token: exp(ref - logp) - (ref - logp) - 1 >= 0.

    logp, ref_logp [B, T] -> [B, T] (log-probs of the sampled tokens under policy / reference).
    """
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce per-token losses [B, T] under `mask` [B, T] to a scalar.

    token-mean:          sum(loss * mask) / num_tokens
    seq-mean-token-mean: sum_b(sum_t(loss * mask) / len_b) / num_seqs
    seq-mean-token-sum:  sum_b(sum_t(loss * mask)) / num_seqs
    `num_tokens` / `num_seqs` default to this batch's counts; pass the whole batch's counts
    when summing micro-batch losses, so their sum equals the loss of the whole batch.
    """
    mask = mask.to(loss.dtype)
    per_seq = (loss * mask).sum(dim=1)
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1.0)
        return per_seq.sum() / denom
    seqs = num_seqs if num_seqs is not None else loss.shape[0]
    if mode == "seq-mean-token-mean":
        return (per_seq / mask.sum(dim=1).clamp(min=1.0)).sum() / seqs
    if mode == "seq-mean-token-sum":
        return per_seq.sum() / seqs
    raise ValueError(f"loss_agg must be one of {list(LOSS_AGGS)}, got {mode!r}")


def behaviour_weights(
    prox_logp: torch.Tensor, behav_logp: torch.Tensor, stale: torch.Tensor, *, cap: float
) -> torch.Tensor:
    """Decoupled PPO's behaviour weight of each token (Hilton et al. 2021, as AReaL's asynchronous RL uses it):
    a token sampled by an older policy (`stale`) is trained against the proximal policy `prox_logp` (the weights
    the update starts from) in the clipped surrogate, its term scaled by pi_prox / pi_behaviour, truncated at
    `cap` (truncated importance sampling); 1 for tokens the proximal policy sampled itself.

    prox_logp, behav_logp, stale [B, T] -> weights [B, T], detached (a constant of the loss).
    """
    ratio = torch.exp((prox_logp - behav_logp).double()).clamp(max=cap).to(prox_logp.dtype)
    return torch.where(stale.bool(), ratio, torch.ones_like(ratio)).detach()


@dataclass(frozen=True)
class LossTerms:
    loss: torch.Tensor  # scalar, differentiable
    policy_loss: torch.Tensor  # scalar
    kl: torch.Tensor  # scalar (0 when no reference)
    clip_fraction: torch.Tensor  # scalar: fraction of real tokens clipped


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    weights: torch.Tensor | None = None,
) -> LossTerms:
    """Clipped surrogate plus `kl_coef` * k3 KL, both aggregated by `loss_agg`.

    logp, old_logp, mask, ref_logp [B, T]; advantages [B] or [B, T]. `weights` [B, T] (constants) scale each
    token's surrogate: the behaviour weights of off-policy tokens (`behaviour_weights`); None: 1 everywhere.
    """
    per_token, clipped = clipped_surrogate(logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high)
    if weights is not None:
        per_token = per_token * weights.to(per_token)
    counts = {"num_tokens": num_tokens, "num_seqs": num_seqs}
    policy_loss = aggregate(per_token, mask, loss_agg, **counts)
    kl = torch.zeros((), dtype=policy_loss.dtype)
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (reference log-probs)")
        kl = aggregate(kl_k3(logp, ref_logp), mask, loss_agg, **counts)
    fmask = mask.to(per_token.dtype)
    clip_fraction = (clipped.to(per_token.dtype) * fmask).sum() / fmask.sum().clamp(min=1.0)
    return LossTerms(policy_loss + kl_coef * kl, policy_loss.detach(), kl.detach(), clip_fraction.detach())
