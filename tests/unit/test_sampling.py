"""Sampling promises: temperature/top-p processing, greedy one-hot, seeded reproducibility, RL log-probs."""

from __future__ import annotations

import torch

from tlt.rollout.sampling import process_logits, sample_from, sample_tokens, token_logprobs, top_p_filter, uniforms


def test_temperature_zero_is_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0]])
    probs = process_logits(logits, torch.tensor([0.0, 1.0]))
    assert probs[0].tolist() == [0.0, 1.0, 0.0]
    torch.testing.assert_close(probs[1], torch.softmax(logits[1], -1))


def test_temperature_scales_logits_before_softmax():
    logits = torch.randn(4, 10)
    probs = process_logits(logits, torch.full((4,), 0.5))
    torch.testing.assert_close(probs, torch.softmax(logits / 0.5, -1))


def test_top_p_keeps_smallest_set_reaching_mass_and_renormalises():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = top_p_filter(probs, torch.tensor([0.8]))
    torch.testing.assert_close(kept, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    only_top = top_p_filter(probs, torch.tensor([0.1]))
    assert only_top.tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_process_logits_works_on_query_dimension():
    logits = torch.randn(2, 3, 7)
    probs = process_logits(logits, torch.tensor([0.0, 0.7]), torch.tensor([1.0, 0.9]))
    assert probs.shape == (2, 3, 7)
    assert torch.equal(probs[0].argmax(-1), logits[0].argmax(-1)) and torch.all(probs[0].max(-1).values == 1)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))


def test_sample_from_never_picks_zero_probability_and_matches_distribution():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75]]).expand(20000, 4)
    tokens = sample_from(probs, torch.rand(20000, dtype=torch.float64))
    counts = torch.bincount(tokens, minlength=4).double() / 20000
    assert counts[0] == 0 and counts[2] == 0
    assert abs(counts[1].item() - 0.25) < 0.02


def test_seeded_generators_reproduce_and_rows_are_independent_of_company():
    logits = torch.randn(3, 50)
    t = torch.ones(3)

    def gens(seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    a, _ = sample_tokens(logits, t, None, uniforms(gens([1, 2, 3]), 1, "cpu")[:, 0])
    b, _ = sample_tokens(logits, t, None, uniforms(gens([1, 2, 3]), 1, "cpu")[:, 0])
    alone, _ = sample_tokens(logits[1:2], t[:1], None, uniforms(gens([2]), 1, "cpu")[:, 0])
    assert torch.equal(a, b)
    assert a[1] == alone[0]
    assert uniforms(gens([5]), 3, "cpu").shape == (1, 3)
    # a row's stream is a prefix-stable sequence: drawing more uniforms never changes the earlier ones
    assert torch.equal(uniforms(gens([5]), 3, "cpu")[0], uniforms(gens([5]), 8, "cpu")[0, :3])


def test_logprobs_are_full_vocab_log_softmax_before_top_p():
    logits = torch.randn(2, 30)
    t = torch.tensor([0.7, 1.0])
    tokens, logprobs = sample_tokens(logits, t, torch.tensor([0.9, 0.9]), torch.tensor([0.3, 0.8], dtype=torch.float64))
    expected = torch.log_softmax(logits / t[:, None], -1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(logprobs, expected)


def test_greedy_logprobs_use_temperature_one():
    logits = torch.randn(1, 9)
    tokens, logprobs = sample_tokens(logits, torch.zeros(1), None, None)
    assert tokens.item() == logits.argmax().item()
    torch.testing.assert_close(logprobs, token_logprobs(logits, tokens, torch.ones(1)))


def test_all_greedy_fast_path_equals_the_general_path_at_temperature_zero():
    """u=None (every row greedy) skips the scaling pass: same tokens, same log-probs as a sampling call whose
    rows all have temperature 0 (those ignore their uniforms)."""
    logits = torch.randn(3, 4, 17, dtype=torch.float64)
    zero = torch.zeros(3, dtype=torch.float64)
    fast = sample_tokens(logits, zero, None, None)
    general = sample_tokens(logits, zero, None, torch.full((3, 4), 0.5, dtype=torch.float64))
    assert torch.equal(fast[0], general[0])
    torch.testing.assert_close(fast[1], general[1], rtol=0, atol=1e-12)
