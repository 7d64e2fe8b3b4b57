"""The built-in byte-level tokenizer: the model family's own class loads it unchanged, same ids everywhere."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from tlt.models.loading import load_tokenizer
from tlt.tasks.countdown import generate
from tlt.tasks.tokenizer import TOKENIZER_CLASS, build_task_tokenizer

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def _gsm8k_texts(n: int = 200) -> list[str]:
    if not GSM8K.is_file():  # the repository's CI has shared/ beside it; a lone clone gets task text only
        return []
    lines = GSM8K.read_text().splitlines()[:n]
    return [r["question"] + "\n" + r["answer"] for r in map(json.loads, lines)]


def test_vocab_is_the_task_alphabet_and_special_ids_match_tiny_models():
    tok = build_task_tokenizer()
    assert len(tok) == 53
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert type(tok).__name__ == TOKENIZER_CLASS


def test_one_token_per_task_character_with_bos_prepended():
    tok = build_task_tokenizer()
    text = "29=20=11=2 #### 2"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and len(ids) == 1 + len(text)


def test_task_text_round_trips_spaces_and_newlines_included():
    tok = build_task_tokenizer()
    for text in [p.prompt + p.answer for p in generate(50, seed=1)] + ["a b\n\n  c"]:
        assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text


def test_characters_outside_the_task_alphabet_are_left_out_not_mangled():
    tok = build_task_tokenizer()
    assert tok.decode(tok("Qa b$1é").input_ids, skip_special_tokens=True) == "a b1"


def test_auto_tokenizer_on_a_saved_policy_folder_gives_the_training_ids(tmp_path):
    """What vLLM, lm-eval or a user's script loads equals what training used, on task and GSM8K text."""
    from tlt.models.loading import save_policy
    from tlt.models.tiny import tiny_model

    tok = build_task_tokenizer()
    save_policy(tiny_model("qwen2", vocab_size=len(tok)), tok, tmp_path)
    for loaded in (AutoTokenizer.from_pretrained(tmp_path), load_tokenizer(tmp_path)):
        assert type(loaded).__name__ == TOKENIZER_CLASS
        texts = [p.prompt + p.answer for p in generate(100, seed=2)] + _gsm8k_texts()
        assert [loaded(t).input_ids for t in texts] == [tok(t).input_ids for t in texts]
        assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)


def test_batches_pad_on_the_left_for_generation():
    tok = build_task_tokenizer()
    batch = tok(["1+2=", "1+2+3="], padding=True)
    assert batch.input_ids[0][:2] == [tok.pad_token_id] * 2
    assert batch.attention_mask[0] == [0, 0, 1, 1, 1, 1, 1]
