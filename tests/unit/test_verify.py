"""Verification rules: greedy exact match, sampled min(1, p/q) with residual and bonus, one-hot rule, trees."""

from __future__ import annotations

import pytest
import torch

from tlt.rollout.verify import (
    sample_from,
    verify_deterministic_chain,
    verify_greedy,
    verify_sampled,
    verify_tree,
)

V = 4


def one_hot(tokens: list[int]) -> torch.Tensor:
    """[1, len, V] float64 one-hot rows."""
    return torch.nn.functional.one_hot(torch.tensor([tokens]), V).double()


def freq(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=V).double() / tokens.numel()


def within(observed: torch.Tensor, expected: torch.Tensor, n: int) -> bool:
    """Frequencies within 5 binomial standard deviations (plus a hair) of their expectation."""
    sigma = (expected * (1 - expected) / n).sqrt()
    return bool(((observed - expected).abs() <= 5 * sigma + 1e-9).all())


def test_greedy_accepts_matching_prefix_and_emits_target_argmax():
    target = one_hot([1, 2, 3, 0])  # argmax per position
    verdict = verify_greedy(target, torch.tensor([[1, 2, 0]]))
    assert verdict.n_accepted.tolist() == [2]
    assert verdict.next_token.tolist() == [3]  # the correction at the first mismatch


def test_greedy_all_accepted_emits_bonus_from_last_position():
    verdict = verify_greedy(one_hot([1, 2, 3]), torch.tensor([[1, 2]]))
    assert verdict.n_accepted.tolist() == [2] and verdict.next_token.tolist() == [3]


def test_greedy_never_accepts_padding_beyond_n_draft():
    target = torch.cat([one_hot([1, 2, 3]), one_hot([1, 2, 3])])
    draft = torch.tensor([[1, 2], [1, 2]])
    verdict = verify_greedy(target, draft, n_draft=torch.tensor([2, 1]))
    assert verdict.n_accepted.tolist() == [2, 1]
    assert verdict.next_token.tolist() == [3, 2]


def test_greedy_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\[B, K\+1, V\]"):
        verify_greedy(torch.zeros(1, 3, V), torch.zeros(1, 3, dtype=torch.long))


def test_sampled_accepts_everything_when_drafter_equals_target():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 4, V, dtype=torch.float64), -1)
    draft = torch.stack([sample_from(p[:, i], g) for i in range(3)], 1)
    verdict = verify_sampled(p, p[:, :3], draft, g)
    assert verdict.n_accepted.tolist() == [3] * 64


def test_sampled_rejects_token_the_target_cannot_emit_and_never_emits_it():
    g = torch.Generator().manual_seed(0)
    n = 2000
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25] * 4]], dtype=torch.float64).expand(n, 2, V)
    q = torch.tensor([[[0.7, 0.1, 0.1, 0.1]]], dtype=torch.float64).expand(n, 1, V)
    draft = torch.zeros(n, 1, dtype=torch.long)  # p(0) = 0
    verdict = verify_sampled(p, q, draft, g)
    assert verdict.n_accepted.sum() == 0
    assert bool((verdict.next_token != 0).all()) and bool((verdict.next_token != 3).all())


def test_sampled_first_token_marginal_equals_target_and_accept_rate_is_min_one_p_over_q():
    g = torch.Generator().manual_seed(1)
    n = 200_000
    p0 = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q0 = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    p = torch.stack([p0, torch.full((V,), 0.25, dtype=torch.float64)]).expand(n, 2, V)
    q = q0.expand(n, 1, V)
    draft = sample_from(q[:, 0], g)[:, None]
    verdict = verify_sampled(p, q, draft, g)
    first = torch.where(verdict.n_accepted == 1, draft[:, 0], verdict.next_token)
    assert within(freq(first), p0, n)
    accept_rate = torch.minimum(torch.ones(V, dtype=torch.float64), p0 / q0)
    expected_accept = float((q0 * accept_rate).sum())
    assert abs(float(verdict.n_accepted.double().mean()) - expected_accept) < 5 * (0.25 / n) ** 0.5


