"""Lossless verification of speculative drafts: pure tensor functions, batched over rows.

Notation, per row b of a batch of B rows, vocabulary V:
  K          draft length of a chain (rows may use fewer: `n_draft[b] <= K`).
  p[b, i]    the TARGET distribution for the token after input position i of the verify forward.
             Input position 0 is the last committed token and position i >= 1 the i-th draft, so p has
             K + 1 rows: p[b, i] judges draft i + 1 (i < K) and p[b, K] gives the bonus token.
  q[b, i]    the DRAFTER distribution that draft i + 1 was sampled from (sampled chains only).
p and q must both come from the SAME temperature / top-p processing: the rules reproduce the processed
target distribution exactly. Greedy verification takes logits or probabilities (only the argmax is used).

The rules (DESIGN.md section 1, "Lossless"):
  greedy         accept a draft while it equals the target's argmax; the next token is the argmax at the
                 first mismatch (or after the last draft).
  sampled        accept x with probability min(1, p(x) / q(x)); on the first rejection sample from
                 norm(max(0, p - q)); if all drafts are accepted, sample a bonus token from p.
  deterministic  drafts with no q (n-gram, top-k tree children) are treated as one-hot q: accept x with
                 probability p(x); on rejection set p(x) = 0, renormalise and try the next sibling; when no
                 sibling is left, sample from what remains.
  coupled        (what the engine's sampling rows use) every node j draws its target token x_j from p_j
                 with the uniform of its generated position (inverse CDF), exactly as a plain step at
                 that position would; a draft is accepted while it equals x at its parent, and the next
                 token is x at the last accepted node. The output is the plain sampler's, token for token:
                 lossless by construction, and for deterministic drafts the acceptance probability is
                 p(x), as under the one-hot rule. `verify_chain_tokens` / `verify_tree_tokens` take x
                 (greedy: x is the argmax, which is the greedy rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from tlt.rollout import sampling

# Randomness: one generator for the whole batch, or one per row (row b draws only from its own).
Rng = torch.Generator | Sequence[torch.Generator] | None


class ChainVerdict(NamedTuple):
    """Outcome of verifying one draft chain per row."""

    n_accepted: Tensor  # [B] int64: drafts accepted, 0..n_draft[b]
    next_token: Tensor  # [B] int64: the token emitted after the accepted drafts


class TreeVerdict(NamedTuple):
    """Outcome of verifying one draft tree per row."""

    path: Tensor  # [B, N - 1] int64: accepted node indices, root excluded, in depth order; -1 padded
    n_accepted: Tensor  # [B] int64: number of accepted nodes (the length of the path)
    next_token: Tensor  # [B] int64: the token emitted after the accepted path
    last_node: Tensor  # [B] int64: node whose target distribution produced next_token (0: the root)


def uniforms(rng: Rng, batch: int, n: int, device: torch.device) -> Tensor:
    """[batch, n] float64 uniforms in [0, 1) from one generator or from one generator per row."""
    if rng is None or isinstance(rng, torch.Generator):
        return torch.rand(batch, n, generator=rng, dtype=torch.float64, device=device)
    if len(rng) != batch:
        raise ValueError(f"need one generator per row: got {len(rng)} generators for {batch} rows")
    return sampling.uniforms(rng, n, device)


def sample_from(probs: Tensor, rng: Rng) -> Tensor:
    """One token per row from unnormalised non-negative weights. probs: [B, V] -> [B] int64."""
    return sampling.sample_from(probs, uniforms(rng, probs.shape[0], 1, probs.device)[:, 0])


def _draft_mask(draft: Tensor, n_draft: Tensor | None) -> tuple[Tensor, Tensor]:
    """(mask [B, K] of real draft positions, n_draft [B]) for drafts [B, K]; None means all K are real."""
    B, K = draft.shape
    if n_draft is None:
        n_draft = torch.full((B,), K, dtype=torch.long, device=draft.device)
    if n_draft.shape != (B,):
        raise ValueError(f"n_draft must have shape [B]={B}, got {tuple(n_draft.shape)}")
    positions = torch.arange(K, device=draft.device)
    return positions[None, :] < n_draft[:, None], n_draft


def _accepted_prefix(accept: Tensor) -> Tensor:
    """Length of the leading run of True per row. accept: [B, K] bool -> [B] int64."""
    return accept.long().cumprod(dim=1).sum(dim=1)


def _check_chain_shapes(p: Tensor, draft: Tensor) -> None:
    if p.dim() != 3 or draft.dim() != 2 or p.shape[:2] != (draft.shape[0], draft.shape[1] + 1):
        raise ValueError(f"target must be [B, K+1, V] and draft [B, K]; got {tuple(p.shape)} and {tuple(draft.shape)}")


def verify_greedy(target: Tensor, draft: Tensor, n_draft: Tensor | None = None) -> ChainVerdict:
    """Exact-match verification.

    target: [B, K+1, V] logits or probabilities; draft: [B, K] int64; n_draft: [B] real drafts per row.
    """
    _check_chain_shapes(target, draft)
    return verify_chain_tokens(target.argmax(dim=-1), draft, n_draft)


def verify_chain_tokens(target_tokens: Tensor, draft: Tensor, n_draft: Tensor | None = None) -> ChainVerdict:
    """Exact match against the target's own token at every position (the greedy and coupled rules).

    target_tokens: [B, K+1] int64, the token the target emits after input position i (its argmax, or
    its sample with that position's uniform); draft: [B, K] int64; n_draft: [B] real drafts per row.
    """
    if target_tokens.dim() != 2 or draft.dim() != 2 or target_tokens.shape != (draft.shape[0], draft.shape[1] + 1):
        raise ValueError(
            f"target_tokens must be [B, K+1] and draft [B, K]; got {tuple(target_tokens.shape)} and "
            f"{tuple(draft.shape)}"
        )
    match = target_tokens[:, :-1] == draft  # [B, K]
    if n_draft is not None:  # else every draft is real
        match &= _draft_mask(draft, n_draft)[0]
    # Accept draft i while it equals the target's token at its position; stop at the first mismatch.
    n_accepted = _accepted_prefix(match)
    # The next token is the target's own token right after the accepted drafts.
    next_token = target_tokens.gather(1, n_accepted[:, None]).squeeze(1)
    return ChainVerdict(n_accepted, next_token)


def verify_tree_tokens(target_tokens: Tensor, tokens: Tensor, parents: Tensor) -> TreeVerdict:
    """Walk each row's tree from the root, descending into the first child whose token equals the target's
    own token at the current node (the greedy and coupled rules).

    target_tokens: [B, N] int64, the token the target emits after node j's path; tokens, parents: [B, N]
    as in `verify_tree`.
    """
    if target_tokens.shape != tokens.shape or parents.shape != tokens.shape or tokens.dim() != 2:
        raise ValueError(
            f"target_tokens, tokens and parents must all be [B, N]; got {tuple(target_tokens.shape)}, "
            f"{tuple(tokens.shape)}, {tuple(parents.shape)}"
        )
    rows = torch.arange(tokens.shape[0], device=tokens.device)

    def descend(current: Tensor, children: Tensor) -> tuple[Tensor, Tensor]:
        hit = children & (tokens == target_tokens[rows, current][:, None])
        return hit.any(dim=1), hit.int().argmax(dim=1)

    path, n_accepted, current = _walk_tree(tokens, parents, descend)
    return TreeVerdict(path, n_accepted, target_tokens[rows, current], current)


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p - q)) per row. p, q: [B, V] -> [B, V].

    Mathematically the mass is positive whenever a rejection can happen (it equals the total variation
    distance); a row whose float mass is exactly 0 had rejection probability 0, and gets p.
    """
    r = (p - q).clamp_min(0)
    total = r.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)


