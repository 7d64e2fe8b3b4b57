"""The GRPO policy update: recompute response log-probs under the policy, step the optimizer.

A batch holds B sequences as (prompt ids, response ids) pairs, the log-probs the policy gave
the response tokens at rollout time ("old" log-probs), one advantage per sequence and
optionally reference log-probs for the KL term. Sequences are right-padded: every real token
keeps its unpadded position and attends only to real tokens before it, so the log-probs
equal those of an unpadded forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from tlt.rl.grpo import behaviour_weights, grpo_loss
from tlt.rl.packing import forward_inputs, micro_batches
from tlt.spec.run import AlgorithmSpec


@dataclass
class RolloutBatch:
    """B sequences. old_logprobs / ref_logprobs [B, T] are aligned with `response_mask` [B, T].

    With tokens sampled by an older policy (partial rollouts): `stale` [B, T] bool marks them and
    `behaviour_logprobs` [B, T] holds every token's log-prob under the policy that sampled it; the update weights
    their terms by `tlt.rl.grpo.behaviour_weights`, truncated at `importance_cap`. None: every token on-policy."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    old_logprobs: torch.Tensor
    advantages: torch.Tensor  # [B]
    ref_logprobs: torch.Tensor | None = None
    behaviour_logprobs: torch.Tensor | None = None
    stale: torch.Tensor | None = None
    importance_cap: float = 2.0

    def __post_init__(self) -> None:
        count = len(self.prompt_ids)
        if len(self.response_ids) != count or self.advantages.shape != (count,):
            raise ValueError(
                f"batch sizes disagree: {count} prompts, {len(self.response_ids)} responses, "
                f"advantages {tuple(self.advantages.shape)}"
            )
        width = max((len(r) for r in self.response_ids), default=0)
        if (self.stale is None) != (self.behaviour_logprobs is None):
            raise ValueError("stale and behaviour_logprobs come together")
        for name in ("old_logprobs", "ref_logprobs", "behaviour_logprobs", "stale"):
            value = getattr(self, name)
            if value is not None and value.shape != (count, width):
                raise ValueError(f"{name} must be [B={count}, T={width}], got {tuple(value.shape)}")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def response_mask(self) -> torch.Tensor:
        """[B, T] 1 on real response tokens."""
        return response_mask(self.response_ids)

    def lengths(self) -> list[int]:
        """[B] prompt + response tokens of each sequence."""
        return [len(p) + len(r) for p, r in zip(self.prompt_ids, self.response_ids)]


def response_mask(response_ids: list[list[int]]) -> torch.Tensor:
    """[B, T] float mask, T the longest response: 1 on real response tokens, 0 on padding."""
    width = max((len(r) for r in response_ids), default=0)
    mask = torch.zeros((len(response_ids), width))
    for row, ids in enumerate(response_ids):
        mask[row, : len(ids)] = 1.0
    return mask


