"""Policy loading: local folders only, Qwen2 / Qwen3 / Llama families, clear refusals for everything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _models_helpers import char_tokenizer

from tlt.models.loading import SUPPORTED_MODEL_TYPES, load_policy, resolve_dtype, save_policy
from tlt.models.tiny import tiny_model


def _saved_policy(tmp_path: Path, family: str = "qwen2", tied: bool = False, vocab_size: int = 64) -> Path:
    folder = tmp_path / f"{family}-{'tied' if tied else 'untied'}"
    save_policy(tiny_model(family, vocab_size=vocab_size, tie_word_embeddings=tied), char_tokenizer(), folder)
    return folder


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_round_trip_keeps_weights_logits_tying_and_tokenizer(tmp_path, family, tied):
    original = tiny_model(family, tie_word_embeddings=tied)
    tokenizer = char_tokenizer()
    save_policy(original, tokenizer, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()

    model, loaded_tokenizer = load_policy(tmp_path, dtype="float32")

    assert model.config.model_type == family
    assert not model.training
    for (name, want), got in zip(original.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(want, got), name
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    text = "12+34=46 abc"
    ids = loaded_tokenizer(text).input_ids
    assert ids == tokenizer(text).input_ids
    assert loaded_tokenizer.decode(ids, skip_special_tokens=True) == text
    batch = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(original(batch).logits, model(batch).logits)


@pytest.mark.parametrize(
    ("name", "dtype"), [("bfloat16", torch.bfloat16), ("float32", torch.float32), ("float64", torch.float64)]
)
def test_supported_dtypes_load_in_that_dtype(tmp_path, name, dtype):
    folder = _saved_policy(tmp_path)
    assert load_policy(folder, dtype=name)[0].dtype == dtype
    assert load_policy(folder, dtype=dtype)[0].dtype == dtype


def test_default_dtype_is_bfloat16(tmp_path):
    assert load_policy(_saved_policy(tmp_path))[0].dtype == torch.bfloat16


@pytest.mark.parametrize("bad", ["float16", "fp32", "half", torch.float16, torch.int64])
def test_unsupported_dtype_is_refused_with_the_allowed_list(tmp_path, bad):
    with pytest.raises(ValueError, match=r"not supported; allowed: bfloat16, float32, float64"):
        load_policy(_saved_policy(tmp_path), dtype=bad)
    with pytest.raises(ValueError, match="allowed: bfloat16, float32, float64"):
        resolve_dtype(bad)


def test_missing_folder_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist \(a local folder is required"):
        load_policy(tmp_path / "no-such-model")


def test_folder_without_config_json_is_refused(tmp_path):
    folder = _saved_policy(tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_policy(folder)


@pytest.mark.parametrize("model_type", ["gpt2", "qwen3_moe", "mistral", None])
def test_unsupported_model_type_is_refused_naming_the_supported_ones(tmp_path, model_type):
    folder = _saved_policy(tmp_path)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    config["model_type"] = model_type
    config_file.write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=rf"model_type {model_type!r} .* is not supported; allowed: llama, qwen2, qwen3"
    ):
        load_policy(folder)
    assert SUPPORTED_MODEL_TYPES == ("llama", "qwen2", "qwen3")


def test_tokenizer_larger_than_embedding_is_refused(tmp_path):
    tokenizer = char_tokenizer()
    folder = _saved_policy(tmp_path, vocab_size=len(tokenizer) - 1)
    rows = len(tokenizer) - 1
    with pytest.raises(
        ValueError, match=rf"has {len(tokenizer)} tokens but the model's embedding has only {rows} rows"
    ):
        load_policy(folder)


def test_tokenizer_smaller_than_embedding_is_accepted(tmp_path):
    model, tokenizer = load_policy(_saved_policy(tmp_path, vocab_size=64), dtype="float32")
    assert len(tokenizer) < model.get_input_embeddings().num_embeddings


def test_folder_without_tokenizer_is_refused(tmp_path):
    folder = _saved_policy(tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer in .*expected one of tokenizer.json"):
        load_policy(folder)


def test_piped_logs_get_no_library_progress_bars(tmp_path, capfd):
    folder = _saved_policy(tmp_path)  # pytest's captured stderr is no terminal, as a pod's log is not
    load_policy(folder, dtype="float32")
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err, err
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled(), "the bars come back for the caller's own use"
