"""Distribution-test harness for speculative decoding on a fixed synthetic autoregressive model.

The target is a random table of next-token logits given the last TWO tokens; the drafter a different
table given the last token. Both go through the same temperature / top-p processing. The exact joint
distribution of the first three generated tokens is computed from the table, and a speculative
procedure is run on a large batch of independent rows (vectorised), then compared with a G-test.

Mutants (deliberately wrong verifiers) live here, test-only: the same G-test must reject them.
`drafter_logits_along`: an EAGLE drafter's own cache-free forward, what the cached drafting must match.
`random_eagle`, `history_store`: the engine-level tests' untrained EAGLE drafter and history store;
`reduced_eagle`: the drafter with a reduced draft vocabulary; `random_block`: an untrained block drafter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

import torch
from torch import Tensor
from transformers import PreTrainedModel

from tlt.models.block_drafter import BlockDrafter, new_block_drafter
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.rollout import verify
from tlt.rollout.history import HistoryStore
from tlt.rollout.ngram import ngram_draft_batch
from tlt.rollout.sampling import process_logits
from tlt.rollout.tree import build_tree
from tlt.rollout.verify import ChainVerdict, Rng, TreeVerdict


def random_eagle(model: PreTrainedModel, seed: int = 3) -> EagleDrafter:
    """An untrained EAGLE drafter (seeded init) on the model's device, in its dtype, bound to its embedding and head."""
    torch.manual_seed(seed)
    drafter = EagleDrafter(drafter_config_from_target(model.config)).to(device=model.device, dtype=model.dtype)
    drafter.bind_policy(model)
    return drafter


def reduced_eagle(model: PreTrainedModel, ids: list[int], seed: int = 3) -> EagleDrafter:
    """`random_eagle` drafting from the token ids `ids` only (a reduced draft vocabulary, `tlt.models.draft_vocab`)."""
    drafter = random_eagle(model, seed)
    vocab = drafter.set_draft_vocab(len(ids))
    vocab.update(torch.tensor(sorted(ids)), model.get_output_embeddings())
    return drafter


def random_block(
    model: PreTrainedModel, ids: list[int] | None = None, seed: int = 5, feature_layers: tuple[int, ...] = ()
) -> BlockDrafter:
    """An untrained block drafter (seeded init, block size 8, two layers) bound to the model; drafting from
    the token ids `ids` only when given (a reduced draft vocabulary); reading `feature_layers` of the target
    beside its final-norm state when given."""
    torch.manual_seed(seed)
    drafter = new_block_drafter(model, num_layers=2, feature_layers=feature_layers)
    if ids is not None:
        drafter.set_draft_vocab(len(ids)).update(torch.tensor(sorted(ids)), model.get_output_embeddings())
    return drafter


def history_store(max_nodes: int = 100_000) -> HistoryStore:
    return HistoryStore(max_nodes=max_nodes, min_match=1, max_match=4, max_draft=4)


def drafter_logits_along(model: PreTrainedModel, drafter: EagleDrafter, ids: Tensor, path: list[int]) -> Tensor:
    """The drafter's own full forward (no cache): logits [V] after the committed ids [1, T] and drafted path."""
    inputs, feats = ids[:, 1:], model.model(input_ids=ids).last_hidden_state[:, :-1]
    pred = drafter(inputs, feats, torch.arange(inputs.shape[1])[None, :])
    for token in path:
        inputs = torch.cat([inputs, torch.tensor([[token]])], dim=1)
        feats = torch.cat([feats, pred[:, -1:]], dim=1)
        pred = drafter(inputs, feats, torch.arange(inputs.shape[1])[None, :])
    return drafter.logits(pred)[0, -1]


GENERATED = 3  # tokens whose joint distribution is tested
PROMPT = (0, 1, 2, 0, 1, 2, 0, 1)  # repetitive, so the n-gram drafter has matches


@dataclass(frozen=True)
class TableLM:
    """Processed next-token tables: target [V, V, V] given (t-2, t-1), drafter [V, V] given t-1."""

    target: Tensor
    drafter: Tensor
    drafter_logits: Tensor

    @property
    def vocab(self) -> int:
        return self.target.shape[-1]


