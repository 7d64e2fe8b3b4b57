"""The built-in task's tokenizer: byte-level BPE in the Qwen2 format, which `AutoTokenizer` loads unchanged.

Built with `tokenizers`: Qwen2's own pre-tokenizer (its split regex, then the byte-level mapping), a BPE
model with no merges whose vocabulary is the byte symbols of the task's characters (one token per
character, in the order and with the ids the earlier char-level tokenizer had, so the task's text
encodes as before), the byte-level decoder, and a post-processor that prepends `<bos>`. It is the
built-in task's tokenizer, not a general one: Qwen2Tokenizer's BPE has no unknown token, so a
character outside the task's alphabet (an upper-case letter, '$', 'é') is left out, the same way in
training and in every tool that loads the folder. Real data runs with its model's own tokenizer. It is saved once with
`tokenizer_class: Qwen2Tokenizer` and loaded
back through `AutoTokenizer`, so the tokenizer the project trains with IS the one any standard tool
(vLLM, lm-eval, a user's script) gets from a folder the project writes: same class, same ids.
Special ids match `tlt.models.tiny.tiny_config`: pad 0, bos 1, eos 2 (and `<unk>` 3, kept for the
ids). Vocabulary: 4 + 49 = 53.

Why not all 256 bytes: with them the reduced warm start sampled at T=1 far worse than it decoded
greedily (the untrained byte tokens keep probability mass in a small policy), and 20 GRPO steps
lowered its held-out reward (0.40 -> 0.32) where the task-alphabet vocabulary raises it.

The earlier char-level tokenizer (a BPE over 49 characters with no pre-tokenizer) declared the
generic class; AutoTokenizer on such a folder with a Qwen2 config swapped in Qwen2's byte-level
pre-tokenizer, which dropped every space and unknown character.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = "0123456789+-*/=()., #:\n" + "abcdefghijklmnopqrstuvwxyz"
TOKENIZER_CLASS = "Qwen2Tokenizer"
TOKENIZER_VERSION = "bytes-v1"
# Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation runs, newlines, spaces).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_symbol(ch: str) -> str:
    """The byte-level pre-tokenizer's symbol for a one-byte character (GPT-2's byte-to-unicode map)."""
    (byte,) = ch.encode()
    if 33 <= byte <= 126 or 161 <= byte <= 172 or 174 <= byte <= 255:
        return chr(byte)
    shifted = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    return chr(256 + shifted.index(byte))


def _core(characters: str) -> Tokenizer:
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({_byte_symbol(ch): len(SPECIAL_TOKENS) + i for i, ch in enumerate(characters)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return core


def build_task_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerBase:
    """The byte-level task tokenizer over `characters` (one-byte, each once), as `AutoTokenizer` loads it
    from a saved folder (class Qwen2Tokenizer)."""
    if len(set(characters)) != len(characters) or any(len(ch.encode()) != 1 for ch in characters):
        raise ValueError("characters must be distinct one-byte characters")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_core(characters),
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    with tempfile.TemporaryDirectory(prefix="tlt-tokenizer-") as folder:
        fast.save_pretrained(folder)
        config_file = Path(folder) / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["tokenizer_class"] = TOKENIZER_CLASS
        config_file.write_text(json.dumps(config, indent=2))
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
