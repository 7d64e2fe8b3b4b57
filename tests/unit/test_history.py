"""The rollout-history store and drafters, the per-row gate and the mixed drafter's choice of source."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tlt.rollout.drafting import Draft
from tlt.rollout.history import HistoryDrafter, HistoryStore, HistoryTreeDrafter
from tlt.rollout.mixed import MixedDrafter, RowGate
from tlt.rollout.sequence import Sequence
from tlt.rollout.tree import chain_tree
from tlt.rollout.types import Request


def _seq(rid: str, prompt: list[int], tokens: list[int], finished: bool = False) -> Sequence:
    s = Sequence(Request(rid, prompt), limit=100, tokens=list(tokens))
    if finished:
        s.finish_reason = "stop"
    return s


def _batch(running: list[Sequence], done: list[Sequence] = ()) -> SimpleNamespace:
    return SimpleNamespace(
        sequences=running,
        all_sequences=[*running, *done],
        device=torch.device("cpu"),
        last_token=torch.tensor([s.tokens[-1] if s.tokens else s.request.prompt_ids[-1] for s in running]),
        uniform_buf=None,
    )


def _store(**kw) -> HistoryStore:
    return HistoryStore(**{"max_nodes": 100_000, "min_match": 2, "max_match": 4, "max_draft": 4, **kw})


def test_a_row_drafts_what_its_finished_sibling_said_after_the_same_words():
    store = _store()
    sibling = _seq("a", [1, 2], [10, 11, 12, 13, 14, 3], finished=True)
    row = _seq("b", [1, 2], [10, 11])
    draft = HistoryDrafter(store, k=3).propose(_batch([row], [sibling]))
    assert draft.tree.tokens[0].tolist() == [11, 12, 13, 14] and draft.chain


def test_other_prompts_never_draft_and_rows_without_a_match_draft_nothing():
    store = _store()
    other = _seq("a", [7, 7], [10, 11, 12, 13], finished=True)
    row = _seq("b", [1, 2], [10, 11])
    draft = HistoryDrafter(store, k=3).propose(_batch([row], [other]))
    assert draft.tree.valid[0].tolist() == [True, False, False, False]


def test_history_survives_across_rollouts_and_observing_twice_changes_nothing():
    store = _store()
    first = _seq("a", [1, 2], [5, 6, 7, 8, 9], finished=True)
    store.observe([first])
    nodes = store.trie.num_nodes
    store.observe([first])
    assert store.trie.num_nodes == nodes and store.num_docs == 1
    row = _seq("b", [1, 2], [5, 6])  # a later step's response to the same prompt
    assert HistoryDrafter(store, k=4).propose(_batch([row])).tree.tokens[0, 1:].tolist() == [7, 8, 9, 0]


def test_the_store_forgets_the_oldest_finished_responses_first_and_never_a_running_one():
    store = _store(max_nodes=1_000)
    running = _seq("live", [1], list(range(100, 160)))
    for i in range(30):
        store.observe([running, _seq(f"d{i}", [1], [i, *range(200 + 30 * i, 230 + 30 * i)], finished=True)])
        assert store.trie.num_nodes <= 1_000 or store.num_docs == 1
    assert store.evicted > 0
    assert store.doc(running).tokens[-1] == 159  # the running response is intact
    kept = store.trie.longest_match(store.doc(running), 2, 4)
    assert kept is None  # nothing else continues its text


def test_history_tree_offers_the_frequent_branches():
    store = _store()
    done = [_seq(f"s{i}", [1, 2], [10, 11, t, 5], finished=True) for i, t in enumerate([20, 20, 21])]
    row = _seq("r", [1, 2], [10, 11])
    tree = HistoryTreeDrafter(store, topk=2, depth=2, budget=3).propose(_batch([row], done)).tree
    assert tree.tokens[0].tolist() == [11, 20, 21, 5] and tree.parents[0].tolist() == [-1, 0, 0, 1]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_match"):
        HistoryStore(max_nodes=10, min_match=3, max_match=2, max_draft=2)
    with pytest.raises(ValueError, match="maxDraft"):
        HistoryDrafter(_store(), k=5)


def test_row_gate_pauses_rows_whose_drafts_fail_and_backs_off():
    gate = RowGate(patience=2, backoff=2, max_backoff=8)
    seq = _seq("r", [1], [])
    allowed = []
    for _ in range(12):  # every draft rejected: the row gains exactly one token per step
        ok = gate.allow([seq])[0]
        allowed.append(ok)
        if ok:
            gate.drafted(seq, 3)
        seq.tokens.append(0)
    # two failures, a pause of 2, one more failure, a pause of 4, one more failure, a pause of 8
    assert allowed == [True, True, False, False, True, False, False, False, False, True, False, False]
    assert gate.skipped == 8


def test_row_gate_resets_after_an_accepted_draft():
    gate = RowGate(patience=2)
    seq = _seq("r", [1], [])
    for gained in (1, 3, 1, 1):
        assert gate.allow([seq]) == [True]
        gate.drafted(seq, 3)
        seq.tokens.extend([0] * gained)
    assert gate.allow([seq]) == [False]  # the two failures in a row come only at the end


class _FakeEagle:
    def __init__(self, k: int) -> None:
        self.k, self.calls = k, 0

    def propose(self, batch) -> Draft:
        self.calls += 1
        return Draft(chain_tree(batch.last_token, torch.full((len(batch.sequences), self.k), 9)), chain=True)


def test_mixed_takes_history_where_it_matches_else_eagle():
    store = _store()
    done = _seq("s", [1, 2], [10, 11, 12, 13], finished=True)
    rows = [_seq("a", [1, 2], [10, 11]), _seq("b", [1, 2], [30, 31])]
    eagle = _FakeEagle(k=2)
    draft = MixedDrafter(store, eagle, k=2).propose(_batch(rows, [done]))
    assert draft.tree.tokens[:, 1:].tolist() == [[12, 13], [9, 9]] and eagle.calls == 1


def test_mixed_skips_the_learned_drafter_when_every_row_has_history_or_is_paused():
    store = _store()
    done = _seq("s", [1, 2], [10, 11, 12, 13], finished=True)
    eagle = _FakeEagle(k=2)
    mixed = MixedDrafter(store, eagle, k=2)
    mixed.propose(_batch([_seq("a", [1, 2], [10, 11])], [done]))
    assert eagle.calls == 0 and mixed.sources == {"history": 1, "eagle": 0, "none": 0}


def test_mixed_prefers_the_learned_drafter_over_an_uncertain_history_match():
    store = _store()
    done = [_seq(f"s{i}", [1, 2], [10, 11, t, 5], finished=True) for i, t in enumerate([20, 21, 22, 23])]
    eagle = _FakeEagle(k=2)
    mixed = MixedDrafter(store, eagle, k=2)  # expects k / 2 = 1 token from EAGLE at first
    draft = mixed.propose(_batch([_seq("a", [1, 2], [10, 11])], done))  # history: 4 ways, 0.25 + 0.25
    assert eagle.calls == 1 and draft.tree.tokens[0, 1:].tolist() == [9, 9]
    assert mixed.sources == {"history": 0, "eagle": 1, "none": 0}
