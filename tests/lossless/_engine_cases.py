"""The engine cases the lossless suites share: prompts, greedy requests, one engine's generate and a prefilled
batch that keeps hidden states (what drafters read)."""

from __future__ import annotations

from transformers import PreTrainedModel

from tlt.rollout.batch import RunningBatch
from tlt.rollout.decode_step import prefill
from tlt.rollout.drafting import Drafter
from tlt.rollout.engine import Engine
from tlt.rollout.sequence import Sequence
from tlt.rollout.speculative import SpeculativeStepper
from tlt.rollout.types import Request, SamplingParams

MAX_CONTEXT = 96
PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [9, 10], [11, 12, 13, 14, 11, 12, 13, 14, 11]]


def requests(max_new: tuple[int, ...] = (20, 9, 14), **params) -> list[Request]:
    return [
        Request(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=n, **params))
        for i, (p, n) in enumerate(zip(PROMPTS, max_new))
    ]


def feature_layers(drafter: Drafter | None) -> tuple[int, ...]:
    """The target layers a block chain's drafter reads (an engine for it keeps them); () for every other drafter."""
    return getattr(getattr(drafter, "drafter", None), "feature_layers", ())


def generate(model: PreTrainedModel, requests: list[Request], drafter: Drafter | None, batch_size: int = 4):
    engine = Engine(model, max_batch_size=batch_size, max_context=MAX_CONTEXT, feature_layers=feature_layers(drafter))
    stepper = None
    if drafter is not None:
        stepper = SpeculativeStepper(engine.runner, drafter)
        engine.stepper = stepper
    return engine.generate(requests), stepper


def prefilled(engine: Engine, sequences: list[Sequence]) -> RunningBatch:
    """A running batch of `sequences` on `engine`'s cache, keeping hidden states, after its prefill."""
    batch = engine.running_batch(sequences)
    prefill(engine.runner, batch)
    return batch
