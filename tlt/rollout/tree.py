"""Draft trees: building them under a verify budget, their attention mask, positions and cache compaction.

A tree per row is stored flat over N nodes (`DraftTree`). Node 0 is the root: the last committed token,
not yet in the KV cache, written at cache slot `prefix_len` (the number of cached tokens). Node j is
written at slot `prefix_len + j` for the verify forward, at RoPE position `prefix_len + depth[j]`, and
sees the cached prefix, its ancestors and itself. Parents precede children in node order and siblings
come in the drafter's preference order, which is the order verification tries them in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class DraftTree:
    """Flat draft trees, one per row."""

    tokens: Tensor  # [B, N] int64; node 0 is the root; padding nodes hold 0
    parents: Tensor  # [B, N] int64; -1 for the root and padding nodes, else an index < own index
    depth: Tensor  # [B, N] int64; root 0, padding 0
    valid: Tensor  # [B, N] bool; root always valid
    full_chain: bool = False  # every row a chain of N - 1 drafts (node j at depth j, all valid); lets
    # `chain_attention_mask` skip the padding case. False is always safe.

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


_FULL_CHAINS: dict[tuple, tuple[Tensor, Tensor, Tensor]] = {}


def _full_chain_layout(B: int, N: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(parents, depth, valid) [B, N] of B chains of N nodes, all valid; built once per shape (read-only:
    nothing downstream writes a tree's layout in place)."""
    key = (B, N, device)
    if key not in _FULL_CHAINS:
        idx = torch.arange(N, device=device)
        _FULL_CHAINS[key] = (
            (idx - 1).expand(B, N).contiguous(),
            idx.expand(B, N).contiguous(),
            torch.ones(B, N, dtype=torch.bool, device=device),
        )
    return _FULL_CHAINS[key]


def chain_tree(root_token: Tensor, draft: Tensor, n_draft: Tensor | None = None) -> DraftTree:
    """A chain as a tree. root_token: [B]; draft: [B, K]; n_draft: [B] real drafts per row (default K)."""
    B, K = draft.shape
    if n_draft is None:  # every row drafts K (the EAGLE chains): the layout is a constant of (B, K)
        parents, depth, valid = _full_chain_layout(B, K + 1, draft.device)
        return DraftTree(torch.cat([root_token[:, None], draft], dim=1), parents, depth, valid, full_chain=True)
    idx = torch.arange(K + 1, device=draft.device)
    valid = idx[None, :] <= n_draft[:, None]  # [B, K+1]
    tokens = torch.cat([root_token[:, None], draft], dim=1).masked_fill(~valid, 0)
    parents = (idx - 1).expand(B, K + 1).masked_fill(~valid, -1)
    depth = idx.expand(B, K + 1).masked_fill(~valid, 0)
    return DraftTree(tokens, parents.clone(), depth.clone(), valid)


def build_tree(
    root_token: Tensor,
    cand_tokens: Tensor,
    cand_parents: Tensor,
    cand_logprobs: Tensor,
    budget: int,
    cand_valid: Tensor | None = None,
) -> DraftTree:
    """Choose the `budget` most likely candidates (by path log-probability) and lay them out as a tree.

    root_token: [B]; cand_tokens, cand_parents, cand_logprobs: [B, C] where cand_parents indexes the
    candidates (-1: child of the root) and every parent comes before its children; cand_logprobs is the
    drafter's log-probability of the token given its parent's path (<= 0). Typically the candidates are
    the top-k children of each expanded node, level by level. Returns a tree of 1 + budget nodes (fewer
    valid ones where a row has fewer candidates), ancestor-closed, ordered by depth, siblings by score.
    """
    B, C = cand_tokens.shape
    if budget < 1:
        raise ValueError(f"budget must be >= 1 draft node, got {budget}")
    if cand_parents.shape != (B, C) or cand_logprobs.shape != (B, C):
        raise ValueError("cand_tokens, cand_parents and cand_logprobs must all be [B, C]")
    device = cand_tokens.device
    valid = torch.ones(B, C, dtype=torch.bool, device=device) if cand_valid is None else cand_valid.clone()
    score = torch.zeros(B, C, dtype=torch.float64, device=device)
    depth = torch.ones(B, C, dtype=torch.long, device=device)
    for c in range(C):  # parents precede children: cumulative scores and depths in one pass
        parent = cand_parents[:, c]
        if bool((parent >= c).any()):
            raise ValueError(f"cand_parents[:, {c}] must index an earlier candidate or be -1")
        has_parent = parent >= 0
        p = parent.clamp_min(0)
        base = torch.where(has_parent, score.gather(1, p[:, None]).squeeze(1), 0.0)
        score[:, c] = base + cand_logprobs[:, c].double()
        depth[:, c] = torch.where(has_parent, depth.gather(1, p[:, None]).squeeze(1) + 1, 1)
        valid[:, c] &= torch.where(has_parent, valid.gather(1, p[:, None]).squeeze(1), True)
    # Rank by (valid first, score desc, depth asc, index asc). A child never outranks its parent
    # (score <= parent's, depth larger), so every prefix of the ranking is ancestor-closed.
    key_score = torch.where(valid, -score, torch.inf)
    order = torch.argsort(depth, dim=1, stable=True)
    order = order.gather(1, torch.argsort(key_score.gather(1, order), dim=1, stable=True))
    take = min(budget, C)
    picked = order[:, :take]  # [B, take] candidate indices
    # Lay out the picked nodes by (depth asc, score desc): parents first, siblings in preference order.
    picked = picked.gather(1, torch.argsort(key_score.gather(1, picked), dim=1, stable=True))
    picked = picked.gather(1, torch.argsort(depth.gather(1, picked), dim=1, stable=True))
    node_of = torch.full((B, C), -1, dtype=torch.long, device=device)  # candidate -> node index
    node_of.scatter_(1, picked, torch.arange(1, take + 1, device=device).expand(B, take).clone())
    picked_valid = valid.gather(1, picked)
    parent_cand = cand_parents.gather(1, picked)
    parent_node = torch.where(parent_cand >= 0, node_of.gather(1, parent_cand.clamp_min(0)), 0)
    root_valid = torch.ones(B, 1, dtype=torch.bool, device=device)
    zero = torch.zeros(B, 1, dtype=torch.long, device=device)
    return DraftTree(
        tokens=torch.cat([root_token[:, None], cand_tokens.gather(1, picked).masked_fill(~picked_valid, 0)], 1),
        parents=torch.cat([zero - 1, parent_node.masked_fill(~picked_valid, -1)], 1),
        depth=torch.cat([zero, depth.gather(1, picked).masked_fill(~picked_valid, 0)], 1),
        valid=torch.cat([root_valid, picked_valid], 1),
    )


