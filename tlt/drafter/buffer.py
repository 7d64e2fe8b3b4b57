"""The online drafter buffer: rollouts of this step and the long ones of the previous step, packed.

A sample is one finished sequence as the rollout engine saw it: tokens x[0..L-1] (prompt then
response) and the target's final-norm states f[0..L-1] (f[t] produced x[t+1]). Drafter position
t reads (x[t+1], f[t]) and regresses f[t+1] (`tlt.drafter.objective`); it counts in the loss only
where x[t+1] is a response token.

One-step offset: the first sequences of a step to finish are the short ones, so a trainer that
starts early in a step sees a batch biased short. The buffer keeps, besides the current step,
the sequences of the previous `buffer_steps - 1` steps that were at least as long as their
step's median: the long tail the drafter must learn to speed up.

Packing: aligned sequences are laid end to end in rows of at most `batch_tokens` positions, with
a block-diagonal causal attention mask and positions restarting per sequence, so no compute is
spent on padding. A sequence longer than a row is cut into row-sized pieces (absolute positions).
"""

from __future__ import annotations

import functools
import random
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from tlt.drafter.objective import DrafterBatch, drafter_inputs
from tlt.rollout.types import Completion


@dataclass(frozen=True)
class Sample:
    """One sequence: tokens [L] long, hidden [L, H] (f[t] at row t), the first response index, its step, and the
    request it answered (`s<step>-p<prompt>-g<member>`: the same in a step run again)."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    prompt_len: int
    step: int
    request_id: str = ""

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def response_len(self) -> int:
        return self.length - self.prompt_len


@dataclass(frozen=True)
class PackedBatch:
    """One packed row: a DrafterBatch of B=1 rows and T positions, and where its sequences lie.

    segments: the packed pieces' position counts in row order (sum T); the drafter attends per segment
    (`EagleDrafter(..., segments=)`). attn_mask: the same as a [1, 1, T, T] bool mask, True where query t
    may attend to key s (same sequence, s <= t), built on first use.
    """

    batch: DrafterBatch
    segments: tuple[int, ...]

    @functools.cached_property
    def attn_mask(self) -> torch.Tensor:
        segment = torch.repeat_interleave(torch.arange(len(self.segments)), torch.tensor(self.segments))  # [T]
        causal = torch.ones(segment.shape[0], segment.shape[0], dtype=torch.bool).tril()
        return (causal & (segment[:, None] == segment[None, :]))[None, None]

    def to(self, device: torch.device) -> PackedBatch:
        """This row with its tensors on `device` (itself where they are there already): the buffer keeps
        samples on the CPU, a drafter may train on a GPU."""
        if self.batch.input_ids.device == device:
            return self
        return PackedBatch(batch=DrafterBatch(*(t.to(device) for t in self.batch)), segments=self.segments)

    @property
    def num_positions(self) -> int:
        return int(self.batch.input_ids.shape[1])

    @property
    def num_trained(self) -> int:
        return int(self.batch.mask.sum())


def sample_from_completion(completion: Completion, step: int) -> Sample | None:
    """The buffer sample of a finished completion; None when it has no hidden states or no response
    position to train on. Uses tokens x[0..L-1] with L = P + T - 1 (the last token was never fed)."""
    if completion.hidden is None:
        return None
    tokens = list(completion.prompt_ids) + list(completion.token_ids)
    length = completion.hidden.shape[0]
    prompt_len = len(completion.prompt_ids)
    if length != len(tokens) - 1:
        raise ValueError(
            f"completion {completion.request_id!r}: hidden has {length} rows, expected prompt + response - 1 "
            f"= {len(tokens) - 1}"
        )
    if length - prompt_len < 1:
        return None
    return Sample(torch.tensor(tokens[:length]), completion.hidden, prompt_len, step, completion.request_id)


def keep_long(samples: list[Sample]) -> list[Sample]:
    """The samples at least as long (in response tokens) as their step's median."""
    by_step: dict[int, list[Sample]] = {}
    for s in samples:
        by_step.setdefault(s.step, []).append(s)
    kept = []
    for group in by_step.values():
        median = statistics.median(s.response_len for s in group)
        kept.extend(s for s in group if s.response_len >= median)
    return kept


def _pieces(sample: Sample, row_tokens: int) -> list[tuple[int, int]]:
    """[start, end) token ranges of a sample, each aligning to at most row_tokens positions."""
    span = row_tokens + 1  # n tokens align to n - 1 positions
    starts = range(0, max(sample.length - 1, 1), row_tokens)
    return [(s, min(s + span, sample.length)) for s in starts if min(s + span, sample.length) - s >= 2]