def test_sampled_with_per_row_generators_depends_only_on_own_generator():
    p = torch.softmax(torch.randn(3, 3, V, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(3, 2, V, dtype=torch.float64), -1)
    draft = torch.tensor([[0, 1], [2, 3], [1, 1]])
    batch = verify_sampled(p, q, draft, [torch.Generator().manual_seed(s) for s in (5, 6, 7)])
    alone = verify_sampled(p[1:2], q[1:2], draft[1:2], [torch.Generator().manual_seed(6)])
    assert batch.n_accepted[1] == alone.n_accepted[0] and batch.next_token[1] == alone.next_token[0]


def test_sampled_requires_one_generator_per_row():
    p = torch.full((2, 2, V), 0.25, dtype=torch.float64)
    with pytest.raises(ValueError, match="one generator per row"):
        verify_sampled(p, p[:, :1], torch.zeros(2, 1, dtype=torch.long), [torch.Generator()])


def test_deterministic_chain_accepts_certain_tokens_and_bonus_comes_from_last_position():
    g = torch.Generator().manual_seed(0)
    verdict = verify_deterministic_chain(one_hot([1, 2, 3]), torch.tensor([[1, 2]]), g)
    assert verdict.n_accepted.tolist() == [2] and verdict.next_token.tolist() == [3]


def test_deterministic_chain_rejected_token_is_removed_from_the_resample():
    g = torch.Generator().manual_seed(0)
    n = 5000
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25] * 4], dtype=torch.float64).expand(n, 2, V)
    verdict = verify_deterministic_chain(p, torch.zeros(n, 1, dtype=torch.long), g)
    rejected = verdict.n_accepted == 0
    assert bool((verdict.next_token[rejected] == 1).all())  # p with token 0 removed leaves only 1
    assert 0.45 < float(rejected.double().mean()) < 0.55


def test_deterministic_chain_without_drafts_samples_from_first_position():
    g = torch.Generator().manual_seed(0)
    verdict = verify_deterministic_chain(one_hot([3, 1, 1]), torch.tensor([[3, 1]]), g, n_draft=torch.tensor([0]))
    assert verdict.n_accepted.tolist() == [0] and verdict.next_token.tolist() == [3]


def _two_branch_tree() -> tuple[torch.Tensor, torch.Tensor]:
    """root(0) -> a(1)=tok 1, b(2)=tok 2; b -> c(3)=tok 3; a -> d(4)=tok 0."""
    tokens = torch.tensor([[9 % V, 1, 2, 3, 0]])
    parents = torch.tensor([[-1, 0, 0, 2, 1]])
    return tokens, parents


def test_tree_greedy_follows_a_non_first_branch():
    tokens, parents = _two_branch_tree()
    # target argmax: at root -> 2 (node b), at b -> 3 (node c), at c -> 1 (bonus); others arbitrary
    p = one_hot([2, 0, 3, 1, 2])
    verdict = verify_tree(p, tokens, parents, None, greedy=True)
    assert verdict.path[0, :2].tolist() == [2, 3]
    assert verdict.n_accepted.tolist() == [2]
    assert verdict.next_token.tolist() == [1]
    assert verdict.last_node.tolist() == [3]


def test_tree_deterministic_tries_next_sibling_after_certain_rejection():
    tokens, parents = _two_branch_tree()
    p = one_hot([2, 0, 3, 1, 2])  # root puts all mass on token 2: node a (token 1) must be rejected
    verdict = verify_tree(p, tokens, parents, torch.Generator().manual_seed(0))
    assert verdict.path[0, :2].tolist() == [2, 3]
    assert verdict.next_token.tolist() == [1]


def test_tree_deterministic_first_token_marginal_equals_target():
    g = torch.Generator().manual_seed(3)
    n = 200_000
    p0 = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    tokens = torch.tensor([[0, 3, 1]]).expand(n, 3)  # two siblings under the root: tokens 3 then 1
    parents = torch.tensor([[-1, 0, 0]]).expand(n, 3)
    p = torch.stack([p0, torch.full((V,), 0.25, dtype=torch.float64), torch.full((V,), 0.25, dtype=torch.float64)])
    verdict = verify_tree(p.expand(n, 3, V), tokens, parents, g)
    first = torch.where(
        verdict.n_accepted > 0, tokens.gather(1, verdict.path[:, :1].clamp_min(0))[:, 0], verdict.next_token
    )
    assert within(freq(first), p0, n)
    # after rejecting both siblings the residual holds only tokens 0 and 2
    rejected = verdict.n_accepted == 0
    assert set(verdict.next_token[rejected].unique().tolist()) <= {0, 2}


def test_tree_with_padding_nodes_ignores_them():
    tokens = torch.tensor([[0, 2, 0, 0]])
    parents = torch.tensor([[-1, 0, -1, -1]])
    verdict = verify_tree(one_hot([2, 3, 0, 0]), tokens, parents, None, greedy=True)
    assert verdict.n_accepted.tolist() == [1] and verdict.next_token.tolist() == [3]


def test_tree_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="tree verification"):
        verify_tree(
            torch.zeros(1, 3, V), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long), None
        )