def ancestor_mask(tree: DraftTree) -> Tensor:
    """[B, N, N] bool: mask[b, i, j] is True when node j is node i or one of its ancestors."""
    B, N = tree.tokens.shape
    device = tree.tokens.device
    mask = torch.zeros(B, N, N, dtype=torch.bool, device=device)
    rows = torch.arange(B, device=device)[:, None].expand(B, N)
    nodes = torch.arange(N, device=device)[None, :].expand(B, N)
    cur = torch.where(tree.valid, nodes, -1)
    for _ in range(N):  # climb one level per iteration
        on = cur >= 0
        if not on.any():
            break
        mask[rows[on], nodes[on], cur[on]] = True
        cur = torch.where(on, tree.parents.gather(1, cur.clamp_min(0)), -1)
    return mask


def tree_attention_mask(tree: DraftTree, prefix_len: Tensor, cache_len: int) -> Tensor:
    """[B, N, cache_len] bool: which cache slots each tree node attends to.

    prefix_len: [B] cached tokens per row; tree node j sits in slot prefix_len + j. A node sees every
    prefix slot, its ancestors' slots and its own; padding nodes see only themselves.
    """
    B, N = tree.tokens.shape
    if int((prefix_len + N).max()) > cache_len:
        raise ValueError(f"cache_len={cache_len} is too small for prefix_len + {N} tree nodes")
    slots = torch.arange(cache_len, device=prefix_len.device)  # [S]
    prefix = slots[None, None, :] < prefix_len[:, None, None]  # [B, 1, S]
    rel = slots[None, :] - prefix_len[:, None]  # [B, S] tree node index of each slot
    in_tree = (rel >= 0) & (rel < N)
    anc = ancestor_mask(tree)  # [B, N, N]
    own = torch.eye(N, dtype=torch.bool, device=anc.device)[None]
    anc = torch.where(tree.valid[:, :, None], anc, own)
    tree_part = anc.gather(2, rel.clamp(0, N - 1)[:, None, :].expand(B, N, cache_len)) & in_tree[:, None, :]
    return (prefix & tree.valid[:, :, None]) | tree_part


def tree_positions(tree: DraftTree, prefix_len: Tensor) -> Tensor:
    """[B, N] RoPE positions: prefix_len + depth (the root at prefix_len)."""
    return prefix_len[:, None] + tree.depth


def compaction_slots(path: Tensor, n_accepted: Tensor, prefix_len: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Where the accepted path's cache entries move so that they are contiguous after the root.

    path: [B, D] accepted node indices (-1 padded); n_accepted: [B]; prefix_len: [B].
    Returns (src [B, D], dst [B, D], keep [B, D] bool): move slot src to slot dst where keep. The root
    stays in slot prefix_len; accepted node j goes to prefix_len + 1 + j; the row's cache then holds
    prefix_len + 1 + n_accepted tokens. For a chain src == dst (nothing moves).
    """
    D = path.shape[1]
    step = torch.arange(D, device=path.device)[None, :]
    keep = step < n_accepted[:, None]
    src = torch.where(keep, prefix_len[:, None] + path, -1)
    dst = torch.where(keep, prefix_len[:, None] + 1 + step, -1)
    return src, dst, keep


def chain_attention_mask(tree: DraftTree, prefix_len: Tensor, cache_len: int) -> Tensor:
    """`tree_attention_mask` of a chain (node j's parent is j - 1), without walking ancestors: valid
    node j sees the prefix and tree slots 0..j; padding nodes see only themselves. [B, N, cache_len]."""
    B, N = tree.tokens.shape
    if int((prefix_len + N).max()) > cache_len:
        raise ValueError(f"cache_len={cache_len} is too small for prefix_len + {N} tree nodes")
    rel = torch.arange(cache_len, device=prefix_len.device)[None, :] - prefix_len[:, None]  # [B, S]
    node = torch.arange(N, device=prefix_len.device)[None, :, None]  # [1, N, 1]
    if tree.full_chain:  # no padding nodes
        return rel[:, None, :] <= node
    return torch.where(tree.valid[:, :, None], rel[:, None, :] <= node, rel[:, None, :] == node)
