"""The block drafter: k draft tokens in ONE forward (DFlash-style block drafting).

An EAGLE chain of depth k runs the drafter k times, one token after the other; where a drafter step
costs a noticeable share of a target step (~0.13 on a CPU, where the target is overhead-bound), a
chain of 3 pays ~0.4 of a step before it verifies anything. The block drafter fills a block of k
masked positions at once. For a row with L committed positions and newest token x[L] (the target's
f[L-1] produced it), its input is k + 1 vectors:

    anchor = fc(cat(embed(x[L]), f[L-1]))              # EAGLE's fusion of token and target feature
    block  = [anchor, mask[0], ..., mask[k-1]]         # mask: k learned embeddings, one per offset
    h      = layers(block)                             # causal within the block, RoPE positions 0..k
    out[i] = h[1 + i]  predicts f[L + i]               # draft i + 1 = argmax head(out[i]) ~ x[L + 1 + i]

Attention is causal inside the block, so the first k outputs of a block of K > k are exactly a block
of k: one trained drafter serves every arm depth up to `block_size`. The block holds no KV cache and
no history past the anchor: the target's feature f[L-1] carries the context. The features are the
target's final-norm states, the ones the engine keeps for EAGLE (`RunningBatch.hidden_buf`); DFlash
reads several of the target's layers, which would need the engine to keep them too.

Shares with the EAGLE drafter (`BoundDrafter`): fc, Llama decoder layers (first input norm identity, no
final norm: the outputs are regressed onto f and go straight into the policy's head), the bound
embedding and head (never saved), the reduced draft vocabulary. Saved with `save_drafter`; the config
records `block_size` and `num_hidden_layers`.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel

from tlt.models.drafter import (
    BoundDrafter,
    causal_mask,
    drafter_config_from_target,
    load_saved,
)

MAX_BLOCK = 8  # block arms draft 2 .. MAX_BLOCK tokens (`speculative.arms[].depth` of kind block)


def block_config_from_target(
    target_config: PretrainedConfig, block_size: int = MAX_BLOCK, num_layers: int = 1
) -> LlamaConfig:
    """The EAGLE drafter's config (`drafter_config_from_target`) with `block_size` mask offsets and
    `num_layers` decoder layers (1 or 2)."""
    if not 1 <= block_size <= MAX_BLOCK:
        raise ValueError(f"block drafter block_size must be in [1, {MAX_BLOCK}], got {block_size}")
    if num_layers not in (1, 2):
        raise ValueError(f"block drafter num_layers must be 1 or 2, got {num_layers}")
    config = drafter_config_from_target(target_config)
    config.num_hidden_layers = num_layers
    config.block_size = block_size
    return config


class BlockDrafter(BoundDrafter):
    """fc (2H -> H) anchor + `block_size` learned mask embeddings + 1-2 Llama decoder layers, causal
    within the block; the policy's embedding and head bound, never saved."""

    def __init__(self, config: LlamaConfig) -> None:
        if not hasattr(config, "block_size"):
            raise ValueError("a block drafter config needs block_size: build it with block_config_from_target")
        super().__init__(config, num_layers=config.num_hidden_layers)
        self.mask = nn.Parameter(torch.randn(config.block_size, config.hidden_size) * config.initializer_range)

    @property
    def block_size(self) -> int:
        return self.mask.shape[0]

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, k: int) -> torch.Tensor:
        """tokens [N] (x[L], each row's newest token), features [N, H] (f[L-1], the target state that
        produced it) -> predicted features f[L .. L + k - 1] [N, k, H]; 1 <= k <= block_size."""
        if not 1 <= k <= self.block_size:
            raise ValueError(f"block of {k} drafts; this drafter drafts 1 .. {self.block_size}")
        embed, _ = self._require_bound()
        dtype = self.fc.weight.dtype
        n = tokens.shape[0]
        token = F.embedding(tokens, embed.weight.detach()).to(dtype)  # [N, H]
        anchor = self.fc(torch.cat([token, features.to(dtype)], dim=-1))  # [N, H]
        x = torch.cat([anchor[:, None], self.mask[:k].expand(n, k, -1)], dim=1)  # [N, k + 1, H]
        positions = torch.arange(k + 1, device=x.device).expand(n, k + 1)  # [N, k + 1]
        rope = self._rotary[0](x, positions)  # cos, sin: [N, k + 1, head_dim]
        mask = causal_mask(k + 1, x.device)  # [1, 1, k + 1, k + 1]
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
        return x[:, 1:]  # [N, k, H]


def new_block_drafter(policy: PreTrainedModel, block_size: int = MAX_BLOCK, num_layers: int = 1) -> BlockDrafter:
    """A freshly initialised block drafter on the policy's device and dtype, bound to its embedding and head."""
    drafter = BlockDrafter(block_config_from_target(policy.config, block_size, num_layers))
    drafter.to(device=policy.device, dtype=policy.dtype)
    drafter.bind_policy(policy)
    return drafter


def load_block_drafter(path: str | Path, target: PretrainedConfig | PreTrainedModel) -> BlockDrafter:
    """Load a block drafter written by `save_drafter` (bound to the target when a model is given); a folder
    without `block_size` in its config.json (an EAGLE drafter's) is refused."""

    def build(config: LlamaConfig, saved: dict) -> BlockDrafter:
        if "block_size" not in saved:
            raise ValueError(f"{path}: config.json has no block_size: an EAGLE drafter's folder, not a block drafter's")
        block = copy.deepcopy(config)
        block.num_hidden_layers, block.block_size = int(saved.get("num_hidden_layers", 1)), int(saved["block_size"])
        return BlockDrafter(block)

    drafter = load_saved(path, target, build)
    assert isinstance(drafter, BlockDrafter)
    return drafter
