"""Update layouts: sorted and packed micro-batches give the padded path's log-probs and gradients."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tlt.models.tiny import tiny_model
from tlt.rl.packing import forward_inputs, micro_batches
from tlt.rl.update import RolloutBatch, policy_update, response_logprobs
from tlt.runtime.rl_step import policy_logprobs
from tlt.spec.run import AlgorithmSpec


def _long_tail_batch(count: int = 10, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of 2-6 tokens; responses mostly 1-5 tokens, one of 40 and one of 25 (the tail)."""
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(4, 64) for _ in range(rng.randrange(1, 6))] for _ in range(count)]
    lengths = [rng.randrange(1, 6) for _ in range(count - 2)] + [40, 25]
    rng.shuffle(lengths)
    responses = [[rng.randrange(3, 64) for _ in range(n)] for n in lengths]
    return prompts, responses


def test_micro_batches_sort_longest_first_and_keep_their_size():
    assert micro_batches([3, 9, 1, 9, 5], 2, "padded") == [[0, 1], [2, 3], [4]]
    assert micro_batches([3, 9, 1, 9, 5], 2, "sorted") == [[1, 3], [4, 0], [2]]
    assert micro_batches([3, 9, 1, 9, 5], 2, "packed") == [[1, 3], [4, 0], [2]]
    assert micro_batches([], 4, "packed") == []


def test_micro_batches_reject_bad_arguments():
    with pytest.raises(ValueError, match="updateLayout"):
        micro_batches([1], 1, "ragged")
    with pytest.raises(ValueError, match="micro-batch size"):
        micro_batches([1], 0, "sorted")


def test_packed_inputs_restart_positions_and_point_at_each_response():
    inputs = forward_inputs([[1, 5], [1]], [[7, 8, 9], [6]], packed=True)
    assert inputs.attention_mask is None
    assert inputs.input_ids.tolist() == [[1, 5, 7, 8, 9, 1, 6]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    # logits at 1, 2, 3 predict 7, 8, 9; sequence 2's only response token is predicted at 5
    assert inputs.flat_index[0].tolist() == [1, 2, 3]
    assert inputs.flat_index[1, 0].item() == 5
    assert inputs.targets.tolist() == [[7, 8, 9], [6, 0, 0]]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_packed_logprobs_equal_padded_on_a_long_tail(family):
    model = tiny_model(family, seed=7, dtype=torch.float64)
    prompts, responses = _long_tail_batch()
    with torch.no_grad():
        padded, mask = response_logprobs(model, prompts, responses)
        packed, packed_mask = response_logprobs(model, prompts, responses, packed=True)
    assert torch.equal(mask, packed_mask)
    torch.testing.assert_close(packed, padded, atol=1e-12, rtol=0)


def _rollout_batch(model: torch.nn.Module) -> RolloutBatch:
    prompts, responses = _long_tail_batch(seed=3)
    with torch.no_grad():
        exact, mask = response_logprobs(model, prompts, responses)
    noise = 0.05 * torch.randn(exact.shape, generator=torch.Generator().manual_seed(0), dtype=exact.dtype)
    advantages = torch.linspace(-1.0, 1.0, len(prompts), dtype=exact.dtype)
    # old log-probs off the policy's (so ratios clip somewhere), the reference at the policy's
    return RolloutBatch(prompts, responses, (exact + noise) * mask, advantages, ref_logprobs=exact)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_sorted_and_packed_updates_equal_the_padded_update(loss_agg):
    base = tiny_model(seed=11, dtype=torch.float64)
    batch = _rollout_batch(base)
    grads, params, metrics = {}, {}, {}
    for layout in ("padded", "sorted", "packed"):
        model = copy.deepcopy(base)
        algo = AlgorithmSpec(micro_batch_size=3, loss_agg=loss_agg, kl_coef=0.1, update_layout=layout)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        metrics[layout] = policy_update(model, opt, batch, algo, max_grad_norm=1e9)
        params[layout] = [p.detach().clone() for p in model.parameters()]
        grads[layout] = [b - a for a, b in zip(params[layout], [p.detach() for p in base.parameters()])]
        assert any(float(g.abs().max()) > 1e-6 for g in grads[layout])  # the update did move the policy
    for layout in ("sorted", "packed"):
        for want, got in zip(grads["padded"], grads[layout]):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        for name in ("loss", "policy_loss", "kl", "clip_fraction", "grad_norm"):
            assert metrics[layout][name] == pytest.approx(metrics["padded"][name], abs=1e-12)


def test_policy_logprobs_land_in_batch_order_in_every_layout():
    model = tiny_model(seed=13, dtype=torch.float64)
    batch = _rollout_batch(model)
    outs = {
        layout: policy_logprobs(model, batch, AlgorithmSpec(micro_batch_size=4, update_layout=layout), pad_id=0)
        for layout in ("padded", "sorted", "packed")
    }
    for layout in ("sorted", "packed"):
        torch.testing.assert_close(outs[layout], outs["padded"], atol=1e-12, rtol=0)
