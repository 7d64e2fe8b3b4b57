"""The char-level tokenizer: small vocab, one token per character, HF save/load round trip."""

from __future__ import annotations

from transformers import AutoTokenizer

from tlt.tasks.countdown import generate
from tlt.tasks.tokenizer import build_char_tokenizer


def test_vocab_is_small_and_special_ids_match_tiny_models():
    tok = build_char_tokenizer()
    assert len(tok) < 64
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


def test_one_token_per_character_with_bos_prepended():
    tok = build_char_tokenizer()
    ids = tok("29=20=11=2 #### 2").input_ids
    assert ids[0] == tok.bos_token_id
    assert len(ids) == 1 + len("29=20=11=2 #### 2")


def test_decode_inverts_encode_on_task_text():
    tok = build_char_tokenizer()
    for problem in generate(50, seed=1):
        text = problem.prompt + problem.answer
        assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text


def test_unknown_characters_map_to_unk():
    tok = build_char_tokenizer()
    assert tok("Q", add_special_tokens=False).input_ids == [tok.unk_token_id]


def test_save_pretrained_round_trips_through_auto_tokenizer(tmp_path):
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "38-9=29=20=11=2 #### 2"
    assert loaded(text).input_ids == tok(text).input_ids
    assert loaded.decode(loaded(text).input_ids, skip_special_tokens=True) == text
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)


def test_batches_pad_on_the_left_for_generation():
    tok = build_char_tokenizer()
    batch = tok(["1+2=", "1+2+3="], padding=True)
    assert batch.input_ids[0][:2] == [tok.pad_token_id] * 2
    assert batch.attention_mask[0] == [0, 0, 1, 1, 1, 1, 1]
