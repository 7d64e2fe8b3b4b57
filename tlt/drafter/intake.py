"""A rollout's samples entering a drafter trainer: buffered for training, and the top-1 agreement of the
drafter(s) on them scored first (the served drafter's, and a candidate's under `drafter.publish:
validated`). Runs where the trainer lives: a rollout worker (after its results returned) or a sidecar."""

from __future__ import annotations

from typing import Any

import torch

from tlt.drafter.buffer import OnlineBuffer, pack
from tlt.drafter.trainer import SpotTrainer, packed_agreement


def buffer_and_agreement(
    buffer: OnlineBuffer,
    trainer: SpotTrainer,
    completions: list[Any],
    step: int,
    row_tokens: int,
    candidate: tuple[int, dict[str, torch.Tensor]] | None = None,
) -> dict[str, Any]:
    """Add `step`'s completions to `buffer`; the top-1 agreement on those fresh samples of the trainer's
    drafter (the one the rollout drafted with) and, given a `candidate` (version, parameters), of the
    candidate, which the trainer then holds (it trains on from there)."""
    buffer.add(completions, step)
    packs = pack([s for s in buffer.samples if s.step == step], row_tokens)
    agree, total = packed_agreement(trainer.drafter, packs)
    out = {"agree": agree, "agree_total": total, "buffer_positions": buffer.num_trainable}
    if candidate is not None:
        trainer.load(*candidate)
        out["candidate_agree"], out["candidate_total"] = packed_agreement(trainer.drafter, packs)
        out["candidate_version"] = candidate[0]
    return out


def policy_head(model: Any) -> dict[str, torch.Tensor]:
    """The policy's input embedding [V, H] and LM head [V, H] (and bias [V], if any): all a drafter
    needs of the policy (`EagleDrafter.bind`)."""
    head = model.get_output_embeddings()
    out = {"embed": model.get_input_embeddings().weight.detach(), "head": head.weight.detach()}
    if head.bias is not None:
        out["head_bias"] = head.bias.detach()
    return out
