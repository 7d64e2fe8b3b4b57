"""A character-level tokenizer for the built-in task, in the standard Hugging Face format.

Built with `tokenizers` (a BPE model with no merges: every character is one token) and wrapped
in `transformers.PreTrainedTokenizerFast`, so `save_pretrained` / `AutoTokenizer.from_pretrained`
round-trip it like any hub tokenizer. Special ids match `tlt.models.tiny.tiny_config`:
pad 0, bos 1, eos 2; unknown characters map to `<unk>` (3). Encoding a text prepends `<bos>`.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = "0123456789+-*/=()., #:\n" + "abcdefghijklmnopqrstuvwxyz"


def build_char_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    """A char-level tokenizer over `characters` (each once) plus `<pad> <bos> <eos> <unk>`."""
    if len(set(characters)) != len(characters):
        raise ValueError("characters must not repeat")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(characters)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
