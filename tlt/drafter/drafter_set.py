"""The drafters a run learns, and how a run with block arms holds them.

A run learns ONE drafter per kind its usable arms draft with (`tlt.spec.plan.learned_drafters`):
- the EAGLE drafter when some chain, tree or mixed arm is usable;
- the block drafter when some block arm is usable, with block size = the largest block arm's depth
  (attention is causal inside the block, so its first k outputs are a block of k: one drafter serves
  every block arm).
A run with block arms holds them together as a `DrafterSet` (children `eagle` and / or `block`), one
module with one parameter dict ("eagle.*", "block.*"): the hub, the spot trainers' deltas, the served /
candidate drafters, snapshots and whole-run checkpoints all move that one dict, so the block drafter rides
every path the EAGLE drafter already has (version = optimizer steps on the set). A run without block arms
keeps the plain `EagleDrafter` and its unprefixed parameters (older checkpoints and exports unchanged).

The block drafter reads the target's final-norm state and the outputs of `spread_layers` of its decoder
layers (DFlash's choice; `tlt.models.feature_layers`): the rollout engines of such a run keep those wide
features, the buffers carry them, and the EAGLE member reads their final-norm part.

Both members train from the same online buffer (tokens + the target's features): one optimizer
step on a packed row takes the sum of the members' losses (EAGLE's `packed_loss`, the block drafter's
`block_loss` over `block_batch` of the row, anchors never crossing a packed sequence's end).

Publish (`drafter.publish: validated`) scores a set by its summed agreement counts on the step's fresh
rollouts: the EAGLE member's top-1 agreement positions plus, for the block member, every counted output of
the non-overlapping blocks (anchored at every k-th position) whose argmax equals the target's
(`block_agreement_counts`, all offsets summed). The candidate is
served when that share is at least the served set's (`tlt.drafter.publish.promote`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel

from tlt.drafter.block_objective import (
    BlockBatch,
    block_agreement_counts,
    block_batch,
    block_loss,
    every_kth_anchor,
)
from tlt.drafter.buffer import PackedBatch
from tlt.models.block_drafter import BlockDrafter
from tlt.models.draft_vocab import DraftVocab
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.spec.plan import LearnedDrafters

BLOCK_SNAPSHOTS = "block"  # the block drafter's folder beside the EAGLE drafter's (snapshots, the served drafter)
BLOCK_LAYERS = 1  # the decoder layers of a run's block drafter


class DrafterSet(nn.Module):
    """The EAGLE drafter (`eagle`, or None) and the block drafter (`block`) of a run with block arms."""

    def __init__(self, eagle: EagleDrafter | None, block: BlockDrafter) -> None:
        super().__init__()
        self.eagle = eagle
        self.block = block

    @property
    def device(self) -> torch.device:
        return self.block.device

    def bind_policy(self, policy: PreTrainedModel) -> None:
        for member in self.members():
            member.bind_policy(policy)

    def members(self) -> list[EagleDrafter | BlockDrafter]:
        return [m for m in (self.eagle, self.block) if m is not None]

    def set_draft_vocab(self, size: int) -> DraftVocab | None:
        """Every member drafts from the same reduced vocabulary of `size` tokens (0: the whole one)."""
        first, *rest = self.members()
        vocab = first.set_draft_vocab(size)
        for member in rest:
            member.share_draft_vocab(vocab)
        return vocab


def new_drafter_set(policy: PreTrainedModel, learned: LearnedDrafters) -> DrafterSet:
    """A fresh set for `learned` (block_size > 0) on the policy's device in float32, bound to its embedding
    and head."""
    drafters = unbound_drafter_set(drafter_config_from_target(policy.config), learned)
    drafters.to(device=policy.device, dtype=torch.float32).bind_policy(policy)
    return drafters.eval()


def unbound_drafter_set(config: LlamaConfig, learned: LearnedDrafters) -> DrafterSet:
    """A fresh, unbound set for `learned` from the EAGLE drafter's config (`drafter_config_from_target`):
    what the hub holds (it never binds an embedding or head)."""
    if learned.block_size < 1:
        raise ValueError("a drafter set holds a block drafter: learned.block_size must be >= 1")
    block = copy.deepcopy(config)
    block.num_hidden_layers, block.block_size = BLOCK_LAYERS, learned.block_size
    block.feature_layers = list(learned.feature_layers)
    return DrafterSet(EagleDrafter(config) if learned.eagle else None, BlockDrafter(block))


def member_params(params: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """A drafter's parameter dict by member: {"eagle": ..., "block": ...} of a `DrafterSet`'s ("eagle.*",
    "block.*", prefixes dropped; either may be absent); {"eagle": params} of a plain EAGLE drafter's."""
    if not any(k.startswith(("block.", "eagle.")) for k in params):
        return {"eagle": params}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in params.items():
        member, _, name = key.partition(".")
        out.setdefault(member, {})[name] = value
    return out


def packed_block_batch(packed: PackedBatch, k: int) -> BlockBatch:
    """`block_batch` of one packed row: blocks of k anchored at its trained positions, none crossing into
    the next packed sequence."""
    return block_batch(packed.batch, k, segments=packed.segments)


def packed_block_loss(block: BlockDrafter, packed: PackedBatch) -> torch.Tensor:
    """The block drafter's loss (a scalar with its graph) on one packed row, blocks of its block size."""
    return block_loss(block, packed_block_batch(packed.to(block.device), block.block_size)).total


def packed_block_agreement(block: BlockDrafter, packs: list[PackedBatch]) -> tuple[int, int]:
    """(block outputs whose argmax equals the target's, block outputs counted) over `packs`, every offset, of
    the non-overlapping blocks (`every_kth_anchor`: a block drafts from one anchor, then from past the block, as
    in decoding). Scoring every anchor would cost k times the forwards; on a worker that bookkeeping outlasted
    the policy update and the step waited for it."""
    agree = total = 0
    for packed in packs:
        blocks = packed_block_batch(packed.to(block.device), block.block_size)
        same, counted = block_agreement_counts(block, every_kth_anchor(blocks, block.block_size))
        agree, total = agree + int(same.sum()), total + int(counted.sum())
    return agree, total
