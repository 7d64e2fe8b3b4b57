"""The bounded-depth suffix trie: counts equal brute-force substring counts, incremental updates
equal a fresh build, removal gives every node back, matches and continuations are the right ones."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tlt.rollout.suffix_index import SuffixTrie


def _substring_counts(docs: list[list[int]], depth: int) -> Counter:
    out: Counter = Counter()
    for d in docs:
        for i in range(len(d)):
            for j in range(i + 1, min(i + depth, len(d)) + 1):
                out[tuple(d[i:j])] += 1
    return out


def _trie_counts(trie: SuffixTrie, key) -> Counter:
    out: Counter = Counter()
    stack = [(trie.roots[key], ())]
    while stack:
        node, path = stack.pop()
        for token, child in (trie.children[node] or {}).items():
            out[path + (token,)] = trie.count[child]
            stack.append((child, path + (token,)))
    return out


def _random_docs(rng: random.Random, n: int, vocab: int = 4) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_counts_equal_brute_force_whatever_the_interleaving(seed: int):
    rng = random.Random(seed)
    docs = _random_docs(rng, 4)
    trie = SuffixTrie(depth=5)
    handles = [trie.open("k") for _ in docs]
    progress = [0] * len(docs)
    while any(p < len(d) for p, d in zip(progress, docs)):  # append a few tokens to a random document
        i = rng.choice([i for i, d in enumerate(docs) if progress[i] < len(d)])
        n = rng.randint(1, 3)
        trie.extend(handles[i], docs[i][progress[i] : progress[i] + n])
        progress[i] = min(progress[i] + n, len(docs[i]))
    assert _trie_counts(trie, "k") == _substring_counts(docs, 5)
    assert trie.num_nodes == 1 + len(_substring_counts(docs, 5))


def test_removal_leaves_what_a_build_without_the_document_gives_and_frees_nodes():
    rng = random.Random(7)
    docs = _random_docs(rng, 6)
    trie = SuffixTrie(depth=4)
    handles = [trie.open("k", d) for d in docs]
    for i in (0, 3, 5):
        trie.remove(handles[i])
    kept = [d for i, d in enumerate(docs) if i not in (0, 3, 5)]
    assert _trie_counts(trie, "k") == _substring_counts(kept, 4)
    assert trie.num_nodes == 1 + len(_substring_counts(kept, 4))
    for i in (1, 2, 4):
        trie.remove(handles[i])
    assert trie.num_nodes == 0 and "k" not in trie.roots
    with pytest.raises(ValueError, match="already removed"):
        trie.remove(handles[1])
    again = trie.open("k", docs[0])  # freed node ids are reused
    assert _trie_counts(trie, "k") == _substring_counts([docs[0]], 4)
    assert len(trie.count) <= 1 + sum(len(_substring_counts([d], 4)) for d in docs)
    assert again.tokens == docs[0]


def test_keys_are_separate_indexes():
    trie = SuffixTrie(depth=3)
    a = trie.open("a", [1, 2, 3, 1, 2])
    trie.open("b", [1, 2, 9])
    assert trie.best_path(trie.longest_match(a, 1, 2), 1) == [3]  # from key a only, never b's 9


def test_longest_match_is_the_longest_suffix_that_occurred_before_with_a_continuation():
    trie = SuffixTrie(depth=8)
    trie.open("k", [5, 1, 2, 3, 7, 7])
    doc = trie.open("k", [9, 2, 3])
    node = trie.longest_match(doc, 1, 6)
    assert trie.depth_of[node] == 2 and trie.best_path(node, 4) == [7, 7]  # "2 3" -> "7 7"
    assert trie.longest_match(doc, 3, 6) is None  # "9 2 3" never occurred
    own = trie.open("z", [4, 4, 4])
    assert trie.best_path(trie.longest_match(own, 1, 6), 3) == [4]  # own text; "4 4" ends the document


def test_best_path_follows_the_most_frequent_continuation_and_top_children_their_shares():
    trie = SuffixTrie(depth=6)
    for tail in ([8, 1], [8, 2], [8, 1], [9, 3]):
        trie.open("k", [1, 2, *tail])
    doc = trie.open("k", [0, 1, 2])
    node = trie.longest_match(doc, 1, 3)
    assert trie.best_path(node, 3) == [8, 1]
    assert [(t, round(s, 2)) for t, _, s in trie.top_children(node, 2)] == [(8, 0.75), (9, 0.25)]


def test_bad_depth_is_refused():
    with pytest.raises(ValueError, match="depth must be >= 2"):
        SuffixTrie(depth=1)


def test_scored_path_expects_the_product_of_shares_summed_over_prefixes():
    trie = SuffixTrie(depth=6)
    for tail in ([8, 1], [8, 1], [8, 2], [9, 3]):
        trie.open("k", [1, 2, *tail])
    node = trie.longest_match(trie.open("k", [0, 1, 2]), 1, 3)
    tokens, expected = trie.scored_path(node, 2)
    assert tokens == [8, 1] and expected == pytest.approx(0.75 + 0.75 * (2 / 3))
