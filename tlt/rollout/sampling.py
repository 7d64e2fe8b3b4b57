"""Turning logits into tokens: temperature, top-p, seeded sampling, RL log-probs. Pure functions.

Shapes: logits [B, V] or [B, Q, V]; per-row settings (temperature, top_p) are [B] tensors and
broadcast over Q. Temperature 0 means greedy: its probabilities are one-hot at the argmax.
Sampling is inverse-CDF with one uniform per row and token, drawn from the row's own seeded
`torch.Generator` per generated position (`RunningBatch.uniforms_at`), so a request's tokens depend
only on its seed, never on which other rows share the batch or on how many tokens a step produced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """values [B] -> [B, 1, ...] broadcastable against like [B, ..., V]."""
    return values.to(like.dtype).view(values.shape[0], *([1] * (like.dim() - 1)))


def scale_logits(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [B, ..., V] / temperature [B] in float32 (float64 stays); temperature 0 counts as 1."""
    logits = logits.to(_compute_dtype(logits))
    t = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    return logits / _per_row(t, logits)


def top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p [B]; renormalise.

    probs [B, ..., V] -> [B, ..., V]. A token is kept when the mass of the tokens ranked above it
    is < top_p, so the most likely token is always kept.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = mass_above < _per_row(top_p, probs)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def process_logits(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution tokens are drawn from. logits [B, ..., V]; temperature, top_p [B].

    Returns probs [B, ..., V] (float32, or float64 for float64 logits): softmax(logits / T), then
    top-p (skipped when top_p is None); rows with temperature 0 are one-hot at the argmax.
    """
    return _finish_probs(logits, torch.softmax(scale_logits(logits, temperature), dim=-1), temperature, top_p)


def _finish_probs(
    logits: torch.Tensor, probs: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Top-p on softmax(logits / T) probs [B, ..., V], then one-hot argmax rows where T == 0."""
    if top_p is not None:
        probs = top_p_filter(probs, top_p)
    greedy = temperature == 0
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(_per_row(greedy, probs).bool(), one_hot, probs)
    return probs


def uniforms(generators: Sequence[torch.Generator], n: int, device: torch.device | str) -> torch.Tensor:
    """[B, n] uniforms in [0, 1), row b drawn from generators[b] (which live on `device`)."""
    return torch.stack([torch.rand(n, generator=g, device=device, dtype=torch.float64) for g in generators])


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling. probs [B, ..., V], u [B, ...] uniforms in [0, 1) -> tokens [B, ...] long.

    Picks the first token whose cumulative mass exceeds u * total, so a zero-probability token is
    never chosen.
    """
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T) at tokens, over the full vocabulary, before top-p (what RL needs).

    logits [B, ..., V], tokens [B, ...], temperature [B] (0 counts as 1) -> [B, ...] float32.
    """
    scaled = scale_logits(logits, temperature)
    picked = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return (picked - scaled.logsumexp(dim=-1)).float()


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor | None,
    u: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row (and position) and its log-prob. logits [B, ..., V] -> (tokens [B, ...] long,
    logprobs [B, ...] float32).

    u [B, ...]: the uniform of each token (greedy rows ignore it); None means every row is greedy, so
    every temperature is 0 and counts as 1: the log-probs are of softmax(logits), with no scaling pass.
    """
    if u is None:  # logits as scale_logits gives them at temperature 0, exactly
        logp = torch.log_softmax(logits.to(_compute_dtype(logits)), dim=-1)
        tokens = logits.argmax(dim=-1)
    else:
        logp = torch.log_softmax(scale_logits(logits, temperature), dim=-1)
        tokens = sample_from(_finish_probs(logits, logp.exp(), temperature, top_p), u)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float()
