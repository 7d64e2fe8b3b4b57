"""Test helpers for model loading and the drafter: the built-in task tokenizer (byte-level, Qwen2 format)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from tlt.tasks.tokenizer import build_task_tokenizer


def char_tokenizer() -> PreTrainedTokenizerBase:
    """One token per task character; ids 0-3 are pad, bos, eos, unk (as in tiny_config)."""
    return build_task_tokenizer()