def response_logprobs(
    model: PreTrainedModel,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    *,
    pad_id: int = 0,
    temperature: float = 1.0,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each response token given its prompt and the response before it.

    Returns (logp [B, T], mask [B, T]) in float32 (float64 for a float64 model), T the longest
    response, left-aligned at the first response token, 0 where masked. Logits are divided by
    `temperature` (the rollout's sampling distribution). `packed` runs the B sequences as one
    row with restarting position ids instead of B right-padded rows (`tlt.rl.packing`); the
    result is the same. Gradients flow when enabled.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (e.g. bos)")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    device = next(model.parameters()).device
    inputs = forward_inputs(prompt_ids, response_ids, packed=packed, pad_id=pad_id)
    optional = {"attention_mask": inputs.attention_mask, "position_ids": inputs.position_ids}
    logits = model(
        input_ids=inputs.input_ids.to(device),
        use_cache=False,
        **{k: v.to(device) for k, v in optional.items() if v is not None},
    ).logits
    picked = logits.reshape(-1, logits.shape[-1])[inputs.flat_index.to(device)]  # [B, T, V]
    out_dtype = torch.float64 if picked.dtype == torch.float64 else torch.float32
    logp_all = torch.log_softmax(picked.to(out_dtype) / temperature, dim=-1)
    logp = torch.gather(logp_all, 2, inputs.targets.to(device).unsqueeze(-1)).squeeze(-1)
    mask = response_mask(response_ids).to(device=device, dtype=out_dtype)
    return logp * mask, mask


def policy_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    algo: AlgorithmSpec,
    *,
    pad_id: int = 0,
    max_grad_norm: float = 1.0,
    old_from_first_pass: bool = False,
    passes: list[tuple[list[int], float]] | None = None,
) -> dict[str, float]:
    """`algo.ppo_epochs` optimizer steps on the whole batch, micro-batched by `algo.micro_batch_size`
    sequences in the layout `algo.update_layout` (`tlt.rl.packing`).

    old_from_first_pass: the first epoch runs on the weights that sampled the batch (on-policy), so its
    own forward IS the old policy's: its log-probs, detached, are the old log-probs (ratio exactly 1 in
    that epoch) and later epochs reuse them; `batch.old_logprobs` is overwritten with them. This saves
    the separate forward that recomputes them (veRL's recompute pass) and gives the same update up to
    rounding. Without it, `batch.old_logprobs` is used as given. Tokens of an older policy (`batch.stale`) are
    trained against these old (proximal) log-probs with their behaviour weights (decoupled PPO).

    Micro-batch losses are normalised by the whole batch's token / sequence counts, so the
    accumulated gradient equals the gradient of one forward over the whole batch.
    Returns metrics averaged over epochs: loss, policy_loss, kl, clip_fraction, grad_norm.

    passes: the (rows, loss weight) forward-backward passes of each epoch, instead of every micro-batch at
    weight 1: a rank of a sharded policy runs its share of the rows (`tlt.workers.policy_group`), its
    gradient scaled to survive the group's averaging, and weight-0 passes that keep its collectives in step
    with the other ranks (they add nothing to the gradient or the metrics). Its metrics and the old
    log-probs it fills are then its share: the caller sums them over the ranks.
    """
    if algo.kl_coef > 0 and batch.ref_logprobs is None:
        raise ValueError("algorithm.klCoef > 0 needs ref_logprobs in the batch")
    temperature = algo.temperature if algo.temperature > 0 else 1.0
    full_mask = batch.response_mask()
    num_tokens = float(full_mask.sum().clamp(min=1.0))
    num_seqs = float(len(batch))
    sums = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
    if passes is None:
        passes = [(rows, 1.0) for rows in micro_batches(batch.lengths(), algo.micro_batch_size, algo.update_layout)]
    param_dtype = next(model.parameters()).dtype
    model.train()
    # the old log-probs: the batch's, or filled from epoch 0's forward (in the precision policy_logprobs keeps)
    old_logprobs = (
        torch.zeros(batch.old_logprobs.shape, dtype=torch.float64 if param_dtype == torch.float64 else torch.float32)
        if old_from_first_pass
        else batch.old_logprobs
    )
    for epoch in range(algo.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for rows, weight in passes:
            responses = [batch.response_ids[b] for b in rows]
            logp, mask = response_logprobs(
                model,
                [batch.prompt_ids[b] for b in rows],
                responses,
                pad_id=pad_id,
                temperature=temperature,
                packed=algo.update_layout == "packed",
            )
            width = logp.shape[1]
            if old_from_first_pass and epoch == 0 and weight:
                old_logprobs[rows, :width] = logp.detach().to(old_logprobs)
            old = old_logprobs[rows, :width].to(logp)
            ref = batch.ref_logprobs[rows, :width].to(logp) if batch.ref_logprobs is not None else None
            weights = None
            if batch.stale is not None and batch.behaviour_logprobs is not None:
                behav = batch.behaviour_logprobs[rows, :width].to(logp)
                weights = behaviour_weights(old, behav, batch.stale[rows, :width], cap=batch.importance_cap)
            terms = grpo_loss(
                logp,
                old,
                batch.advantages[rows].to(logp),
                mask,
                clip_low=algo.clip_ratio_low,
                clip_high=algo.clip_ratio_high,
                loss_agg=algo.loss_agg,
                kl_coef=algo.kl_coef,
                ref_logp=ref,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                weights=weights,
            )
            (terms.loss if weight == 1.0 else terms.loss * weight).backward()
            if not weight:
                continue
            share = float(mask.sum()) / num_tokens
            sums["loss"] += float(terms.loss.detach())
            sums["policy_loss"] += float(terms.policy_loss)
            sums["kl"] += float(terms.kl)
            sums["clip_fraction"] += float(terms.clip_fraction) * share
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        sums["grad_norm"] += float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # sharded: a DTensor
        optimizer.step()
    model.eval()
    if old_from_first_pass:
        batch.old_logprobs = old_logprobs
    return {name: value / algo.ppo_epochs for name, value in sums.items()}
