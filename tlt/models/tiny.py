"""Tiny randomly initialised Qwen2 / Qwen3 / Llama causal LMs built from configs, for tests and benches.

No download: the architecture comes from a `transformers` config, the weights from a seed.
"""

from __future__ import annotations

from typing import Literal

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

Family = Literal["qwen2", "qwen3", "llama"]
FAMILIES: dict[str, tuple[type, type[PreTrainedModel]]] = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def tiny_config(
    family: Family = "qwen2",
    *,
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = False,
    rope_theta: float = 10000.0,
    head_dim: int | None = None,
) -> Qwen2Config | Qwen3Config | LlamaConfig:
    """A small config of the given family; Qwen2 has q/k/v biases, Llama and Qwen3 none.

    Qwen3 adds per-head q/k RMSNorms; its head_dim defaults to 2 * hidden_size / num_heads, so that
    heads x head_dim != hidden_size as in Qwen3-0.6B (16 heads x 128 over a hidden size of 1024).
    The other families default to hidden_size / num_heads.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}; got {family!r}")
    if head_dim is None:
        head_dim = (2 if family == "qwen3" else 1) * hidden_size // num_heads
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        head_dim=head_dim,
        rope_theta=rope_theta,
    )
    config_class, _ = FAMILIES[family]
    return config_class(**common)


def tiny_model(
    family: Family = "qwen2", *, seed: int = 0, dtype: torch.dtype = torch.float32, **config_kwargs
) -> PreTrainedModel:
    """A tiny model with seeded random weights, in eval mode, on the CPU.

    Qwen3's q/k norm weights are drawn from U(0.5, 1.5) instead of left at 1: an RMSNorm with equal
    weights commutes with RoPE's pair rotations, so only unequal weights let a test tell a norm
    applied before RoPE from one applied after it.
    """
    config = tiny_config(family, **config_kwargs)
    torch.manual_seed(seed)
    _, model_class = FAMILIES[family]
    model = model_class(config)
    if family == "qwen3":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    model = model.to(dtype)
    model.eval()
    return model
