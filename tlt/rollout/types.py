"""Data passed in and out of the rollout engine: requests, sampling settings, completions, step metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

FinishReason = Literal["stop", "length", "abort"]  # abort: ended unfinished (`Engine.generate(stop=...)`)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    temperature: 0 means greedy (argmax); > 0 scales logits before softmax.
    top_p: nucleus mass kept, in (0, 1]; 1 keeps the full vocabulary.
    max_new_tokens: most tokens to generate (>= 1).
    stop_token_ids: generation stops after emitting any of these (the stop token is kept).
    seed: seeds this request's own generator, so its tokens do not depend on batch company;
        None draws a seed from torch's global generator.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Request:
    """One prompt to complete; prompt_ids are token ids (non-empty)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class Completion:
    """The engine's answer to one request.

    token_ids: the T generated tokens (a stop token, if hit, is the last one).
    logprobs: [T] float32, log_softmax(logits / T) of each generated token over the full vocabulary,
        before top-p (temperature 0 uses T = 1).
    hidden: [P + T - 1, H] the target's final-norm outputs at every fed position (row t produced
        token t + 1 of prompt + completion), or None when the engine runs with return_hidden=False;
        [P + T - 1, H * (1 + n)] wide features when the engine keeps n feature layers.
    staleness: [T] int64, for each token the policy updates between the weights that sampled it and the
        weights an update starts from (0: on-policy); None: every token on-policy (`tlt.runtime.partial_work`).
    """

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: torch.Tensor
    hidden: torch.Tensor | None
    finish_reason: FinishReason
    staleness: torch.Tensor | None = None


@dataclass(frozen=True)
class StepMetrics:
    """What one step did (prefill is step 0 of its wave).

    running: rows in the batch during the step; new_tokens: tokens the sequences kept;
    target_tokens: tokens the target model forwarded; finished: rows that finished in it.
    """

    step: int
    running: int
    new_tokens: int
    target_tokens: int
    finished: int
    seconds: float
