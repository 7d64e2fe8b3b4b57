"""Rollout-history drafting: drafts read from the prompt's other responses, no model forward.

In GRPO every prompt is answered `group_size` times per step and again in later steps; the answers
share long spans. `HistoryStore` indexes, per prompt (its token ids are the key), every response as
it is generated (prompt + response tokens, in a `SuffixTrie`): the siblings of this step, the same
prompt's responses from earlier steps still in the store, and the row's own text. A row's draft is
the most frequent continuation of the longest suffix of its context (at least `min_match`, at most
`max_match` tokens) found in that index: a chain (`HistoryDrafter`) or a small tree of the most
frequent branches (`HistoryTreeDrafter`). The n-gram drafter's matches (the row's own text) are a
special case; it stays as the arm that needs no store.

The store is bounded: when the trie holds more than `max_nodes` nodes, the oldest finished responses
are forgotten first (in the order they finished); responses still being generated are never evicted,
so one step may exceed the cap until it ends. It lives as long as its owner (a rollout worker keeps
one across steps) and is not checkpointed: after a restart it starts empty and refills from the next
step's rollouts. Drafts are deterministic: verified with the one-hot rule (lossless).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from tlt.rollout.batch import RunningBatch
from tlt.rollout.drafting import Draft
from tlt.rollout.sequence import Sequence
from tlt.rollout.suffix_index import Doc, SuffixTrie
from tlt.rollout.tree import build_tree, chain_tree


class HistoryStore:
    """Per-prompt suffix index of responses (see the module docstring).

    max_nodes: trie nodes kept at most between steps (~0.3 KB each); min_match / max_match: lengths of
    the context suffix matched; max_draft: longest draft it can give (the trie depth is
    max_match + max_draft).
    """

    def __init__(self, *, max_nodes: int, min_match: int, max_match: int, max_draft: int) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, max_match={max_match}")
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1 token, got {max_draft}")
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
        self.max_nodes, self.min_match, self.max_match, self.max_draft = max_nodes, min_match, max_match, max_draft
        self.trie = SuffixTrie(max_match + max_draft)
        # id(sequence) -> (sequence, its document); holding the sequence keeps its id unique meanwhile
        self._live: dict[int, tuple[Sequence, Doc]] = {}
        self._closed: dict[int, tuple[Sequence, Doc]] = {}  # finished responses, oldest first
        self.evicted = 0

    @property
    def num_docs(self) -> int:
        return len(self._live) + len(self._closed)

    def observe(self, sequences: Iterable[Sequence]) -> None:
        """Index the tokens these sequences generated since last seen; a finished one becomes history.
        Idempotent; call it with a wave's sequences during the wave and once at its end."""
        for seq in sequences:
            if id(seq) in self._closed:
                continue
            entry = self._live.get(id(seq))
            if entry is None:
                if seq.finished and not seq.tokens:
                    continue
                entry = self._live[id(seq)] = (
                    seq,
                    self.trie.open(tuple(seq.request.prompt_ids), seq.request.prompt_ids),
                )
            doc = entry[1]
            done = len(doc.tokens) - seq.prompt_len
            if done < len(seq.tokens):
                self.trie.extend(doc, seq.tokens[done:])
            if seq.finished:
                self._closed[id(seq)] = self._live.pop(id(seq))
        self._evict()

    def doc(self, seq: Sequence) -> Doc:
        """The document of a running sequence (after `observe`)."""
        return self._live[id(seq)][1]

    def _evict(self) -> None:
        while self.trie.num_nodes > self.max_nodes and self._closed:
            _, doc = self._closed.pop(next(iter(self._closed)))
            self.trie.remove(doc)
            self.evicted += 1

    def match(self, seq: Sequence) -> int | None:
        """The trie node of the row's longest suffix with a continuation, or None."""
        return self.trie.longest_match(self.doc(seq), self.min_match, self.max_match)

    def chain(self, seq: Sequence, k: int) -> list[int]:
        """Up to k history tokens for a running sequence ([] when nothing matched)."""
        return self.scored_chain(seq, k)[0]

    def scored_chain(self, seq: Sequence, k: int) -> tuple[list[int], float]:
        """`chain` and its expected accepted length by the index's frequencies (0 when nothing matched)."""
        node = self.match(seq)
        return ([], 0.0) if node is None else self.trie.scored_path(node, k)


class HistoryDrafter:
    """Chains of up to k tokens from the history store (rows without a match draft nothing)."""

    def __init__(self, store: HistoryStore, k: int) -> None:
        if not 1 <= k <= store.max_draft:
            raise ValueError(f"k (draft length) must be in [1, {store.max_draft}] (history.maxDraft), got {k}")
        self.store, self.k = store, k

    def propose(self, batch: RunningBatch) -> Draft:
        self.store.observe(batch.all_sequences)
        drafts = [self.store.chain(seq, self.k) for seq in batch.sequences]
        return Draft(chain_tree(batch.last_token, *pad_drafts(drafts, self.k, batch.device)), chain=True)


class HistoryTreeDrafter:
    """Trees of the most frequent continuations: from the match, the topk most frequent children of
    every expanded node for `depth` levels; the `budget` most frequent paths are verified."""

    def __init__(self, store: HistoryStore, *, topk: int, depth: int, budget: int) -> None:
        if topk < 1 or budget < 1 or not 1 <= depth <= store.max_draft:
            raise ValueError(
                f"need topk >= 1, budget >= 1 and 1 <= depth <= {store.max_draft} (history.maxDraft), "
                f"got topk={topk}, depth={depth}, budget={budget}"
            )
        self.store, self.topk, self.depth, self.budget = store, topk, depth, budget

    def propose(self, batch: RunningBatch) -> Draft:
        self.store.observe(batch.all_sequences)
        rows = [self._candidates(seq) for seq in batch.sequences]
        C = max(1, max(len(r) for r in rows))
        B, dev = len(rows), batch.device
        tokens = torch.zeros(B, C, dtype=torch.long)
        parents = torch.full((B, C), -1, dtype=torch.long)
        logprobs = torch.zeros(B, C, dtype=torch.float64)
        valid = torch.zeros(B, C, dtype=torch.bool)
        for b, cands in enumerate(rows):
            for c, (token, parent, logprob) in enumerate(cands):
                tokens[b, c], parents[b, c], logprobs[b, c], valid[b, c] = token, parent, logprob, True
        tree = build_tree(
            batch.last_token, tokens.to(dev), parents.to(dev), logprobs.to(dev), self.budget, valid.to(dev)
        )
        return Draft(tree, chain=False)

    def _candidates(self, seq: Sequence) -> list[tuple[int, int, float]]:
        """(token, parent candidate or -1, log share of the parent's continuations), parents first."""
        trie = self.store.trie
        node = self.store.match(seq)
        if node is None:
            return []
        out: list[tuple[int, int, float]] = []
        level = [(node, -1)]
        for _ in range(self.depth):
            nxt = []
            for parent_node, parent_idx in level:
                for token, child, share in trie.top_children(parent_node, self.topk):
                    out.append((token, parent_idx, math.log(share)))
                    nxt.append((child, len(out) - 1))
            level = nxt
        return out


def pad_drafts(drafts: list[list[int]], k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged drafts (each <= k tokens) as (draft [B, k] zero-padded, n_draft [B])."""
    draft = torch.zeros(len(drafts), k, dtype=torch.long)
    for b, d in enumerate(drafts):
        draft[b, : len(d)] = torch.tensor(d, dtype=torch.long)
    return draft.to(device), torch.tensor([len(d) for d in drafts], dtype=torch.long, device=device)
