"""Tiny randomly initialised Qwen2 / Llama causal LMs built from configs, for tests and benches.

No download: the architecture comes from a `transformers` config, the weights from a seed.
"""

from __future__ import annotations

from typing import Literal

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

Family = Literal["qwen2", "llama"]


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
) -> Qwen2Config | LlamaConfig:
    """A small config of the given family; Qwen2 has q/k/v biases, Llama none."""
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
    )
    if family == "qwen2":
        return Qwen2Config(**common, rope_theta=rope_theta)
    if family == "llama":
        return LlamaConfig(**common, rope_theta=rope_theta)
    raise ValueError(f"family must be 'qwen2' or 'llama', got {family!r}")


def tiny_model(
    family: Family = "qwen2", *, seed: int = 0, dtype: torch.dtype = torch.float32, **config_kwargs
) -> PreTrainedModel:
    """A tiny model with seeded random weights, in eval mode, on the CPU."""
    config = tiny_config(family, **config_kwargs)
    torch.manual_seed(seed)
    cls = Qwen2ForCausalLM if family == "qwen2" else LlamaForCausalLM
    model = cls(config).to(dtype)
    model.eval()
    return model
