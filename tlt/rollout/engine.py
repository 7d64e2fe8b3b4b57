"""The rollout engine: batched prefill, a decode loop whose per-step work is a pluggable stepper,
finished rows leaving the batch, in-place weight swaps between batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import torch
from transformers import PreTrainedModel

from tlt.models.draft_vocab import DraftVocabTracker
from tlt.models.feature_layers import feature_width
from tlt.rollout.batch import RunningBatch
from tlt.rollout.decode_step import PlainStepper, Stepper, prefill
from tlt.rollout.runner import ModelRunner
from tlt.rollout.sequence import Sequence
from tlt.rollout.types import Completion, Request, StepMetrics

log = logging.getLogger(__name__)

StepCallback = Callable[[StepMetrics], None]
# halt(tokens generated so far by request id, ids of the finished requests) -> the ids of running requests to end
Halt = Callable[[dict[str, int], set[str]], set[str]]
WaveObserver = Callable[[list[Sequence]], None]


class Engine:
    """Generates completions for requests with a Qwen2 / Qwen3 / Llama `*ForCausalLM`.

    Requests run in waves of up to max_batch_size rows; a wave's rows leave the batch as they
    finish (the long tail runs at a shrinking batch size). `stepper` may be replaced by any
    `Stepper` built on `runner` (e.g. speculative decoding). `tokens_processed` counts the tokens
    the target forwarded: real prompt tokens plus every token fed while decoding. compile: run the
    target (and drafters built with `compile=engine.compiled`) through compiled steps. feature_layers:
    decoder layers whose outputs every target step keeps beside the final-norm state, for a block drafter
    that reads them (`tlt.models.feature_layers`); completions' `hidden` are then these wide features.
    `wave_observers` are called with every wave's sequences once the wave has finished (e.g. the
    rollout-history store indexes them, whichever stepper ran). `draft_vocab`: when set, every generate
    re-picks the drafter's reduced vocabulary first (from its requests' prompts, their stop tokens kept)
    and counts the responses after, leaving (inside, total) generated tokens in `draft_vocab_coverage`.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        max_batch_size: int = 32,
        max_context: int = 4096,
        return_hidden: bool = True,
        compile: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {max_context}")
        self.model = model
        self.runner = ModelRunner(
            model,
            max_batch_size=max_batch_size,
            max_context=max_context,
            compile=compile,
            feature_layers=feature_layers,
        )
        self.stepper: Stepper = PlainStepper(self.runner)
        self.max_batch_size = max_batch_size
        self.max_context = max_context
        self.return_hidden = return_hidden
        self.tokens_processed = 0
        self.wave_observers: list[WaveObserver] = []
        self.draft_vocab: DraftVocabTracker | None = None
        self.draft_vocab_coverage: tuple[int, int] | None = None

    @property
    def compiled(self) -> bool:
        return self.runner.compiled is not None

    def generate(
        self, requests: list[Request], on_step: StepCallback | None = None, halt: Halt | None = None
    ) -> list[Completion]:
        """Complete every request; results in request order. on_step gets each step's metrics. `halt`, asked
        before each wave and after each step with the tokens every request has generated so far and the ids of
        those finished, ends the running requests whose ids it returns: they come back unfinished, finish reason
        "abort", with the tokens they have (a wave none of whose requests is left to run does not start)."""
        sequences = [self._sequence(r) for r in requests]
        if self.draft_vocab is not None:
            stops = sorted({t for r in requests for t in r.params.stop_token_ids})
            self.draft_vocab.before([r.prompt_ids for r in requests], stops)
        out: list[Completion] = []
        progress = _Progress(sequences) if halt is not None else None
        for start in range(0, len(sequences), self.max_batch_size):
            wave = sequences[start : start + self.max_batch_size]
            if halt is not None and progress is not None:
                ended = halt(*progress.read())
                if all(s.request.request_id in ended for s in wave):
                    out.extend(_not_started(wave))
                    continue
            out.extend(self._run_wave(wave, on_step, halt, progress))
        if self.draft_vocab is not None:
            self.draft_vocab_coverage = self.draft_vocab.after([c.token_ids for c in out])
        return out

    def running_batch(self, sequences: list[Sequence]) -> RunningBatch:
        """A wave's running batch on this engine's cache, its feature buffer as wide as the runner's features."""
        hidden = self.model.config.hidden_size
        return RunningBatch(
            sequences,
            self.runner.cache,
            hidden_size=hidden,
            return_hidden=self.return_hidden,
            feature_size=feature_width(hidden, self.runner.feature_layers),
            dtype=self.model.dtype,
            device=self.runner.device,
        )

    def _run_wave(
        self,
        sequences: list[Sequence],
        on_step: StepCallback | None,
        halt: Halt | None = None,
        progress: _Progress | None = None,
    ) -> list[Completion]:
        batch = self.running_batch(sequences)
        step, advance = 0, lambda b: prefill(self.runner, b)
        while batch.num_rows:
            t0, running, generated = time.perf_counter(), batch.num_rows, _generated(batch)
            fed = advance(batch)
            self.tokens_processed += fed
            finished = batch.drop_finished()
            if on_step is not None:
                new = _generated(batch) - generated
                on_step(StepMetrics(step, running, new, fed, finished, time.perf_counter() - t0))
            step, advance = step + 1, self.stepper.step
            if halt is None or progress is None or not batch.num_rows:
                continue
            ended = halt(*progress.read())
            aborted = [seq for seq in batch.sequences if seq.request.request_id in ended]
            for seq in aborted:
                seq.finish_reason = "abort"
            if aborted:
                batch.drop_finished()
        for observe in self.wave_observers:
            observe(batch.all_sequences)
        return batch.completions()

    def _sequence(self, request: Request) -> Sequence:
        n = len(request.prompt_ids)
        if n == 0:
            raise ValueError(f"request {request.request_id!r}: prompt_ids is empty; give at least one token")
        if n >= self.max_context:
            raise ValueError(
                f"request {request.request_id!r}: prompt_ids has {n} tokens; max_context={self.max_context} "
                f"allows at most {self.max_context - 1}"
            )
        vocab = self.model.config.vocab_size
        bad = [t for t in request.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"request {request.request_id!r}: prompt_ids {bad[:5]} outside the vocabulary [0, {vocab})"
            )
        return Sequence(request, limit=min(request.params.max_new_tokens, self.max_context - n))

    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy new weights into the model in place (between generate calls).

        Keys are the model's own state_dict keys. Tied weights (lm_head tied to the embedding) may
        come under either name or both; if both, they must be equal.
        """
        own = self.model.state_dict(keep_vars=True)
        unknown = sorted(set(state_dict) - set(own))
        if unknown:
            raise ValueError(f"state_dict: unknown keys {unknown[:5]}; expected the model's state_dict keys")
        groups: dict[int, list[str]] = {}
        for name, tensor in own.items():
            groups.setdefault(id(tensor), []).append(name)
        for names in groups.values():
            given = [n for n in names if n in state_dict]
            if not given:
                raise ValueError(f"state_dict: missing key {names[0]!r}")
            source = state_dict[given[0]]
            if any(not torch.equal(state_dict[n], source) for n in given[1:]):
                raise ValueError(f"state_dict: tied keys {given} must hold equal tensors")
            target = own[names[0]]
            if tuple(source.shape) != tuple(target.shape):
                raise ValueError(
                    f"state_dict: {given[0]!r} has shape {tuple(source.shape)}, model expects {tuple(target.shape)}"
                )
            target.copy_(source)
        log.debug("loaded %d weight tensors in place", len(groups))


class _Progress:
    """What `halt` is asked with: the tokens each request of a generation has so far, the finished ones."""

    def __init__(self, sequences: list[Sequence]) -> None:
        self.sequences = sequences

    def read(self) -> tuple[dict[str, int], set[str]]:
        lengths = {s.request.request_id: len(s.tokens) for s in self.sequences}
        done = {s.request.request_id for s in self.sequences if s.finish_reason in ("stop", "length")}
        return lengths, done


def _not_started(sequences: list[Sequence]) -> list[Completion]:
    """Completions of sequences a halt ended before their wave started: no tokens, finish reason "abort"."""
    return [
        Completion(s.request.request_id, list(s.request.prompt_ids), [], torch.zeros(0), None, "abort")
        for s in sequences
    ]


def _generated(batch: RunningBatch) -> int:
    return sum(len(s.tokens) for s in batch.all_sequences)
