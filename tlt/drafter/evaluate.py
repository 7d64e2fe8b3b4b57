"""Measure a drafter against its policy: accept length and speedup of speculative decoding.

The same requests (same per-request seeds) run twice through the rollout engine: plainly, and
with the EAGLE chain drafter in the speculative stepper. Accept length is the mean number of
tokens a row gains per target forward (accepted drafts plus the next token); speedup is the plain
wall time over the speculative one, after one warm-up request per engine. Greedy runs also report
whether both produced the same tokens (they must: decoding is lossless; in bfloat16 near-ties may
round differently between 1-token and k-token forwards, so prove equality in float32/float64).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.models.drafter import EagleDrafter
from tlt.rollout.drafting import EagleChainDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.speculative import AcceptanceStats, SpeculativeStepper
from tlt.rollout.types import Completion, Request, SamplingParams
from tlt.tasks.problem import Problem
from tlt.tasks.prompt_format import encode_prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrafterEvaluation:
    """What one evaluation measured (`as_metrics` flattens it for a metrics sink)."""

    prompts: int
    draft_tokens: int
    batch_size: int
    temperature: float
    new_tokens: int
    accept_length: float
    plain_seconds: float
    speculative_seconds: float
    speedup: float
    plain_tokens_per_second: float
    speculative_tokens_per_second: float
    outputs_equal: bool

    def as_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def speculative_engine(
    policy: PreTrainedModel, drafter: EagleDrafter, *, draft_tokens: int, max_batch_size: int, max_context: int
) -> Engine:
    """An engine over `policy` whose stepper drafts `draft_tokens`-long EAGLE chains with `drafter`."""
    engine = Engine(policy, max_batch_size=max_batch_size, max_context=max_context, return_hidden=True)
    chain = EagleChainDrafter(drafter, policy.get_input_embeddings(), draft_tokens, max_batch_size, max_context)
    engine.stepper = SpeculativeStepper(engine.runner, chain)
    return engine


def make_requests(
    tokenizer: PreTrainedTokenizerBase, problems: list[Problem], *, max_new_tokens: int, temperature: float, seed: int
) -> list[Request]:
    """One request per problem, tokenized as the RL loop does (`encode_prompt`), stopping at eos,
    with a seed per request."""
    stop = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    return [
        Request(
            f"eval-{i}",
            encode_prompt(tokenizer, p),
            SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop_token_ids=stop, seed=seed + i),
        )
        for i, p in enumerate(problems)
    ]


def _timed(engine: Engine, requests: list[Request]) -> tuple[list[Completion], float]:
    """Completions and wall seconds of `requests`, after a one-request warm-up (first-call
    allocations are not decoding speed; a speculative stepper's counters restart after it)."""
    engine.generate(requests[:1])
    if isinstance(engine.stepper, SpeculativeStepper):
        engine.stepper.stats = AcceptanceStats()
    started = time.perf_counter()
    completions = engine.generate(requests)
    return completions, time.perf_counter() - started


@torch.inference_mode()
def evaluate_drafter(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    drafter: EagleDrafter,
    problems: list[Problem],
    *,
    draft_tokens: int = 4,
    max_new_tokens: int = 128,
    batch_size: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
) -> DrafterEvaluation:
    """Run `problems` plainly and speculatively with `drafter` (bound to `policy`); see the module doc."""
    if not problems:
        raise ValueError("evaluate_drafter needs at least one problem")
    if draft_tokens < 1 or batch_size < 1 or max_new_tokens < 1:
        raise ValueError(
            "draft_tokens, batch_size and max_new_tokens must be >= 1; "
            f"got {draft_tokens}, {batch_size}, {max_new_tokens}"
        )
    requests = make_requests(tokenizer, problems, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    longest = max(len(r.prompt_ids) for r in requests)
    context = min(policy.config.max_position_embeddings, longest + max_new_tokens + draft_tokens + 1)
    drafter = copy.deepcopy(drafter).to(policy.dtype)
    drafter.bind_policy(policy)

    plain = Engine(policy, max_batch_size=batch_size, max_context=context, return_hidden=False)
    plain_out, plain_seconds = _timed(plain, requests)
    spec = speculative_engine(
        policy, drafter, draft_tokens=draft_tokens, max_batch_size=batch_size, max_context=context
    )
    spec_out, spec_seconds = _timed(spec, requests)
    stats = spec.stepper.stats  # type: ignore[attr-defined]  # the SpeculativeStepper installed above

    new_tokens = sum(len(c.token_ids) for c in spec_out)
    result = DrafterEvaluation(
        prompts=len(problems),
        draft_tokens=draft_tokens,
        batch_size=batch_size,
        temperature=temperature,
        new_tokens=new_tokens,
        accept_length=stats.accept_length,
        plain_seconds=plain_seconds,
        speculative_seconds=spec_seconds,
        speedup=plain_seconds / spec_seconds if spec_seconds > 0 else 0.0,
        plain_tokens_per_second=sum(len(c.token_ids) for c in plain_out) / plain_seconds if plain_seconds > 0 else 0.0,
        speculative_tokens_per_second=new_tokens / spec_seconds if spec_seconds > 0 else 0.0,
        outputs_equal=[c.token_ids for c in plain_out] == [c.token_ids for c in spec_out],
    )
    log.info(
        "drafter evaluation: accept length %.2f, speedup %.2fx over %d prompts",
        result.accept_length,
        result.speedup,
        result.prompts,
    )
    return result