def make_table_lm(vocab: int, temperature: float, top_p: float, seed: int = 1234) -> TableLM:
    """A fixed random target and a different, correlated drafter, both processed identically."""
    g = torch.Generator().manual_seed(seed)
    target_logits = 1.0 * torch.randn(vocab, vocab, vocab, generator=g, dtype=torch.float64)
    noise = 0.7 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
    drafter_logits = target_logits.mean(dim=0) + noise

    def process(logits: Tensor) -> Tensor:
        flat = logits.reshape(-1, vocab)
        n = flat.shape[0]
        probs = process_logits(flat, torch.full((n,), temperature, dtype=torch.float64), torch.full((n,), top_p))
        return probs.reshape(logits.shape)

    return TableLM(process(target_logits), process(drafter_logits), drafter_logits)


def exact_joint(lm: TableLM) -> Tensor:
    """[V, V, V] probability of the first three generated tokens after PROMPT."""
    a, b = PROMPT[-2], PROMPT[-1]
    p1 = lm.target[a, b]  # [V]
    p2 = lm.target[b]  # [t1, t2]
    p3 = lm.target  # [t1, t2, t3]
    return p1[:, None, None] * p2[:, :, None] * p3


# A strategy proposes and verifies one round for every row: (ctx [B, L], length [B], rng) ->
# (tokens [B, M] to append, count [B] how many of them are real).
Strategy = Callable[[TableLM, Tensor, Tensor, Rng], tuple[Tensor, Tensor]]


def _append(ctx: Tensor, length: Tensor, new: Tensor, count: Tensor) -> Tensor:
    rows = torch.arange(ctx.shape[0])
    for j in range(new.shape[1]):
        use = j < count
        ctx[rows[use], length[use] + j] = new[use, j]
    return length + count


def run_speculative(lm: TableLM, strategy: Strategy, batch: int, seed: int, max_round_tokens: int) -> Tensor:
    """[batch, GENERATED] first generated tokens of `batch` independent speculative runs."""
    rng = torch.Generator().manual_seed(seed)
    width = len(PROMPT) + GENERATED * max_round_tokens + max_round_tokens
    ctx = torch.zeros(batch, width, dtype=torch.long)
    ctx[:, : len(PROMPT)] = torch.tensor(PROMPT)
    length = torch.full((batch,), len(PROMPT), dtype=torch.long)
    while bool((length < len(PROMPT) + GENERATED).any()):
        new, count = strategy(lm, ctx, length, rng)
        if bool((count < 1).any()) or bool((count > max_round_tokens).any()):
            raise AssertionError("a round must emit between 1 and max_round_tokens tokens")
        length = _append(ctx, length, new, count)
    return ctx[:, len(PROMPT) : len(PROMPT) + GENERATED]


def _last_two(ctx: Tensor, length: Tensor) -> tuple[Tensor, Tensor]:
    rows = torch.arange(ctx.shape[0])
    return ctx[rows, length - 2], ctx[rows, length - 1]


def _chain_target(lm: TableLM, prev2: Tensor, prev1: Tensor, draft: Tensor) -> Tensor:
    """[B, K+1, V] target distributions along a chain that starts after (prev2, prev1)."""
    seq = torch.cat([prev2[:, None], prev1[:, None], draft], dim=1)
    return lm.target[seq[:, :-1], seq[:, 1:]]


def _emit(draft: Tensor, verdict: ChainVerdict) -> tuple[Tensor, Tensor]:
    rows = torch.arange(draft.shape[0])
    out = torch.cat([draft, torch.zeros_like(draft[:, :1])], dim=1)
    out[rows, verdict.n_accepted] = verdict.next_token
    return out, verdict.n_accepted + 1


ChainSampledVerifier = Callable[[Tensor, Tensor, Tensor, Rng], ChainVerdict]


def chain_sampled(k: int, verifier: ChainSampledVerifier = verify.verify_sampled) -> Strategy:
    """Chain drafts sampled from the drafter table, verified by `verifier(p, q, draft, rng)`."""

    def strategy(lm: TableLM, ctx: Tensor, length: Tensor, rng: Rng) -> tuple[Tensor, Tensor]:
        prev2, prev1 = _last_two(ctx, length)
        last = prev1
        drafts, qs = [], []
        for _ in range(k):
            q = lm.drafter[last]  # [B, V]
            last = verify.sample_from(q, rng)
            drafts.append(last)
            qs.append(q)
        draft = torch.stack(drafts, dim=1)
        p = _chain_target(lm, prev2, prev1, draft)
        return _emit(draft, verifier(p, torch.stack(qs, dim=1), draft, rng))

    return strategy


