"""Steppers: the per-step work of the decode loop. A step appends one or more tokens to every row.

`PlainStepper` feeds each row's newest token and samples one more; speculative steppers feed a row's
newest token plus drafts and keep a variable number. `prefill` is the first step of a wave.
`FinishWatcher` wraps any stepper and hands each sequence on as it finishes (a rollout worker streams
it to a verifier).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from tlt.rollout.batch import RunningBatch
from tlt.rollout.runner import ModelRunner, causal_mask
from tlt.rollout.sampling import sample_tokens
from tlt.rollout.sequence import Sequence


class Stepper(Protocol):
    def step(self, batch: RunningBatch) -> int:
        """Advance every running row by >= 1 token through `batch.commit`; return target tokens forwarded."""
        ...


def prefill(runner: ModelRunner, batch: RunningBatch) -> int:
    """Feed every prompt (right-padded to the longest) and sample each row's first token.

    Padding sits past each row's prompt: its k/v are scratch, never seen by real tokens (causal
    mask) and overwritten by later tokens. Returns the number of real prompt tokens fed.
    """
    prompts = [s.request.prompt_ids for s in batch.sequences]
    lens = [len(p) for p in prompts]
    b, span = len(prompts), max(lens)
    device = runner.device
    token_ids = torch.zeros(b, span, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        token_ids[i, : len(p)] = torch.tensor(p, device=device)
    batch.cache.start(b)
    positions = torch.arange(span, device=device)[None, :].expand(b, span)
    mask = causal_mask(torch.zeros(b, dtype=torch.long, device=device), span, span)  # [B, P, P]
    hidden = runner.forward(token_ids, positions, positions, mask)  # [B, P, H]
    last = hidden[torch.arange(b, device=device), torch.tensor(lens, device=device) - 1]  # [B, H]
    tokens, logprobs = sample_tokens(runner.logits(last), batch.temperature, batch.top_p, _next_uniform(batch))
    batch.commit([[t] for t in tokens.tolist()], tokens, logprobs[:, None], hidden, fed=lens)
    return sum(lens)


class PlainStepper:
    """One target forward per step: feed each row's newest token at its next slot, sample the next."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def step(self, batch: RunningBatch) -> int:
        lengths = batch.lengths()  # [B]
        slots = lengths[:, None]  # [B, 1]: next slot = position = tokens fed so far
        mask = causal_mask(lengths, 1, max(batch.cache.lengths) + 1)  # [B, 1, S]
        hidden = self.runner.forward(batch.last_token[:, None], slots, slots, mask)  # [B, 1, H]
        tokens, logprobs = sample_tokens(
            self.runner.logits(hidden[:, 0]), batch.temperature, batch.top_p, _next_uniform(batch)
        )
        batch.commit([[t] for t in tokens.tolist()], tokens, logprobs[:, None], hidden)
        return batch.num_rows


def _next_uniform(batch: RunningBatch) -> torch.Tensor | None:
    """[B] the uniform of each row's next token, None when every row is greedy."""
    if not batch.sampled:
        return None
    return batch.uniform_window(1)[:, 0]


class FinishWatcher:
    """A stepper around another: after each step, hands every newly finished sequence to `on_finish`."""

    def __init__(self, inner: Stepper, on_finish: Callable[[Sequence], None]) -> None:
        self.inner = inner
        self.on_finish = on_finish
        self.seen: set[str] = set()

    def step(self, batch: RunningBatch) -> int:
        fed = self.inner.step(batch)
        for seq in batch.sequences:
            if seq.finished and seq.request.request_id not in self.seen:
                self.seen.add(seq.request.request_id)
                self.on_finish(seq)
        return fed
