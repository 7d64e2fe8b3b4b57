"""The block drafter's training objective, from the EAGLE drafter's aligned data (`DrafterBatch`).

Alignment: a `DrafterBatch` position j holds x[j+1] (input_ids), f[j] (features) and f[j+1] (target).
A block anchored there reads (x[j+1], f[j]), what the rollout reads at a row with L = j + 1 committed
positions, and its output i (0-based) regresses f[j+1+i] = target[j+i], whose head gives the token
after x[j+1+i]: draft i + 1. Anchors are the EAGLE loss's positions (mask[j]: x[j+1] a response token);
output i counts where target[j+i] is a trained position of the same sequence (the same packed segment,
not past the row). Loss: EAGLE's (`drafter_loss`: SmoothL1 + 0.1 soft-CE), over anchors x block offsets.

`BlockTraining` is the warm start's loop (AdamW as EAGLE's, `make_optimizer`, grad clip 1.0) with its
optimizer step count and AdamW moments in `state_dict`, so a run stopped after any step and resumed from
its checkpoint takes exactly the steps an unbroken run would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from tlt.drafter.objective import (
    MAX_GRAD_NORM,
    DrafterBatch,
    DrafterLoss,
    drafter_loss,
    make_optimizer,
)
from tlt.models.block_drafter import BlockDrafter

log = logging.getLogger(__name__)

STATE_FILE = "block-training.pt"


class BlockBatch(NamedTuple):
    """N anchors of blocks of k: what the block drafter reads and what its k outputs regress."""

    input_ids: torch.Tensor  # [N]       x[j+1]
    features: torch.Tensor  # [N, F]     f[j] (F = H, or the wide features of `tlt.models.feature_layers`)
    target: torch.Tensor  # [N, k, F]    f[j+1 .. j+k] (the loss reads their final-norm part, the first H)
    weight: torch.Tensor  # [N, k]       bool, output i counts in the loss


def block_batch(batch: DrafterBatch, k: int, segments: Sequence[int] | None = None) -> BlockBatch:
    """Blocks of k anchored at every trained position of `batch` ([S, T] rows). segments: the lengths of
    the sequences packed into one row (S = 1, sum T), so that no block reaches into the next sequence."""
    rows, width = batch.input_ids.shape
    device = batch.input_ids.device
    if segments is None:
        seg = torch.zeros(rows, width, dtype=torch.long, device=device)  # [S, T] one sequence per row
    else:
        if rows != 1 or sum(segments) != width:
            raise ValueError(
                f"segments {list(segments)} must cover one packed row of {width} positions, got {rows} rows"
            )
        seg = torch.repeat_interleave(
            torch.arange(len(segments), device=device), torch.tensor(list(segments), device=device)
        )[None]  # [1, T]
    s, j = batch.mask.nonzero(as_tuple=True)  # [N] anchors
    idx = j[:, None] + torch.arange(k, device=device)[None, :]  # [N, k] target[j + i]
    inside = idx < width
    idx = idx.clamp_max(width - 1)
    weight = inside & batch.mask[s[:, None], idx] & (seg[s[:, None], idx] == seg[s, j][:, None])
    return BlockBatch(batch.input_ids[s, j], batch.features[s, j], batch.target[s[:, None], idx], weight)


def every_kth_anchor(batch: BlockBatch, k: int) -> BlockBatch:
    """Every k-th anchor of `batch` (the first, the (k+1)-th, ...): with blocks of k, non-overlapping blocks, so
    each position of a sequence is predicted once, at one offset, where every anchor predicts it k times."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return BlockBatch(*(t[::k] for t in batch))


def block_loss(drafter: BlockDrafter, batch: BlockBatch) -> DrafterLoss:
    """EAGLE's loss of the drafter's k outputs per anchor against the target's features and head."""
    k = batch.target.shape[1]
    pred = drafter(batch.input_ids, batch.features, k)  # [N, k, H]
    with torch.no_grad():
        target_logits = drafter.logits(batch.target)  # [N, k, V]
    return drafter_loss(pred, drafter.logits(pred), batch.target, target_logits, batch.weight)


@torch.no_grad()
def block_agreement_counts(drafter: BlockDrafter, batch: BlockBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block offset i: (counted outputs whose argmax equals the target's (argmax head(f[j+1+i])),
    counted outputs), each [k] long."""
    pred = drafter(batch.input_ids, batch.features, batch.target.shape[1])
    agree = (drafter.logits(pred).argmax(-1) == drafter.logits(batch.target).argmax(-1)) & batch.weight  # [N, k]
    return agree.sum(0), batch.weight.sum(0)


def block_agreement(drafter: BlockDrafter, batch: BlockBatch) -> list[float]:
    """Per block offset i: the share of counted outputs whose argmax equals the target's; len k. Offset 0
    is the EAGLE drafter's top-1 agreement's counterpart."""
    agree, total = block_agreement_counts(drafter, batch)
    return (agree / total.clamp_min(1)).tolist()


class BlockTraining:
    """The block drafter's optimizer loop over a fixed list of batches, resumable exactly."""

    def __init__(self, drafter: BlockDrafter, batches: Sequence[BlockBatch], lr: float) -> None:
        if not batches:
            raise ValueError("block drafter training needs at least one batch")
        self.drafter, self.batches = drafter, list(batches)
        self.optimizer = make_optimizer(drafter, lr)
        self.step = 0

    def train(self, steps: int, on_step: Callable[[int, float], None] | None = None) -> list[float]:
        """`steps` optimizer steps, batch `step % len(batches)` each; returns the losses. on_step(steps done
        in this call, loss) after each step."""
        self.drafter.train()
        losses = []
        for _ in range(steps):
            loss = block_loss(self.drafter, self.batches[self.step % len(self.batches)])
            self.optimizer.zero_grad(set_to_none=True)
            loss.total.backward()
            torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), MAX_GRAD_NORM)
            self.optimizer.step()
            self.step += 1
            losses.append(loss.total.item())
            if on_step is not None:
                on_step(len(losses), losses[-1])
        self.drafter.eval()
        return losses

    def state_dict(self) -> dict[str, Any]:
        """The drafter's own parameters, the AdamW state and the step count."""
        return {
            "drafter": {k: v.detach().clone() for k, v in self.drafter.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])

    def save(self, folder: str | Path) -> Path:
        """Write `state_dict` to folder/STATE_FILE; returns its path."""
        path = Path(folder) / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path)
        return path

    def resume(self, folder: str | Path) -> None:
        """Continue from `save`'s file in `folder` (FileNotFoundError naming it when absent)."""
        path = Path(folder) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no block drafter training state at {path}; write it with BlockTraining.save")
        self.load_state_dict(torch.load(path, map_location=self.drafter.device, weights_only=True))
        log.info("block drafter training resumed at step %d from %s", self.step, path)
