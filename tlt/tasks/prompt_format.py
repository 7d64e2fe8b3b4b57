"""Prompt formatting: the one place a record becomes the text and token ids the policy sees.

Two pure steps, used by the rollout (`tlt.runtime.rl_step.make_requests`), evaluation, the drafter's
evaluation, `tlt validate --show-prompt` and the KFP prepare step, so every one of them gives the model
exactly the same ids:
- `render_prompt(template, record, where)`: the template (Python format syntax over the record's
  fields, e.g. "{question}\\nLet's think step by step.") filled in; a field the record lacks is an
  error naming the field and the record;
- `encode_prompt(tokenizer, problem)`: the prompt's ids [L]: `tokenizer(prompt)` (special tokens
  such as bos included), or with `problem.chat` the tokenizer's chat template over
  [system?, user] with the generation prompt (`apply_chat_template(..., add_generation_prompt=True)`).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase

from tlt.tasks.problem import Problem


class PromptError(ValueError):
    """A prompt that cannot be formatted: a bad template, a missing field, or no chat template."""


def template_fields(template: str) -> list[str]:
    """The record fields `template` names, in order ("{a} {b.x}" -> ["a", "b"]); raises PromptError
    for a malformed template or a positional field ("{}", "{0}")."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise PromptError(
            f"dataset.prompt is not a valid template ({exc}); write literal braces as {{{{ }}}}"
        ) from None
    names = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        root = name.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise PromptError(f"dataset.prompt: every field needs a name, e.g. {{question}}; got {{{name}}}")
        names.append(root)
    return names


def render_prompt(template: str, record: Mapping[str, Any], where: str) -> str:
    """`template` filled in from `record`; `where` names the record in errors (e.g. "data.jsonl:3")."""
    for name in template_fields(template):
        if name not in record:
            raise PromptError(
                f"{where}: dataset.prompt names field {name!r}, which the record lacks; "
                f"fields present: {sorted(record)}"
            )
    try:
        return template.format_map(record)
    except (KeyError, IndexError, AttributeError, ValueError, TypeError) as exc:
        raise PromptError(f"{where}: dataset.prompt cannot be filled in ({type(exc).__name__}: {exc})") from None


def chat_messages(problem: Problem) -> list[dict[str, str]]:
    """The chat of a problem: [system?, user]."""
    system = [{"role": "system", "content": problem.system}] if problem.system else []
    return [*system, {"role": "user", "content": problem.prompt}]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, problem: Problem) -> list[int]:
    """The token ids [L] the policy is given for `problem` (see the module docstring)."""
    if not problem.chat:
        return list(tokenizer(problem.prompt).input_ids)
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError(
            "dataset.chat is true but the tokenizer has no chat template "
            "(chat_template in tokenizer_config.json); set dataset.chat: false or use a chat model"
        )
    ids = tokenizer.apply_chat_template(chat_messages(problem), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]