def pack(samples: list[Sample], row_tokens: int) -> list[PackedBatch]:
    """Pack samples, in the given order, into rows of at most row_tokens aligned positions (first fit)."""
    if row_tokens < 1:
        raise ValueError(f"row_tokens must be >= 1, got {row_tokens}")
    rows: list[list[DrafterBatch]] = []
    used: list[int] = []
    for sample in samples:
        for start, end in _pieces(sample, row_tokens):
            mask = torch.arange(start, end) >= sample.prompt_len
            positions = torch.arange(start, end)[None]
            piece = drafter_inputs(
                sample.tokens[None, start:end], sample.hidden[None, start:end], mask[None], positions
            )
            if not bool(piece.mask.any()):
                continue
            size = piece.input_ids.shape[1]
            row = next((i for i, u in enumerate(used) if u + size <= row_tokens), None)
            if row is None:
                rows.append([])
                used.append(0)
                row = len(rows) - 1
            rows[row].append(piece)
            used[row] += size
    return [_concat(pieces) for pieces in rows]


def _concat(pieces: list[DrafterBatch]) -> PackedBatch:
    sizes = [p.input_ids.shape[1] for p in pieces]
    batch = DrafterBatch(*(torch.cat([getattr(p, f) for p in pieces], dim=1) for f in DrafterBatch._fields))
    return PackedBatch(batch=batch, segments=tuple(sizes))


class OnlineBuffer:
    """Samples of the current step plus the long samples of the previous `buffer_steps - 1` steps.

    Plain bookkeeping; `batches` packs a seeded shuffle of what it holds. Not thread-safe on its own:
    the rollout worker adds samples only while its trainer is stopped.
    """

    def __init__(self, buffer_steps: int, row_tokens: int, seed: int = 0) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        self.buffer_steps = buffer_steps
        self.row_tokens = row_tokens
        self.seed = seed
        self.current_step = 0
        self.samples: list[Sample] = []

    def begin_step(self, step: int) -> None:
        """Start step `step`: older steps keep only their long samples, steps out of range leave."""
        if step <= self.current_step:
            return
        oldest = step - self.buffer_steps + 1
        ending = keep_long([s for s in self.samples if s.step == self.current_step])
        earlier = [s for s in self.samples if s.step != self.current_step]
        self.samples = [s for s in earlier + ending if oldest <= s.step < step]
        self.current_step = step

    def add(self, completions: list[Completion], step: int) -> int:
        """Add the completions of `step` (must be the current step); returns how many samples entered. A request
        of this step already held (the step run again after a lost worker) is replaced, not held twice."""
        self.begin_step(step)
        if step != self.current_step:
            raise ValueError(f"buffer is at step {self.current_step}; cannot add samples of older step {step}")
        new = [s for c in completions if (s := sample_from_completion(c, step)) is not None]
        again = {s.request_id for s in new if s.request_id}
        self.samples = [s for s in self.samples if s.step != step or s.request_id not in again] + new
        return len(new)

    @property
    def num_trainable(self) -> int:
        """Response positions the drafter can train on."""
        return sum(s.response_len for s in self.samples)

    def steps_held(self) -> list[int]:
        return sorted({s.step for s in self.samples})

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this buffer exactly: settings, step, and every sample
        (tokens [L] int64, hidden [L, H], prompt length, step, request id) in order. Tensors, ints and lists
        only, so whole-run checkpoints load it with `torch.load(weights_only=True)`."""
        return {
            "buffer_steps": self.buffer_steps,
            "row_tokens": self.row_tokens,
            "seed": self.seed,
            "current_step": self.current_step,
            "tokens": [s.tokens.clone() for s in self.samples],
            "hidden": [s.hidden.clone() for s in self.samples],
            "prompt_len": [s.prompt_len for s in self.samples],
            "step": [s.step for s in self.samples],
            "request_id": [s.request_id for s in self.samples],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s samples and step; the settings must match this buffer's."""
        for name in ("buffer_steps", "row_tokens", "seed"):
            if int(state[name]) != getattr(self, name):
                raise ValueError(
                    f"buffer state has {name}={state[name]}, this buffer {getattr(self, name)}: "
                    "the checkpoint was written with different drafter settings"
                )
        columns = (state["tokens"], state["hidden"], state["prompt_len"], state["step"])
        if len({len(c) for c in columns}) != 1:
            raise ValueError(f"buffer state columns differ in length: {[len(c) for c in columns]}")
        ids = state.get("request_id") or [""] * len(columns[0])  # a state written before samples kept theirs
        self.samples = [Sample(t, h, int(p), int(s), str(r)) for t, h, p, s, r in zip(*columns, ids)]
        self.current_step = int(state["current_step"])

    def batches(self, epoch: int) -> list[PackedBatch]:
        """Every sample once, shuffled by (seed, step, epoch), packed into rows."""
        order = list(self.samples)
        random.Random(f"{self.seed}-{self.current_step}-{epoch}").shuffle(order)
        return pack(order, self.row_tokens)