ChainDeterministicVerifier = Callable[[Tensor, Tensor, Rng, Tensor], ChainVerdict]


def ngram_chain(k: int, verifier: ChainDeterministicVerifier = verify.verify_deterministic_chain) -> Strategy:
    """N-gram drafts from the row's own context, verified by `verifier(p, draft, rng, n_draft)`."""

    def strategy(lm: TableLM, ctx: Tensor, length: Tensor, rng: Rng) -> tuple[Tensor, Tensor]:
        draft, n_draft = ngram_draft_batch(ctx, length, k, ngram_min=1, ngram_max=3)
        prev2, prev1 = _last_two(ctx, length)
        p = _chain_target(lm, prev2, prev1, draft)
        return _emit(draft, verifier(p, draft, rng, n_draft))

    return strategy


TreeVerifier = Callable[[Tensor, Tensor, Tensor, Tensor, Rng], TreeVerdict]


def _verify_tree_deterministic(p: Tensor, q: Tensor, tokens: Tensor, parents: Tensor, rng: Rng) -> TreeVerdict:
    return verify.verify_tree(p, tokens, parents, rng)


def topk_tree(topk: int, depth: int, budget: int, verifier: TreeVerifier = _verify_tree_deterministic) -> Strategy:
    """Top-k drafter children per node for `depth` levels, the best `budget` kept, then verified by
    `verifier(p [B,N,V], q [B,N,V] drafter probs at each node, tokens, parents, rng)`."""

    def strategy(lm: TableLM, ctx: Tensor, length: Tensor, rng: Rng) -> tuple[Tensor, Tensor]:
        B = ctx.shape[0]
        prev2, prev1 = _last_two(ctx, length)
        cand_tokens, cand_parents, cand_logprobs = [], [], []
        frontier = prev1[:, None]  # [B, W] tokens of the nodes expanded at this level
        frontier_idx = torch.full((B, 1), -1, dtype=torch.long)
        offset = 0
        for _ in range(depth):
            W = frontier.shape[1]
            children = lm.drafter_logits[frontier].topk(topk, dim=-1).indices  # [B, W, k]
            logq = lm.drafter[frontier].gather(2, children).log()
            cand_tokens.append(children.reshape(B, -1))
            cand_logprobs.append(logq.reshape(B, -1))
            cand_parents.append(frontier_idx[:, :, None].expand(B, W, topk).reshape(B, -1))
            frontier = children.reshape(B, -1)
            frontier_idx = offset + torch.arange(W * topk).expand(B, W * topk)
            offset += W * topk
        tree = build_tree(
            prev1, torch.cat(cand_tokens, 1), torch.cat(cand_parents, 1), torch.cat(cand_logprobs, 1), budget
        )
        parent_token = torch.where(tree.parents >= 0, tree.tokens.gather(1, tree.parents.clamp_min(0)), prev2[:, None])
        p = lm.target[parent_token, tree.tokens]  # [B, N, V]
        q = lm.drafter[tree.tokens]  # [B, N, V]
        verdict = verifier(p, q, tree.tokens, tree.parents, rng)
        path_tokens = tree.tokens.gather(1, verdict.path.clamp_min(0))
        out = torch.cat([path_tokens, torch.zeros_like(path_tokens[:, :1])], dim=1)
        out[torch.arange(B), verdict.n_accepted] = verdict.next_token
        return out, verdict.n_accepted + 1

    return strategy


def g_test_pvalue(samples: Tensor, joint: Tensor) -> float:
    """p-value of a G-test of `samples` [N, 3] against the exact `joint` [V, V, V].

    Cells expected below 5 are pooled into one bin; a sample in a zero-probability cell gives 0.
    """
    V = joint.shape[-1]
    n = samples.shape[0]
    cells = (samples[:, 0] * V + samples[:, 1]) * V + samples[:, 2]
    observed = torch.bincount(cells, minlength=V**3).double()
    expected = n * joint.reshape(-1).double()
    if bool((observed[expected == 0] > 0).any()):
        return 0.0
    big = expected >= 5
    small = ~big & (expected > 0)
    obs = torch.cat([observed[big], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    g = 2.0 * torch.where(obs > 0, obs * torch.log(obs / exp), torch.zeros_like(obs)).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), g / 2.0))


# ----- mutants: deliberately wrong verifiers, test-only -----


@contextmanager
def _patched(name: str, replacement: Callable) -> Iterator[None]:
    with mock.patch.object(verify, name, replacement):
        yield


