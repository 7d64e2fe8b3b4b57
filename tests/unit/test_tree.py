"""Draft trees: budgeted selection, layout, ancestor mask, attention over the cache, positions, compaction."""

from __future__ import annotations

import pytest
import torch

from tlt.rollout.tree import (
    DraftTree,
    ancestor_mask,
    build_tree,
    chain_tree,
    compaction_slots,
    tree_attention_mask,
    tree_positions,
)

# Candidates (index: token, parent, log-prob -> path score):
#   0: A=10 root  -0.1 -> -0.1     1: B=11 root  -1.0 -> -1.0
#   2: C=12 of A  -0.2 -> -0.3     3: D=13 of A  -2.0 -> -2.1     4: E=14 of B  -0.1 -> -1.1
CAND_TOKENS = torch.tensor([[10, 11, 12, 13, 14]])
CAND_PARENTS = torch.tensor([[-1, -1, 0, 0, 1]])
CAND_LOGPROBS = torch.tensor([[-0.1, -1.0, -0.2, -2.0, -0.1]])


def _build(budget: int) -> DraftTree:
    return build_tree(torch.tensor([7]), CAND_TOKENS, CAND_PARENTS, CAND_LOGPROBS, budget)


def test_build_tree_keeps_the_most_likely_paths_within_budget():
    tree = _build(3)  # A (-0.1), C (-0.3), B (-1.0)
    assert tree.tokens.tolist() == [[7, 10, 11, 12]]  # by depth, then score
    assert tree.parents.tolist() == [[-1, 0, 0, 1]]
    assert tree.depth.tolist() == [[0, 1, 1, 2]]
    assert tree.valid.all()


def test_build_tree_orders_siblings_by_score_and_remaps_parents():
    tree = _build(4)  # + E (-1.1) under B
    assert tree.tokens.tolist() == [[7, 10, 11, 12, 14]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2]]


def test_build_tree_is_ancestor_closed_when_child_ties_parent():
    # child of candidate 1 has log-prob 0: it ties its parent's score but must not displace it
    tree = build_tree(
        torch.tensor([0]),
        torch.tensor([[5, 6, 7]]),
        torch.tensor([[-1, -1, 1]]),
        torch.tensor([[-0.5, -0.7, 0.0]]),
        budget=2,
    )
    assert tree.tokens.tolist() == [[0, 5, 6]]


def test_build_tree_marks_invalid_candidates_and_their_children_invalid():
    tree = build_tree(
        torch.tensor([0]),
        torch.tensor([[5, 6, 7]]),
        torch.tensor([[-1, -1, 1]]),
        torch.tensor([[-0.5, -0.1, -0.1]]),
        budget=3,
        cand_valid=torch.tensor([[True, False, True]]),
    )
    assert tree.tokens.tolist() == [[0, 5, 0, 0]]
    assert tree.valid.tolist() == [[True, True, False, False]]
    assert tree.parents.tolist() == [[-1, 0, -1, -1]]


def test_build_tree_refuses_parent_after_child_and_empty_budget():
    with pytest.raises(ValueError, match="earlier candidate"):
        build_tree(torch.tensor([0]), torch.tensor([[1, 2]]), torch.tensor([[1, -1]]), torch.zeros(1, 2), 2)
    with pytest.raises(ValueError, match="budget"):
        _build(0)


def test_chain_tree_with_short_rows():
    tree = chain_tree(torch.tensor([4, 5]), torch.tensor([[1, 2, 3], [6, 7, 8]]), torch.tensor([3, 1]))
    assert tree.tokens.tolist() == [[4, 1, 2, 3], [5, 6, 0, 0]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2], [-1, 0, -1, -1]]
    assert tree.depth.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]


def test_ancestor_mask_sees_ancestors_and_self_only():
    mask = ancestor_mask(_build(4))[0].int().tolist()
    # nodes: 0 root, 1 A, 2 B, 3 C (of A), 4 E (of B)
    assert mask == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 0, 1, 0, 1],
    ]


def test_tree_attention_mask_adds_the_cached_prefix():
    tree = _build(4)
    mask = tree_attention_mask(tree, torch.tensor([3]), cache_len=10)[0].int()
    # slots 0-2 prefix, 3-7 tree nodes 0-4, 8-9 free
    assert mask[3].tolist() == [1, 1, 1, 1, 1, 0, 1, 0, 0, 0]  # C sees prefix, root, A, itself
    assert mask[2].tolist() == [1, 1, 1, 1, 0, 1, 0, 0, 0, 0]  # B sees prefix, root, itself
    assert mask[:, 8:].sum() == 0


def test_tree_attention_mask_needs_room_for_the_tree():
    with pytest.raises(ValueError, match="cache_len"):
        tree_attention_mask(_build(4), torch.tensor([6]), cache_len=10)


def test_tree_positions_follow_depth_not_slot():
    assert tree_positions(_build(4), torch.tensor([3])).tolist() == [[3, 4, 4, 5, 5]]


def test_compaction_moves_accepted_branch_next_to_the_root():
    src, dst, keep = compaction_slots(
        torch.tensor([[2, 4, -1, -1], [1, 3, -1, -1]]), torch.tensor([2, 1]), torch.tensor([3, 5])
    )
    assert keep.tolist() == [[True, True, False, False], [True, False, False, False]]
    assert src[keep].tolist() == [5, 7, 6]
    assert dst[keep].tolist() == [4, 5, 6]


def test_compaction_of_a_chain_moves_nothing():
    src, dst, keep = compaction_slots(torch.tensor([[1, 2, 3]]), torch.tensor([3]), torch.tensor([4]))
    assert torch.equal(src[keep], dst[keep])


def test_chain_attention_mask_equals_the_tree_mask_of_the_chain():
    from tlt.rollout.tree import chain_attention_mask, chain_tree, tree_attention_mask

    root = torch.tensor([5, 6, 7])
    draft = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    for n_draft in (None, torch.tensor([3, 1, 0])):  # full chains, and short ones with padding nodes
        tree = chain_tree(root, draft, n_draft)
        prefix = torch.tensor([4, 0, 9])
        assert torch.equal(chain_attention_mask(tree, prefix, 14), tree_attention_mask(tree, prefix, 14))


def test_a_full_chain_is_the_chain_with_every_draft_counted():
    """The constant layout of full chains (no n_draft) equals the general path's with n_draft = K, and a
    second chain of the same shape reuses it without changing the first tree."""
    root = torch.tensor([5, 6])
    draft = torch.tensor([[1, 2, 3], [4, 5, 6]])
    full = chain_tree(root, draft)
    general = chain_tree(root, draft, torch.tensor([3, 3]))
    assert full.full_chain and not general.full_chain
    for name in ("tokens", "parents", "depth", "valid"):
        assert torch.equal(getattr(full, name), getattr(general, name)), name
    again = chain_tree(torch.tensor([8, 9]), torch.tensor([[7, 7, 7], [0, 0, 0]]))
    assert torch.equal(full.tokens, torch.tensor([[5, 1, 2, 3], [6, 4, 5, 6]]))
    assert again.tokens[1].tolist() == [9, 0, 0, 0] and bool(again.valid.all())
