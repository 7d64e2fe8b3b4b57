"""Load and save a policy (causal LM + tokenizer) from a local folder; never from the hub.

Supported families: Qwen2 / Qwen2.5 (`model_type: qwen2`), dense Qwen3 (`model_type: qwen3`:
per-head q/k RMSNorm before RoPE) and Llama (`model_type: llama`, which also covers
Llama-architecture distills). Anything else (e.g. Qwen3-MoE, `qwen3_moe`)
is refused before any weight is read, because the drafter and the rollout engine assume these
architectures.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model", "vocab.json")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map a dtype name (or a torch dtype) to one of the supported torch dtypes, or raise ValueError."""
    if isinstance(dtype, torch.dtype):
        if dtype in SUPPORTED_DTYPES.values():
            return dtype
        raise ValueError(f"dtype {dtype} is not supported; allowed: {', '.join(SUPPORTED_DTYPES)}")
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; allowed: {', '.join(SUPPORTED_DTYPES)}")
    return SUPPORTED_DTYPES[dtype]


def read_model_config(path: str | Path) -> dict:
    """The parsed config.json of a local model folder, after checking folder, file and model_type."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"model folder {str(folder)!r} does not exist (a local folder is required; hub ids are not fetched)"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"model folder {str(folder)!r} has no config.json; save the model with save_pretrained")
    config = json.loads(config_file.read_text())
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} in {config_file} is not supported; allowed: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a local model folder, as `AutoTokenizer` loads it (what any standard tool gets)."""
    folder = Path(path)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"no tokenizer in {str(folder)!r}: expected one of {', '.join(TOKENIZER_FILES)} "
            "(save it with tokenizer.save_pretrained)"
        )
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_policy(
    path: str | Path, dtype: str | torch.dtype = "bfloat16"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a supported causal LM and its tokenizer from a local folder, in eval mode, on the CPU.

    Raises FileNotFoundError for a missing folder / config.json / tokenizer, ValueError for an
    unsupported model_type or dtype, or a tokenizer whose vocabulary exceeds the embedding rows.
    """
    torch_dtype = resolve_dtype(dtype)
    config = read_model_config(path)
    tokenizer = load_tokenizer(path)
    embedding_rows = int(config["vocab_size"])
    if len(tokenizer) > embedding_rows:
        raise ValueError(
            f"tokenizer in {str(path)!r} has {len(tokenizer)} tokens but the model's embedding has only "
            f"{embedding_rows} rows (config vocab_size); the tokenizer must not exceed vocab_size"
        )
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    model.eval()
    log.info(
        "loaded %s policy from %s (%s, %d params)", config["model_type"], path, torch_dtype, model.num_parameters()
    )
    return model, tokenizer


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> None:
    """Save model weights (safetensors), config and tokenizer into one folder that load_policy reads."""
    model_type = model.config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported; allowed: {', '.join(SUPPORTED_MODEL_TYPES)}")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    log.info("saved %s policy to %s", model_type, folder)
