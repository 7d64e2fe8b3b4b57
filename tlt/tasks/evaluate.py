"""Measuring a policy on task problems with Hugging Face `generate`: greedy accuracy, sampled lengths.

Problems are batched by prompt length, so batches need no padding (for the built-in task the
prompt length also groups problems of similar response length).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from tlt.tasks.problem import Problem
from tlt.tasks.prompt_format import encode_prompt

Verifier = Callable[[str, str], float]


def _same_length_batches(
    tokenizer: PreTrainedTokenizerFast, problems: list[Problem], batch_size: int
) -> Iterator[tuple[list[int], torch.Tensor]]:
    """(indices into `problems`, prompt ids [B, L]) for groups of equal prompt length."""
    groups: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
    for index, problem in enumerate(problems):
        ids = encode_prompt(tokenizer, problem)
        groups[len(ids)].append((index, ids))
    for _, members in sorted(groups.items()):
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            yield [i for i, _ in chunk], torch.tensor([ids for _, ids in chunk])


@torch.inference_mode()
def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[Problem],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 64,
) -> list[list[int]]:
    """Response token ids per problem (up to and including eos when produced); greedy at temperature 0."""
    torch.manual_seed(seed)
    responses: list[list[int]] = [[] for _ in problems]
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    else:
        sampling = {"do_sample": False}
    for indices, prompt_ids in _same_length_batches(tokenizer, problems, batch_size):
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
        for row, index in enumerate(indices):
            ids = out[row, prompt_ids.shape[1] :].tolist()
            if tokenizer.eos_token_id in ids:
                ids = ids[: ids.index(tokenizer.eos_token_id) + 1]
            responses[index] = ids
    return responses


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[Problem],
    verifier: Verifier,
    max_new_tokens: int,
) -> float:
    """Fraction of `problems` whose greedy response the verifier accepts against the reference answer."""
    responses = generate_responses(model, tokenizer, problems, max_new_tokens)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    return sum(verifier(text, p.answer) for text, p in zip(texts, problems)) / len(problems)


def sample_lengths(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[Problem],
    max_new_tokens: int,
    *,
    seed: int = 0,
) -> list[int]:
    """Response lengths in tokens (eos included) of the policy's own samples at temperature 1."""
    responses = generate_responses(model, tokenizer, problems, max_new_tokens, temperature=1.0, seed=seed)
    return [len(r) for r in responses]


def length_stats(lengths: list[int]) -> dict[str, float]:
    """p50 / p90 / p99 / max / mean of a list of lengths (nearest-rank percentiles)."""
    if not lengths:
        raise ValueError("length_stats needs at least one length")
    ordered = sorted(lengths)

    def pct(q: float) -> int:
        return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]

    return {
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "max": ordered[-1],
        "mean": round(sum(ordered) / len(ordered), 1),
    }