def mutant_greedy_while_sampling(p: Tensor, q: Tensor, draft: Tensor, rng: Rng) -> ChainVerdict:
    """Exact-match verification used although the target samples."""
    return verify.verify_greedy(p, draft)


def mutant_swapped_pq(p: Tensor, q: Tensor, draft: Tensor, rng: Rng) -> ChainVerdict:
    """p and q swapped: accept with min(1, q/p), residual norm(max(0, q - p)), bonus from p."""
    return verify.verify_sampled(torch.cat([q, p[:, -1:]], dim=1), p[:, :-1], draft, rng)


def mutant_resample_from_p(p: Tensor, q: Tensor, draft: Tensor, rng: Rng) -> ChainVerdict:
    """On rejection, sample from p instead of the residual norm(max(0, p - q))."""
    with _patched("_residual", lambda p_n, q_n: p_n):
        return verify.verify_sampled(p, q, draft, rng)


def mutant_no_bonus(p: Tensor, q: Tensor, draft: Tensor, rng: Rng) -> ChainVerdict:
    """No bonus branch: when every draft is accepted, the next token still comes from the residual
    norm(max(0, p_K - q_{K-1})) as if the last draft had been rejected, instead of from p_K.

    (Merely dropping the bonus token and starting the next round is lossless, only slower; this is the
    lossy form of the mistake.)"""
    with _patched("_next_distribution", lambda p_n, q_n, rejected: verify._residual(p_n, q_n)):
        return verify.verify_sampled(p, q, draft, rng)


def mutant_ngram_greedy(p: Tensor, draft: Tensor, rng: Rng, n_draft: Tensor) -> ChainVerdict:
    """Exact-match verification of n-gram drafts although the target samples."""
    return verify.verify_greedy(p, draft, n_draft)


def mutant_ngram_resample_from_p(p: Tensor, draft: Tensor, rng: Rng, n_draft: Tensor) -> ChainVerdict:
    """On rejection of an n-gram draft, sample from p without removing the rejected token."""
    with _patched("_without_token", lambda p_n, token: p_n):
        return verify.verify_deterministic_chain(p, draft, rng, n_draft)


def mutant_tree_greedy(p: Tensor, q: Tensor, tokens: Tensor, parents: Tensor, rng: Rng) -> TreeVerdict:
    """Exact-match tree walk although the target samples."""
    return verify.verify_tree(p, tokens, parents, rng, greedy=True)


def mutant_tree_drafter_q(p: Tensor, q: Tensor, tokens: Tensor, parents: Tensor, rng: Rng) -> TreeVerdict:
    """Top-k children verified as if sampled from the drafter: accept x with min(1, r(x)/q(x)), on
    rejection r <- norm(max(0, r - q)), where q is the drafter's distribution at the parent node."""
    B, N, _ = p.shape
    rows = torch.arange(B)
    current = torch.zeros(B, dtype=torch.long)
    active = torch.ones(B, dtype=torch.bool)
    dist = p[:, 0].clone()
    path = torch.full((B, N - 1), -1, dtype=torch.long)
    n_acc = torch.zeros(B, dtype=torch.long)
    for _ in range(N - 1):
        children = (parents == current[:, None]) & (torch.arange(N) > 0) & active[:, None]
        rank = children.long().cumsum(1)
        q_parent = q[rows, current]
        moved = torch.zeros(B, dtype=torch.bool)
        chosen = torch.zeros(B, dtype=torch.long)
        for s in range(1, int(rank[:, -1].max()) + 1):
            sib = children & (rank == s)
            trying = sib.any(1) & ~moved
            child = sib.int().argmax(1)
            x = tokens[rows, child]
            r = dist / dist.sum(-1, keepdim=True)
            u = verify.uniforms(rng, B, 1, p.device)[:, 0]
            accept = trying & (u * q_parent[rows, x] < r[rows, x])
            reject = trying & ~accept
            dist = torch.where(reject[:, None], verify._residual(r, q_parent), dist)
            chosen = torch.where(accept, child, chosen)
            moved |= accept
        path[rows[moved], n_acc[moved]] = chosen[moved]
        n_acc += moved.long()
        current = torch.where(moved, chosen, current)
        dist = torch.where(moved[:, None], p[rows, current], dist)
        active &= moved
    return TreeVerdict(path, n_acc, verify.sample_from(dist, rng), current)
