"""One problem of any task or dataset: the prompt shown to the policy and the reference answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
