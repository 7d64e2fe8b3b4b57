"""Policy update: padded response log-probs equal unpadded forwards; micro-batching is exact."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tlt.models.tiny import tiny_model
from tlt.rl.update import RolloutBatch, policy_update, response_logprobs
from tlt.spec.run import AlgorithmSpec

PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 4, 4, 4, 4, 8]]
RESPONSES = [[10, 11, 2], [12, 13, 14, 15, 16, 2], [17]]


def _unpadded_logprobs(model, prompt, response, temperature=1.0):
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].to(torch.float64) / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_padded_batch_logprobs_equal_unpadded_forwards(dtype, atol):
    model = tiny_model(seed=1, dtype=dtype)
    with torch.no_grad():
        logp, mask = response_logprobs(model, PROMPTS, RESPONSES)
        assert logp.shape == mask.shape == (3, 6)
        for row, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES)):
            want = _unpadded_logprobs(model, prompt, response)
            assert mask[row].sum() == len(response)
            torch.testing.assert_close(logp[row, : len(response)].to(torch.float64), want, atol=atol, rtol=0)
            assert torch.all(logp[row, len(response) :] == 0)


def test_logprobs_follow_the_sampling_temperature():
    model = tiny_model(seed=2, dtype=torch.float64)
    with torch.no_grad():
        logp, _ = response_logprobs(model, PROMPTS[:1], RESPONSES[:1], temperature=0.7)
        want = _unpadded_logprobs(model, PROMPTS[0], RESPONSES[0], temperature=0.7)
    torch.testing.assert_close(logp[0], want, atol=1e-12, rtol=0)


def _batch(model, advantages):
    with torch.no_grad():
        old, _ = response_logprobs(model, PROMPTS, RESPONSES)
    return RolloutBatch(PROMPTS, RESPONSES, old, torch.tensor(advantages, dtype=old.dtype))


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batched_update_equals_one_big_batch(loss_agg):
    base = tiny_model(seed=3, dtype=torch.float64)
    batch = _batch(base, [1.0, -0.5, 0.25])
    results = []
    for micro in (1, 3):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = AlgorithmSpec(micro_batch_size=micro, loss_agg=loss_agg)
        metrics = policy_update(model, opt, batch, algo, max_grad_norm=1e9)
        results.append((metrics, [p.detach().clone() for p in model.parameters()]))
    (m1, p1), (m3, p3) = results
    assert m1["loss"] == pytest.approx(m3["loss"], abs=1e-12)
    for a, b in zip(p1, p3):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_on_policy_loss_is_minus_the_token_weighted_advantage():
    model = tiny_model(seed=4, dtype=torch.float64)
    batch = _batch(model, [1.0, -0.5, 0.25])
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics = policy_update(model, opt, batch, AlgorithmSpec(micro_batch_size=2))
    # ratio 1 everywhere: token-mean loss = -(1*3 - 0.5*6 + 0.25*1) / 10
    assert metrics["policy_loss"] == pytest.approx(-(3 - 3 + 0.25) / 10)
    assert metrics["clip_fraction"] == 0.0


def test_updates_raise_the_probability_of_rewarded_responses():
    model = tiny_model(seed=5)
    batch = _batch(model, [1.0, -1.0, 0.0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        policy_update(model, opt, batch, AlgorithmSpec(micro_batch_size=2))
    with torch.no_grad():
        new, _ = response_logprobs(model, PROMPTS, RESPONSES)
    assert new[0].sum() > batch.old_logprobs[0].sum()
    assert new[1].sum() < batch.old_logprobs[1].sum()


def test_kl_without_reference_is_refused():
    model = tiny_model(seed=6)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_update(model, opt, _batch(model, [1.0, 0.0, -1.0]), AlgorithmSpec(kl_coef=0.1))


def test_kl_term_is_reported_against_a_reference():
    model = tiny_model(seed=7, dtype=torch.float64)
    batch = _batch(model, [1.0, 0.0, -1.0])
    batch.ref_logprobs = batch.old_logprobs - 0.1 * torch.ones_like(batch.old_logprobs)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics = policy_update(model, opt, batch, AlgorithmSpec(kl_coef=0.1))
    assert metrics["kl"] == pytest.approx(math.exp(-0.1) + 0.1 - 1, rel=1e-9)


def test_batch_shapes_are_checked():
    with pytest.raises(ValueError, match="old_logprobs must be"):
        RolloutBatch(PROMPTS, RESPONSES, torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(ValueError, match="batch sizes disagree"):
        RolloutBatch(PROMPTS, RESPONSES, torch.zeros(3, 6), torch.zeros(2))