def _next_distribution(p_n: Tensor, q_n: Tensor, rejected: Tensor) -> Tensor:
    """Distribution of the token after the accepted drafts. p_n, q_n: [B, V]; rejected: [B] bool.

    A row that rejected a draft samples from the residual norm(max(0, p - q)) at that position; a row
    that accepted all its drafts samples the bonus token from p itself (there is no q to subtract).
    """
    return torch.where(rejected[:, None], _residual(p_n, q_n), p_n)


def verify_sampled(p: Tensor, q: Tensor, draft: Tensor, rng: Rng, n_draft: Tensor | None = None) -> ChainVerdict:
    """Rejection-sampling verification of drafts sampled from q.

    p: [B, K+1, V] target probabilities; q: [B, K, V] drafter probabilities; draft: [B, K] int64 with
    draft[:, i] ~ q[:, i]; n_draft: [B] real drafts per row (the rest is padding and never accepted).
    """
    _check_chain_shapes(p, draft)
    if q.shape != p[:, :-1].shape:
        raise ValueError(f"q must be [B, K, V]={tuple(p[:, :-1].shape)}, got {tuple(q.shape)}")
    mask, n_draft = _draft_mask(draft, n_draft)
    B, K = draft.shape
    rows = torch.arange(B, device=p.device)
    if K == 0:
        return ChainVerdict(torch.zeros_like(rows), sample_from(p[:, 0], rng))
    u = uniforms(rng, B, K, p.device)  # [B, K]
    p_x = p[:, :-1].gather(2, draft[..., None]).squeeze(-1)  # [B, K]
    q_x = q.gather(2, draft[..., None]).squeeze(-1)  # [B, K]
    # Accept x with probability min(1, p(x)/q(x)):  u < p/q  <=>  u * q < p  (q(x) > 0 as x ~ q).
    n_accepted = _accepted_prefix((u * q_x < p_x) & mask)
    rejected = n_accepted < n_draft
    # Position n_accepted is either the first rejected draft (residual) or the bonus position (p).
    q_n = q[rows, n_accepted.clamp_max(K - 1)]
    dist = _next_distribution(p[rows, n_accepted], q_n, rejected)
    return ChainVerdict(n_accepted, sample_from(dist, rng))


