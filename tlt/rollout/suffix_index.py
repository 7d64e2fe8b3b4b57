"""A bounded-depth suffix trie with occurrence counts, updated one token at a time.

Why a depth-bounded suffix trie (and not a suffix tree or suffix automaton): drafting needs, for a
row's context, (a) the longest recent suffix that occurred before and (b) the MOST FREQUENT
continuations of it across the group's responses. A trie node is one substring (of at most `depth`
tokens); its count is the number of its occurrences, so the best continuation of a match is its
child with the largest count, read in O(children). A suffix automaton is smaller, but its occurrence
counts need a pass over the suffix-link tree after every change, and it cannot forget a document; a
suffix tree can, but it is much more code for the same answers at bounded depth. The trie is updated
incrementally: appending token t to a document extends the nodes of its current suffixes (at most
`depth` of them, the document's "frontier") by t, so a step costs O(depth) per new token, with no
rebuild; removing a document (eviction) replays its suffixes with -1 and frees nodes that reach 0.

Substrings longer than `depth` are not indexed: a match is at most `depth - k` tokens long when k
tokens must follow it. Many independent documents share one trie per key (e.g. all responses to one
prompt); separate keys have separate roots in one node pool, so one cap bounds all of them.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field


@dataclass
class Doc:
    """One document being indexed under `key`: its tokens so far and its frontier (the nodes of its
    suffixes of 0..depth-1 tokens, shortest first; frontier[0] is the key's root)."""

    key: Hashable
    tokens: list[int] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)


class SuffixTrie:
    """Suffix tries of depth `depth` over documents, one root per key, in one node pool.

    Node arrays: `count[n]` occurrences of n's substring over the documents of its key, `depth_of[n]`
    its length, `children[n]` {token: child} (None for a leaf). Node ids of freed nodes are reused.
    """

    def __init__(self, depth: int) -> None:
        if depth < 2:
            raise ValueError(f"depth must be >= 2 tokens (a match and one continuation), got {depth}")
        self.depth = depth
        self.count: list[int] = []
        self.depth_of: list[int] = []
        self.children: list[dict[int, int] | None] = []
        self.roots: dict[Hashable, int] = {}
        self._docs: dict[Hashable, int] = {}  # documents indexed per key (a root lives while > 0)
        self._free: list[int] = []
        self.num_nodes = 0  # live nodes, roots included

    # -- nodes ----------------------------------------------------------------------------------
    def _new(self, depth: int) -> int:
        self.num_nodes += 1
        if self._free:
            n = self._free.pop()
            self.count[n], self.depth_of[n], self.children[n] = 0, depth, None
            return n
        self.count.append(0)
        self.depth_of.append(depth)
        self.children.append(None)
        return len(self.count) - 1

    def root(self, key: Hashable) -> int:
        """The root node of `key` (created on first use)."""
        node = self.roots.get(key)
        if node is None:
            node = self.roots[key] = self._new(0)
        return node

    def child(self, node: int, token: int) -> int | None:
        kids = self.children[node]
        return None if kids is None else kids.get(token)

    # -- documents -------------------------------------------------------------------------------
    def open(self, key: Hashable, tokens: Iterable[int] = ()) -> Doc:
        """Start a document under `key`, indexing `tokens` (e.g. the prompt)."""
        doc = Doc(key, [], [self.root(key)])
        self._docs[key] = self._docs.get(key, 0) + 1
        self.extend(doc, tokens)
        return doc

    def extend(self, doc: Doc, tokens: Iterable[int]) -> None:
        """Append tokens to `doc`: every suffix ending at each new token gains one occurrence."""
        depth = self.depth
        count, depth_of, children = self.count, self.depth_of, self.children
        root = doc.frontier[0]
        for token in tokens:
            nxt = [root]
            for node in doc.frontier:
                kids = children[node]
                if kids is None:
                    kids = children[node] = {}
                c = kids.get(token)
                if c is None:
                    c = kids[token] = self._new(depth_of[node] + 1)
                count[c] += 1
                if depth_of[c] < depth:
                    nxt.append(c)
            doc.frontier = nxt
            doc.tokens.append(token)

    def remove(self, doc: Doc) -> None:
        """Forget `doc`: every occurrence it added is taken back; nodes that reach 0 are freed (and so is
        the key's root once its last document is gone)."""
        if not doc.frontier:
            raise ValueError("this document was already removed")
        root = self.roots[doc.key]
        toks = doc.tokens
        for start in range(len(toks)):
            parent = root
            for token in toks[start : start + self.depth]:
                node = self.children[parent][token]  # type: ignore[index]
                self.count[node] -= 1
                if self.count[node] == 0:
                    del self.children[parent][token]  # type: ignore[arg-type]
                    self._free_subtree(node)
                    break
                parent = node
        self._docs[doc.key] -= 1
        if not self._docs[doc.key]:
            del self._docs[doc.key], self.roots[doc.key]
            self._free.append(root)
            self.num_nodes -= 1
        doc.frontier = []

    def _free_subtree(self, node: int) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            kids = self.children[n]
            if kids:
                stack.extend(kids.values())
            self.children[n] = None
            self._free.append(n)
            self.num_nodes -= 1

    # -- queries ---------------------------------------------------------------------------------
    def longest_match(self, doc: Doc, min_len: int, max_len: int) -> int | None:
        """The deepest frontier node of `doc` with depth in [min_len, max_len] that has a continuation
        (a child): the longest suffix of the document that occurred before with something after it.
        None when no such suffix exists."""
        for node in reversed(doc.frontier):
            d = self.depth_of[node]
            if d < min_len:
                return None
            if d <= max_len and self.children[node]:
                return node
        return None

    def best_path(self, node: int, k: int) -> list[int]:
        """Up to k tokens following `node`, each the most frequent child of the previous (ties: the
        child seen first)."""
        return self.scored_path(node, k)[0]

    def scored_path(self, node: int, k: int) -> tuple[list[int], float]:
        """`best_path` and its expected accepted length under the index's own frequencies: the sum over
        i of the product of the first i tokens' shares of their parent's continuations."""
        out: list[int] = []
        expected, reach = 0.0, 1.0
        count = self.count
        while len(out) < k:
            kids = self.children[node]
            if not kids:
                break
            total = 0
            best_token, best = -1, -1
            for token, child in kids.items():
                c = count[child]
                total += c
                if best < 0 or c > count[best]:
                    best_token, best = token, child
            reach *= count[best] / total
            expected += reach
            out.append(best_token)
            node = best
        return out, expected

    def top_children(self, node: int, k: int) -> list[tuple[int, int, float]]:
        """The k most frequent children of `node` as (token, child, share of the node's continuations)."""
        kids = self.children[node]
        if not kids:
            return []
        total = sum(self.count[c] for c in kids.values())
        best = sorted(kids.items(), key=lambda kv: -self.count[kv[1]])[:k]
        return [(token, c, self.count[c] / total) for token, c in best]
