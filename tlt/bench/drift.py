"""How far the policy has moved: held-out KL(step 0 || step t) over the step-0 policy's own samples.

KL(pi_0 || pi_t) is measured per response position with the full next-token distributions (no
sampling noise from the policy being measured): positions come from responses the step-0 policy
sampled once, on held-out prompts, and stay fixed for the whole run, so every step is compared on
the same tokens. The mean is over response positions (tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel


@torch.inference_mode()
def policy_kl(
    reference: PreTrainedModel,
    policy: PreTrainedModel,
    input_ids: Tensor,
    attention: Tensor,
    positions: Tensor,
    temperature: float = 1.0,
) -> float:
    """Mean over `positions` of KL(reference || policy) of the next-token distributions (nats / token).

    input_ids: [B, L] right-padded sequences; attention: [B, L] 1 on real tokens; positions: [B, L] bool,
    True where the distribution of the NEXT token counts (a response token follows). temperature
    scales both models' logits as sampling does (0 is read as 1).
    """
    if input_ids.shape != attention.shape or input_ids.shape != positions.shape:
        raise ValueError(
            f"input_ids, attention and positions must have one shape, got {tuple(input_ids.shape)}, "
            f"{tuple(attention.shape)}, {tuple(positions.shape)}"
        )
    if not bool(positions.any()):
        raise ValueError("positions selects no token: nothing to compare")
    t = temperature if temperature > 0 else 1.0
    ref = F.log_softmax(reference(input_ids=input_ids, attention_mask=attention).logits.double() / t, dim=-1)
    cur = F.log_softmax(policy(input_ids=input_ids, attention_mask=attention).logits.double() / t, dim=-1)
    kl = (ref.exp() * (ref - cur)).sum(-1)  # [B, L]
    return float(kl[positions].mean())


def response_batch(sequences: list[tuple[list[int], list[int]]]) -> tuple[Tensor, Tensor, Tensor]:
    """(prompt ids, response ids) pairs as (input_ids, attention, positions) for `policy_kl`: position
    t counts when token t + 1 is a response token."""
    width = max(len(p) + len(r) for p, r in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    attention = torch.zeros(len(sequences), width, dtype=torch.long)
    positions = torch.zeros(len(sequences), width, dtype=torch.bool)
    for b, (prompt, response) in enumerate(sequences):
        n = len(prompt) + len(response)
        ids[b, :n] = torch.tensor(prompt + response)
        attention[b, :n] = 1
        positions[b, len(prompt) - 1 : n - 1] = True
    return ids, attention, positions