def _without_token(p: Tensor, token: Tensor) -> Tensor:
    """p with p(token) set to 0 (not renormalised; sampling normalises). p: [B, V]; token: [B]."""
    return p.scatter(1, token[:, None], 0.0)


def verify_deterministic_chain(p: Tensor, draft: Tensor, rng: Rng, n_draft: Tensor | None = None) -> ChainVerdict:
    """Verification of a draft chain that has no q (e.g. n-gram): the one-hot rule.

    p: [B, K+1, V] target probabilities; draft: [B, K] int64; n_draft: [B] real drafts per row.
    """
    _check_chain_shapes(p, draft)
    mask, n_draft = _draft_mask(draft, n_draft)
    B, K = draft.shape
    rows = torch.arange(B, device=p.device)
    if K == 0:
        return ChainVerdict(torch.zeros_like(rows), sample_from(p[:, 0], rng))
    u = uniforms(rng, B, K, p.device)  # [B, K]
    p_x = p[:, :-1].gather(2, draft[..., None]).squeeze(-1)  # [B, K]
    # q is one-hot at x: accept with probability min(1, p(x)/1) = p(x).
    n_accepted = _accepted_prefix((u < p_x) & mask)
    rejected = n_accepted < n_draft
    p_n = p[rows, n_accepted]
    # On rejection the residual max(0, p - onehot(x)) is p with p(x) = 0; all accepted: bonus from p.
    x_n = draft[rows, n_accepted.clamp_max(K - 1)]
    dist = torch.where(rejected[:, None], _without_token(p_n, x_n), p_n)
    return ChainVerdict(n_accepted, sample_from(dist, rng))


def _check_tree_shapes(p: Tensor, tokens: Tensor, parents: Tensor) -> None:
    if p.dim() != 3 or tokens.shape != p.shape[:2] or parents.shape != p.shape[:2]:
        raise ValueError(
            f"tree verification needs p [B, N, V], tokens [B, N], parents [B, N]; got {tuple(p.shape)}, "
            f"{tuple(tokens.shape)}, {tuple(parents.shape)}"
        )


