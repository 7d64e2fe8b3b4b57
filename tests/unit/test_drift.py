"""Held-out policy drift: KL(step 0 || step t) is 0 for the same policy, grows when weights move,
matches a direct computation, and reads only response positions."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tlt.bench.drift import policy_kl, response_batch
from tlt.models.tiny import tiny_model


@pytest.fixture(scope="module")
def pair():
    ref = tiny_model("qwen2", dtype=torch.float64, vocab_size=16, seed=2)
    moved = copy.deepcopy(ref)
    with torch.no_grad():
        moved.lm_head.weight.add_(0.3 * torch.randn_like(moved.lm_head.weight))
    return ref, moved


SEQS = [([1, 2, 3], [4, 5]), ([6, 7], [8, 9, 10, 11])]


def test_same_policy_has_zero_kl(pair):
    ref, _ = pair
    assert policy_kl(ref, ref, *response_batch(SEQS)) == pytest.approx(0.0, abs=1e-12)


def test_kl_equals_a_direct_computation_over_response_positions(pair):
    ref, moved = pair
    got = policy_kl(ref, moved, *response_batch(SEQS), temperature=0.7)
    terms = []
    for prompt, response in SEQS:
        ids = torch.tensor([prompt + response])
        p = F.log_softmax(ref(input_ids=ids).logits[0] / 0.7, -1)
        q = F.log_softmax(moved(input_ids=ids).logits[0] / 0.7, -1)
        for t in range(len(prompt) - 1, len(prompt) + len(response) - 1):
            terms.append(float((p[t].exp() * (p[t] - q[t])).sum()))
    assert got == pytest.approx(sum(terms) / len(terms), rel=1e-9)
    assert got > 0


def test_positions_mark_the_tokens_before_each_response_token():
    ids, attention, positions = response_batch(SEQS)
    assert positions[0].tolist() == [False, False, True, True, False, False]
    assert attention[0].tolist() == [1, 1, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="selects no token"):
        policy_kl(None, None, ids, attention, torch.zeros_like(positions))
