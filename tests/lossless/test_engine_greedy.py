"""Greedy decoding with the engine equals `transformers` generate token for token (float64), for every
sequence of a batch against an unpadded batch-1 run, with stop tokens and per-request limits, while
finished rows leave the shrinking batch."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from tlt.models.tiny import tiny_model
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request, SamplingParams

MAX_NEW = 14


def hf_greedy(model, prompt: list[int], max_new: int, stop: tuple[int, ...]) -> list[int]:
    model.generation_config.eos_token_id = None  # stop only where asked (the config's eos would stop too)
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=list(stop) or None, pad_token_id=0)
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt) :].tolist()


def make_prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 13, (n,), generator=g).tolist()
    return [torch.randint(3, 64, (k,), generator=g).tolist() for k in lengths]


def pick_stop_token(outputs: list[list[int]]) -> int:
    """A token some greedy outputs contain (so those rows stop early) and others do not."""
    for token in range(64):
        hits = sum(token in out for out in outputs)
        if 0 < hits < len(outputs):
            return token
    raise AssertionError("no token splits the outputs; choose another seed")


def truncate_at_stop(tokens: list[int], stop: tuple[int, ...]) -> list[int]:
    """What greedy generation with these stop tokens emits: everything up to and including the first stop."""
    cut = next((i for i, t in enumerate(tokens) if t in stop), len(tokens) - 1)
    return tokens[: cut + 1]


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama"])
def model(request):
    return tiny_model(request.param, dtype=torch.float64, seed=3)


@pytest.fixture(scope="module")
def case(model):
    """Prompts of different lengths, per-request limits, HF's unpadded batch-1 greedy outputs, a stop token."""
    prompts = make_prompts(8, seed=11)
    limits = [MAX_NEW - (i % 3) * 4 for i in range(len(prompts))]
    free_run = [hf_greedy(model, p, n, ()) for p, n in zip(prompts, limits)]
    assert [len(f) for f in free_run] == limits
    stop = (pick_stop_token(free_run),)
    assert truncate_at_stop(free_run[0], stop) == hf_greedy(model, prompts[0], limits[0], stop)
    return prompts, limits, free_run, stop


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_equals_hf_generate_with_stops_and_limits(model, case, batch):
    prompts, limits, free_run, stop = case
    requests = [
        Request(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=n, stop_token_ids=stop))
        for i, (p, n) in enumerate(zip(prompts, limits))
    ]
    sizes: list[int] = []
    engine = Engine(model, max_batch_size=batch, max_context=64)
    completions = engine.generate(requests, on_step=lambda m: sizes.append(m.running))
    reasons = set()
    for req, comp, free in zip(requests, completions, free_run):
        expected = truncate_at_stop(free, stop)
        assert comp.token_ids == expected, f"{req.request_id}: engine {comp.token_ids} != hf {expected}"
        assert comp.finish_reason == ("stop" if expected[-1] in stop else "length")
        reasons.add(comp.finish_reason)
    assert reasons == {"stop", "length"}
    if batch == 8:
        assert sizes[0] == 8 and min(sizes) < 8, "finished rows must leave the running batch"
    assert engine.tokens_processed == sum(len(p) for p in prompts) + sum(len(c.token_ids) - 1 for c in completions)


def test_waves_larger_than_max_batch_size_keep_request_order(model):
    prompts = make_prompts(5, seed=5)
    requests = [Request(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=6)) for i, p in enumerate(prompts)]
    completions = Engine(model, max_batch_size=2, max_context=64).generate(requests)
    assert [c.request_id for c in completions] == [r.request_id for r in requests]
    for p, c in zip(prompts, completions):
        assert c.token_ids == hf_greedy(model, p, 6, ())


def test_context_limit_ends_generation_with_length(model):
    prompt = list(range(3, 13))
    completion = Engine(model, max_batch_size=1, max_context=13).generate(
        [Request("r", prompt, SamplingParams(temperature=0.0, max_new_tokens=50))]
    )[0]
    assert completion.finish_reason == "length" and len(completion.token_ids) == 3
    assert completion.token_ids == hf_greedy(model, prompt, 3, ())
