"""One problem of any task or dataset: the prompt shown to the policy and the reference answer.

`prompt` is the user's text (a dataset's template already applied); with `chat` the tokenizer's chat
template wraps it (after `system` when set) when it is encoded (`tlt.tasks.prompt_format.encode_prompt`).
`record` is the dataset record the problem came from (empty for the built-in task), handed to reward
plug-ins; `source` says where it came from (`data.jsonl:6`, the 1-based line; `data.parquet row 6`;
empty for the built-in task), for messages. Neither takes part in equality.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    chat: bool = False
    system: str | None = None
    record: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    source: str = field(default="", compare=False, repr=False)
