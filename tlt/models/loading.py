"""Load and save a policy (causal LM + tokenizer) from a local folder; never from the hub.

Supported families: Qwen2 / Qwen2.5 (`model_type: qwen2`), dense Qwen3 (`model_type: qwen3`:
per-head q/k RMSNorm before RoPE) and Llama (`model_type: llama`, which also covers
Llama-architecture distills). Anything else (e.g. Qwen3-MoE, `qwen3_moe`)
is refused before any weight is read, because the drafter and the rollout engine assume these
architectures.

`model_folder_problems` says everything that keeps a folder from loading, one line each, before any
weight is read (`tlt validate`, and `tlt train` before it starts anything).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from transformers.utils import logging as hf_logging

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model", "vocab.json")
# What `from_pretrained` reads weights from, in its order of preference: one file, or an index of shards.
WEIGHT_FILES: tuple[str, ...] = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


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
    """The parsed config.json of a local model folder, after checking folder, file, model_type and vocab_size."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"model folder {str(folder)!r} does not exist (a local folder is required; hub ids are not fetched)"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"model folder {str(folder)!r} has no config.json; save the model with save_pretrained")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{config_file} is not a JSON file ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} must hold a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} in {config_file} is not supported; allowed: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    vocab_size = config.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size in {config_file} must be a positive integer, got {vocab_size!r}")
    return config


def _tokenizer_missing(folder: Path) -> str | None:
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    return (
        f"no tokenizer in {str(folder)!r}: expected one of {', '.join(TOKENIZER_FILES)} "
        "(save it with tokenizer.save_pretrained)"
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a local model folder, as `AutoTokenizer` loads it (what any standard tool gets)."""
    folder = Path(path)
    missing = _tokenizer_missing(folder)
    if missing is not None:
        raise FileNotFoundError(missing)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def tokenizer_size_problem(tokenizer: PreTrainedTokenizerBase, config: dict, path: str | Path) -> str | None:
    """Why the tokenizer does not fit the model's embedding (more tokens than config vocab_size), or None."""
    embedding_rows = int(config["vocab_size"])
    if len(tokenizer) <= embedding_rows:
        return None
    return (
        f"tokenizer in {str(path)!r} has {len(tokenizer)} tokens but the model's embedding has only "
        f"{embedding_rows} rows (config vocab_size); the tokenizer must not exceed vocab_size"
    )


def weights_problem(folder: Path) -> str | None:
    """Why `from_pretrained` would find no weights in `folder`, or None: no WEIGHT_FILES, an index naming
    a shard that is not there, or a safetensors file whose header does not read (only headers are read)."""
    found = next((name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if found is None:
        return f"no weights in {str(folder)!r}: expected one of {', '.join(WEIGHT_FILES)} (save with save_pretrained)"
    files = [folder / found]
    if found.endswith(".index.json"):
        try:
            weight_map = json.loads(files[0].read_text(encoding="utf-8"))["weight_map"]
            files = [folder / shard for shard in sorted(set(weight_map.values()))]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            return f"{files[0]} is not a weight index (a JSON object with a weight_map: {type(exc).__name__}: {exc})"
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            return f"{folder / found} names shards that are not in the folder: {', '.join(missing[:3])}"
    for file in files:
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), "pt"):
                    pass
            except (SafetensorError, OSError) as exc:
                return f"{file} is not a safetensors file ({exc})"
    return None


def model_folder_problems(path: str | Path) -> list[str]:
    """Every reason the folder would not load as a policy, one line each, reading no weight: the folder,
    config.json (present, JSON, a supported model_type, vocab_size), weights, tokenizer files."""
    folder = Path(path)
    problems = []
    try:
        read_model_config(folder)
    except (OSError, ValueError) as exc:
        problems.append(str(exc))
    if folder.is_dir():
        problems += [p for p in (weights_problem(folder), _tokenizer_missing(folder)) if p is not None]
    return problems


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
    too_large = tokenizer_size_problem(tokenizer, config, path)
    if too_large is not None:
        raise ValueError(too_large)
    with library_bars():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    model.eval()
    log.info(
        "loaded %s policy from %s (%s, %d params)", config["model_type"], path, torch_dtype, model.num_parameters()
    )
    return model, tokenizer


@contextmanager
def library_bars() -> Iterator[None]:
    """transformers' own progress bars ("Loading weights", "Writing model shards") only on a terminal: piped
    into a log (a pod's, Ray's worker logs, CI) each redraw is a line of noise. Restored on exit."""
    if sys.stderr.isatty() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> None:
    """Save model weights (safetensors), config and tokenizer into one folder that load_policy reads."""
    model_type = model.config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported; allowed: {', '.join(SUPPORTED_MODEL_TYPES)}")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    with library_bars():
        model.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
    log.info("saved %s policy to %s", model_type, folder)
