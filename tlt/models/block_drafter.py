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
no history past the anchor: the target's feature f[L-1] carries the context. f is the target's
final-norm state (what the engine keeps for EAGLE), or with `feature_layers` (DFlash's choice) the wide
features `[final-norm | layer a | ...]` an engine built with the same layers keeps
(`tlt.models.feature_layers`): each chosen layer's residual stream goes through an RMSNorm of its own
before the fc. The outputs still regress the final-norm f (the head's input).

Shares with the EAGLE drafter (`BoundDrafter`): fc, Llama decoder layers (first input norm identity, no
final norm: the outputs are regressed onto f and go straight into the policy's head), the bound
embedding and head (never saved), the reduced draft vocabulary. Saved with `save_drafter`; the config
records `block_size`, `num_hidden_layers` and `feature_layers`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from tlt.models.drafter import (
    BoundDrafter,
    causal_mask,
    drafter_config_from_target,
    load_saved,
)
from tlt.models.feature_layers import check_feature_layers, feature_width

MAX_BLOCK = 8  # block arms draft 2 .. MAX_BLOCK tokens (`speculative.arms[].depth` of kind block)


def block_config_from_target(
    target_config: PretrainedConfig,
    block_size: int = MAX_BLOCK,
    num_layers: int = 1,
    feature_layers: Sequence[int] = (),
) -> LlamaConfig:
    """The EAGLE drafter's config (`drafter_config_from_target`) with `block_size` mask offsets,
    `num_layers` decoder layers (1 or 2) and the target's `feature_layers` it reads (none: the final-norm
    state alone)."""
    if not 1 <= block_size <= MAX_BLOCK:
        raise ValueError(f"block drafter block_size must be in [1, {MAX_BLOCK}], got {block_size}")
    if num_layers not in (1, 2):
        raise ValueError(f"block drafter num_layers must be 1 or 2, got {num_layers}")
    config = drafter_config_from_target(target_config)
    config.num_hidden_layers = num_layers
    config.block_size = block_size
    config.feature_layers = list(
        check_feature_layers(feature_layers, target_config.num_hidden_layers, "block drafter feature_layers")
    )
    return config


class BlockDrafter(BoundDrafter):
    """fc ((2 + n)H -> H) anchor + `block_size` learned mask embeddings + 1-2 Llama decoder layers, causal
    within the block; n = len(feature_layers), one RMSNorm per feature layer; the policy's embedding and
    head bound, never saved."""

    def __init__(self, config: LlamaConfig) -> None:
        if not hasattr(config, "block_size"):
            raise ValueError("a block drafter config needs block_size: build it with block_config_from_target")
        super().__init__(config, num_layers=config.num_hidden_layers)
        hidden, taps = config.hidden_size, len(getattr(config, "feature_layers", None) or ())
        self.mask = nn.Parameter(torch.randn(config.block_size, hidden) * config.initializer_range)
        if taps:
            self.fc = nn.Linear((2 + taps) * hidden, hidden, bias=False)
            self.layer_norms = nn.ModuleList([LlamaRMSNorm(hidden, eps=config.rms_norm_eps) for _ in range(taps)])

    @property
    def block_size(self) -> int:
        return self.mask.shape[0]

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target's decoder layers whose outputs the features carry after the final-norm state."""
        return tuple(getattr(self.config, "feature_layers", None) or ())

    @property
    def feature_size(self) -> int:
        """The width of the features it reads: H * (1 + len(feature_layers))."""
        return feature_width(self.config.hidden_size, self.feature_layers)

    def _fused_features(self, features: Tensor) -> Tensor:
        """features [N, F] -> [N, F]: each feature layer's part through its own RMSNorm."""
        if not self.feature_layers:
            return features
        parts = features.split(self.config.hidden_size, dim=-1)
        return torch.cat([parts[0], *(norm(p) for norm, p in zip(self.layer_norms, parts[1:]))], dim=-1)

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, k: int) -> torch.Tensor:
        """tokens [N] (x[L], each row's newest token), features [N, F] (f[L-1], the target state that
        produced it; F = `feature_size`) -> predicted final-norm features f[L .. L + k - 1] [N, k, H];
        1 <= k <= block_size."""
        if not 1 <= k <= self.block_size:
            raise ValueError(f"block of {k} drafts; this drafter drafts 1 .. {self.block_size}")
        embed, _ = self._require_bound()
        dtype = self.fc.weight.dtype
        n = tokens.shape[0]
        token = F.embedding(tokens, embed.weight.detach()).to(dtype)  # [N, H]
        if features.shape[-1] != self.feature_size:
            raise ValueError(
                f"features have width {features.shape[-1]}; this block drafter reads {self.feature_size} "
                f"(final-norm state + feature_layers {list(self.feature_layers)}): build the Engine with "
                "feature_layers=drafter.feature_layers"
            )
        anchor = self.fc(torch.cat([token, self._fused_features(features.to(dtype))], dim=-1))  # [N, H]
        x = torch.cat([anchor[:, None], self.mask[:k].expand(n, k, -1)], dim=1)  # [N, k + 1, H]
        positions = torch.arange(k + 1, device=x.device).expand(n, k + 1)  # [N, k + 1]
        rope = self._rotary[0](x, positions)  # cos, sin: [N, k + 1, head_dim]
        mask = causal_mask(k + 1, x.device)  # [1, 1, k + 1, k + 1]
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
        return x[:, 1:]  # [N, k, H]


def new_block_drafter(
    policy: PreTrainedModel, block_size: int = MAX_BLOCK, num_layers: int = 1, feature_layers: Sequence[int] = ()
) -> BlockDrafter:
    """A freshly initialised block drafter on the policy's device and dtype, bound to its embedding and head."""
    drafter = BlockDrafter(block_config_from_target(policy.config, block_size, num_layers, feature_layers))
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
        block.feature_layers = [int(i) for i in saved.get("feature_layers") or ()]
        return BlockDrafter(block)

    drafter = load_saved(path, target, build)
    assert isinstance(drafter, BlockDrafter)
    return drafter