def verify_tree(p: Tensor, tokens: Tensor, parents: Tensor, rng: Rng, greedy: bool = False) -> TreeVerdict:
    """Walk a draft tree per row from its root, accepting one child per level.

    p: [B, N, V] target probabilities (logits suffice when greedy) at every node: p[b, j] is the target
       distribution of the token after node j's path;
    tokens: [B, N] int64, node 0 is the root (the last committed token);
    parents: [B, N] int64, -1 for the root and for padding nodes, otherwise a node index < own index.
    Siblings are tried in node-index order (put the drafter's best first). greedy: exact match against
    the argmax (rng unused); otherwise the deterministic one-hot rule (children are chosen, not sampled
    from a q).
    """
    _check_tree_shapes(p, tokens, parents)
    if greedy:
        return verify_tree_tokens(p.argmax(dim=-1), tokens, parents)
    rows = torch.arange(p.shape[0], device=p.device)
    dist = p[:, 0].clone()  # [B, V] what remains of the distribution at the current node

    def descend(current: Tensor, children: Tensor) -> tuple[Tensor, Tensor]:
        nonlocal dist
        moved, chosen, dist = _try_siblings(dist, tokens, children, rng)
        # A row that descended starts afresh from the target distribution at its new node.
        dist = torch.where(moved[:, None], p[rows, chosen], dist)
        return moved, chosen

    path, n_accepted, current = _walk_tree(tokens, parents, descend)
    return TreeVerdict(path, n_accepted, sample_from(dist, rng), current)


def _walk_tree(
    tokens: Tensor, parents: Tensor, descend: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor, Tensor]:
    """Walk each row's tree [B, N] from the root, one level per round: `descend(current [B], children
    [B, N] bool)` says which rows move (bool [B]) and into which child ([B]). Returns (path [B, N - 1]
    accepted nodes in depth order, -1 padded; n_accepted [B]; the node each row stopped on [B])."""
    B, N = tokens.shape
    device = tokens.device
    rows = torch.arange(B, device=device)
    current = torch.zeros(B, dtype=torch.long, device=device)  # node we stand on
    active = torch.ones(B, dtype=torch.bool, device=device)  # still descending
    path = torch.full((B, max(N - 1, 0)), -1, dtype=torch.long, device=device)
    n_accepted = torch.zeros(B, dtype=torch.long, device=device)
    not_root = torch.arange(N, device=device)[None, :] > 0
    for _ in range(N - 1):
        children = (parents == current[:, None]) & not_root & active[:, None]  # [B, N]
        if not children.any():
            break
        moved, chosen = descend(current, children)
        path[rows[moved], n_accepted[moved]] = chosen[moved]
        n_accepted = n_accepted + moved.long()
        current = torch.where(moved, chosen, current)
        active = active & moved
    return path, n_accepted, current


def _try_siblings(dist: Tensor, tokens: Tensor, children: Tensor, rng: Rng) -> tuple[Tensor, Tensor, Tensor]:
    """Try the children of each row's current node in index order with the one-hot rule.

    dist: [B, V] unnormalised remaining target mass; tokens: [B, N]; children: [B, N] bool.
    Returns (moved [B] bool, chosen child [B] int64, dist [B, V] with rejected tokens zeroed).
    """
    B = dist.shape[0]
    rows = torch.arange(B, device=dist.device)
    rank = children.long().cumsum(dim=1)  # 1-based sibling rank at child positions
    moved = torch.zeros(B, dtype=torch.bool, device=dist.device)
    chosen = torch.zeros(B, dtype=torch.long, device=dist.device)
    for s in range(1, int(rank[:, -1].max()) + 1):
        sibling = children & (rank == s)
        trying = sibling.any(dim=1) & ~moved
        child = sibling.int().argmax(dim=1)
        x = tokens[rows, child]
        mass = dist.sum(dim=-1)
        p_x = dist[rows, x] / mass.clamp_min(torch.finfo(dist.dtype).tiny)
        u = uniforms(rng, B, 1, dist.device)[:, 0]
        # Accept x with the renormalised remaining probability p(x); on rejection set p(x) = 0.
        accept = trying & (u < p_x)
        reject = trying & ~accept
        dist = torch.where(reject[:, None], _without_token(dist, x), dist)
        chosen = torch.where(accept, child, chosen)
        moved = moved | accept
    return moved, chosen, dist
