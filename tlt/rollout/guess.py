"""What an EAGLE chain drafts at each position: the drafter's argmax, or its coupled guess.

In a sampling batch the target's token at a position is the inverse-CDF draw of its processed
distribution p with that position's uniform (`tlt.rollout.verify`, coupled rule), and the uniform is
known before the target runs. The coupled guess is the drafter's own draw from q = softmax(logits / T)
with the same uniform: it equals the target's token whenever q's and p's CDF intervals around the
uniform pick the same token, which for q close to p is far likelier than p(argmax q), the argmax guess's
chance (p = q = (0.5, 0.5): 1 against 0.5); for a badly calibrated q it can be less likely. Either way a
draft is only a guess: verification alone decides what is emitted. Top-p is not applied to q.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tlt.rollout import sampling
from tlt.rollout.batch import RunningBatch

GUESSES = ("coupled", "argmax")


def coupled_guess(logits: Tensor, u: Tensor, temperature: Tensor) -> Tensor:
    """logits [B, V], u [B] (the uniform the target draws this position's token with), temperature [B]
    (0: a greedy row, which takes the argmax) -> guesses [B] long."""
    probs = torch.softmax(sampling.scale_logits(logits, temperature), dim=-1)
    return torch.where(temperature > 0, sampling.sample_from(probs, u), logits.argmax(dim=-1))


def guess_inputs(batch: RunningBatch, k: int) -> tuple[Tensor, Tensor]:
    """(u, temperature) [B, k] of a chain of k in a sampling batch: draft i + 1 is judged against the
    target's token at node i, drawn with the uniform of generated offset i (`RunningBatch.uniform_window`:
    the same read the verification takes)."""
    rows = len(batch.sequences)
    # a copy with row-major strides: a compiled chain's guards include them, and `.contiguous()` keeps a
    # one-row slice's stride (window width, not k)
    u = batch.uniform_window(k).clone(memory_format=torch.contiguous_format)
    return u, batch.temperature[:, None].expand(rows, k).contiguous()
