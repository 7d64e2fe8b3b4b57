"""N-gram drafter: longest n first, most recent match, never crashes on short contexts, batch == single."""

from __future__ import annotations

import random

import pytest
import torch

from tlt.rollout.ngram import ngram_draft, ngram_draft_batch


def reference(context: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Plain loop version of the rule, for comparison."""
    for n in range(ngram_max, ngram_min - 1, -1):
        if len(context) < n + 1:
            continue
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


def test_proposes_continuation_of_earlier_occurrence():
    assert ngram_draft([1, 2, 3, 9, 1, 2], k=3, ngram_min=1, ngram_max=3) == [3, 9, 1]


def test_prefers_longer_ngram_over_more_recent_shorter_match():
    # tail (4, 2): matched at 0 (-> 7); tail (2,) alone matches more recently at 3 (-> 8)
    assert ngram_draft([4, 2, 7, 2, 8, 4, 2], k=1, ngram_min=1, ngram_max=2) == [7]


def test_takes_most_recent_match_of_same_length():
    assert ngram_draft([5, 1, 5, 2, 5], k=1, ngram_min=1, ngram_max=1) == [2]


def test_continuation_is_cut_at_end_of_context():
    assert ngram_draft([5, 6, 5], k=4, ngram_min=1, ngram_max=2) == [6, 5]


@pytest.mark.parametrize("context", [[], [7], [7, 7], [1, 2], [3, 3, 3]])
def test_short_contexts_never_crash(context: list[int]):
    assert ngram_draft(context, k=4, ngram_min=2, ngram_max=4) == reference(context, 4, 2, 4)
    assert ngram_draft(context, k=4, ngram_min=1, ngram_max=4) == reference(context, 4, 1, 4)


def test_zero_k_gives_no_draft():
    assert ngram_draft([1, 1, 1, 1], k=0, ngram_min=1, ngram_max=2) == []


def test_batch_matches_single_row_reference_with_padding():
    rnd = random.Random(0)
    contexts = [[rnd.randrange(4) for _ in range(rnd.randrange(0, 30))] for _ in range(200)]
    width = max(len(c) for c in contexts) + 3
    tokens = torch.full((len(contexts), width), 3, dtype=torch.long)  # padding that could match
    for i, c in enumerate(contexts):
        tokens[i, : len(c)] = torch.tensor(c, dtype=torch.long)
    lengths = torch.tensor([len(c) for c in contexts])
    draft, n_draft = ngram_draft_batch(tokens, lengths, k=5, ngram_min=1, ngram_max=4)
    for i, c in enumerate(contexts):
        expected = reference(c, 5, 1, 4)
        assert draft[i, : int(n_draft[i])].tolist() == expected, f"row {i}: {c}"
        assert bool((draft[i, int(n_draft[i]) :] == 0).all())


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="ngram_min"):
        ngram_draft([1, 2], k=2, ngram_min=3, ngram_max=2)
    with pytest.raises(ValueError, match="ngram_min"):
        ngram_draft([1, 2], k=2, ngram_min=0, ngram_max=2)
    with pytest.raises(ValueError, match="k"):
        ngram_draft([1, 2], k=-1, ngram_min=1, ngram_max=2)
