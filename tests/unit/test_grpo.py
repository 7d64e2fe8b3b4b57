"""GRPO pure functions against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from tlt.rl.grpo import aggregate, clipped_surrogate, group_advantages, grpo_loss, kl_k3


def test_group_advantages_normalise_within_each_group():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [3.0, 3.0, 3.0, 3.0]])
    adv = group_advantages(rewards, eps=0.0 + 1e-12)
    # mean 0.5, unbiased std sqrt(1/3): 0.5 / 0.57735 = 0.866025
    assert torch.allclose(adv[0], torch.tensor([0.866025, -0.866025, 0.866025, -0.866025]), atol=1e-5)
    assert torch.equal(adv[1], torch.zeros(4)), "a group with equal rewards carries no signal"


def test_group_advantages_without_std_only_centre():
    adv = group_advantages(torch.tensor([[2.0, 0.0, 1.0]]), normalize_std=False)
    assert torch.equal(adv, torch.tensor([[1.0, -1.0, 0.0]]))


def test_group_advantages_need_a_group():
    with pytest.raises(ValueError, match=r"\[P, G\] with G >= 2"):
        group_advantages(torch.ones(4))


def test_clipped_surrogate_clips_separately_below_and_above():
    logp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, clipped = clipped_surrogate(logp, old, adv, clip_low=0.2, clip_high=0.28)
    # ratio 1.5, A=+1 -> -min(1.5, 1.28) = -1.28 (clipped); A=-1 -> -min(-1.5, -1.28) = 1.5
    # ratio 0.5, A=+1 -> -min(0.5, 0.8) = -0.5; A=-1 -> -min(-0.5, -0.8) = 0.8 (clipped)
    assert torch.allclose(loss, torch.tensor([[-1.28, 1.5, -0.5, 0.8]]), atol=1e-6)
    assert clipped.tolist() == [[True, False, False, True]]


def test_clipped_surrogate_takes_per_sequence_advantages():
    logp = torch.zeros(2, 3)
    loss, _ = clipped_surrogate(logp, logp, torch.tensor([2.0, -1.0]), clip_low=0.2, clip_high=0.2)
    assert torch.equal(loss, torch.tensor([[-2.0] * 3, [1.0] * 3]))


def test_kl_k3_matches_hand_value_and_is_zero_at_equality():
    kl = kl_k3(torch.log(torch.tensor([[0.5, 0.3]])), torch.log(torch.tensor([[0.25, 0.3]])))
    # r = 0.25/0.5: r - log r - 1 = 0.5 + 0.693147 - 1
    assert torch.allclose(kl, torch.tensor([[0.5 + math.log(2) - 1, 0.0]]), atol=1e-6)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, value",
    [("token-mean", 10 / 4), ("seq-mean-token-mean", (2 + 4) / 2), ("seq-mean-token-sum", (6 + 4) / 2)],
)
def test_aggregations(mode, value):
    assert aggregate(LOSS, MASK, mode).item() == pytest.approx(value)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_sums_equal_the_whole_batch(mode):
    whole = aggregate(LOSS, MASK, mode)
    parts = sum(
        aggregate(LOSS[i : i + 1], MASK[i : i + 1], mode, num_tokens=MASK.sum().item(), num_seqs=2) for i in range(2)
    )
    assert parts.item() == pytest.approx(whole.item())


def test_unknown_aggregation_is_refused():
    with pytest.raises(ValueError, match="loss_agg must be one of"):
        aggregate(LOSS, MASK, "sum")


def test_grpo_loss_adds_weighted_kl():
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    mask = torch.ones(1, 2)
    terms = grpo_loss(
        logp,
        logp.clone(),
        torch.tensor([1.0]),
        mask,
        clip_low=0.2,
        clip_high=0.2,
        loss_agg="token-mean",
        kl_coef=0.1,
        ref_logp=ref,
    )
    kl = (0.5 + math.log(2) - 1) / 2
    assert terms.policy_loss.item() == pytest.approx(-1.0)
    assert terms.kl.item() == pytest.approx(kl)
    assert terms.loss.item() == pytest.approx(-1.0 + 0.1 * kl)
    assert terms.clip_fraction.item() == 0.0


def test_grpo_loss_gradient_pushes_up_positive_advantage_tokens():
    logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    terms = grpo_loss(
        logp,
        logp.detach(),
        torch.tensor([1.0]),
        torch.tensor([[1.0, 0.0]]),
        clip_low=0.2,
        clip_high=0.2,
        loss_agg="token-mean",
    )
    terms.loss.backward()
    assert logp.grad[0, 0] < 0 and logp.grad[0, 1] == 0, "masked tokens get no gradient"


def test_kl_needs_reference():
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.zeros(1),
            torch.ones(1, 1),
            clip_low=0.2,
            clip_high=0.2,
            loss_agg="token-mean",
            kl_coef=0.1,
        )
