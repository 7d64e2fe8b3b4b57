"""What the engine returns besides tokens: RL log-probs (full-vocabulary log_softmax(logits / T), before
top-p) also after in-place weight swaps, the target's final-norm hidden states, seeded reproducibility,
and clear errors for bad input."""

from __future__ import annotations

import copy

import pytest
import torch

from tlt.models.tiny import tiny_model
from tlt.rollout.engine import Engine
from tlt.rollout.types import Completion, Request, SamplingParams

PROMPTS = [[5, 7, 9], [11, 3, 4, 8, 20, 21, 30], [40]]


def requests(temperature: float, top_p: float, max_new: int = 10, seed0: int = 0) -> list[Request]:
    return [
        Request(f"r{i}", p, SamplingParams(temperature, top_p, max_new, (), seed0 + i)) for i, p in enumerate(PROMPTS)
    ]


def fresh_logprobs(model, completion: Completion, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each generated token, from one fp32 forward over prompt + completion."""
    ids = completion.prompt_ids + completion.token_ids
    with torch.no_grad():
        logits = model.float()(torch.tensor([ids])).logits[0].double()
    p = len(completion.prompt_ids)
    steps = torch.log_softmax(logits[p - 1 : len(ids) - 1] / (temperature or 1.0), dim=-1)
    return steps.gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_are_full_vocab_log_softmax_before_top_p(temperature, top_p):
    model = tiny_model("qwen2")
    for completion in Engine(model, max_batch_size=4, max_context=64).generate(requests(temperature, top_p)):
        torch.testing.assert_close(
            completion.logprobs.double(), fresh_logprobs(model, completion, temperature), atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("tied", [False, True])
def test_logprobs_follow_in_place_weight_swap(tied):
    old = tiny_model("llama", seed=1, tie_word_embeddings=tied)
    new = tiny_model("llama", seed=2, tie_word_embeddings=tied)
    engine = Engine(copy.deepcopy(old), max_batch_size=4, max_context=64)
    before = engine.generate(requests(1.0, 1.0))
    engine.load_weights(new.state_dict())
    after = engine.generate(requests(1.0, 1.0))
    assert any(a.token_ids != b.token_ids for a, b in zip(before, after)), "the swap must change the outputs"
    for completion in after:
        expected = fresh_logprobs(new, completion, 1.0)
        torch.testing.assert_close(completion.logprobs.double(), expected, atol=1e-5, rtol=0)
    if tied:
        assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()


def test_load_weights_rejects_missing_unknown_and_misshapen_keys():
    model = tiny_model("qwen2")
    engine = Engine(model, max_batch_size=1, max_context=16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="missing key 'model.norm.weight'"):
        engine.load_weights({k: v for k, v in state.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match="unknown keys"):
        engine.load_weights({**state, "extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights({**state, "model.norm.weight": torch.zeros(3)})


def test_hidden_states_equal_hf_final_norm_outputs():
    model = tiny_model("qwen2", dtype=torch.float64)
    completions = Engine(model, max_batch_size=3, max_context=64).generate(requests(1.0, 1.0))
    for completion in completions:
        fed = completion.prompt_ids + completion.token_ids[:-1]
        with torch.no_grad():
            expected = model(torch.tensor([fed]), output_hidden_states=True).hidden_states[-1][0]
        assert completion.hidden.shape == (len(fed), model.config.hidden_size)
        torch.testing.assert_close(completion.hidden, expected, atol=1e-9, rtol=0)


def test_return_hidden_false_returns_none():
    completion = Engine(tiny_model("qwen2"), max_batch_size=1, max_context=32, return_hidden=False).generate(
        requests(1.0, 1.0)[:1]
    )[0]
    assert completion.hidden is None


def test_seeded_sampling_is_reproducible_and_independent_of_batch_company():
    model = tiny_model("qwen2", dtype=torch.float64)
    engine = Engine(model, max_batch_size=4, max_context=64)
    first = engine.generate(requests(1.0, 0.9))
    again = engine.generate(requests(1.0, 0.9))
    alone = engine.generate(requests(1.0, 0.9)[1:2])
    other_seeds = engine.generate(requests(1.0, 0.9, seed0=100))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert alone[0].token_ids == first[1].token_ids
    assert [c.token_ids for c in first] != [c.token_ids for c in other_seeds]


def test_bad_input_is_refused_with_the_field_named():
    engine = Engine(tiny_model("qwen2"), max_batch_size=2, max_context=8)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        engine.generate([Request("empty", [])])
    with pytest.raises(ValueError, match="max_context=8"):
        engine.generate([Request("long", list(range(3, 11)))])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([Request("oov", [1000])])
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="max_batch_size"):
        Engine(tiny_model("qwen2"), max_batch_size=0, max_context=8)


def test_unsupported_model_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    with pytest.raises(ValueError, match="model_type"):
        Engine(gpt2, max_batch_size=1, max_context=8)
