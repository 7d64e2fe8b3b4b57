"""A reduced draft vocabulary (`tlt.models.draft_vocab`): which tokens, the head over them, the worker's
counts, the spec field. That drafting from it stays lossless: tests/lossless (eager and compiled)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tlt.models.draft_vocab import DraftVocab, DraftVocabTracker, top_tokens
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request, SamplingParams
from tlt.spec.run import RunSpec


def test_the_most_counted_tokens_are_kept_ascending_ties_to_the_lower_id():
    counts = torch.tensor([5, 0, 3, 3, 9, 1])
    assert top_tokens(counts, 3).tolist() == [0, 2, 4]  # 9, 5, then 3 at ids 2 and 3: the lower id
    assert top_tokens(counts, 3, always=[5]).tolist() == [0, 4, 5]  # a stop token is always drafted
    assert top_tokens(torch.zeros(4, dtype=torch.long), 2).tolist() == [0, 1]  # nothing counted yet


@pytest.mark.parametrize(
    ("size", "always", "match"),
    [
        (0, (), r"in \[1, 6\]"),
        (7, (), r"in \[1, 6\]"),
        (3, (6,), "outside the vocabulary"),
        (1, (0, 1), "do not fit"),
    ],
)
def test_impossible_subsets_are_refused(size, always, match):
    with pytest.raises(ValueError, match=match):
        top_tokens(torch.ones(6, dtype=torch.long), size, always)


def test_the_head_over_the_subset_is_the_full_heads_there_and_minus_infinity_elsewhere():
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 10, bias=True)
    vocab = DraftVocab(head, 3)
    ids, rows = vocab.ids, vocab.rows
    vocab.update(torch.tensor([1, 4, 7]), head)
    pred = torch.randn(2, 5, 4)
    got = vocab.logits(pred)  # [2, 5, 10]
    want = head(pred).detach()
    assert got.shape == (2, 5, 10)
    torch.testing.assert_close(got[..., [1, 4, 7]], want[..., [1, 4, 7]])
    assert torch.isneginf(got[..., [0, 2, 3, 5, 6, 8, 9]]).all()
    with torch.no_grad():
        head.weight.mul_(2.0)  # a policy update copies new weights in place
    vocab.update(torch.tensor([1, 4, 7]), head)
    torch.testing.assert_close(vocab.logits(pred)[..., [1, 4, 7]], head(pred).detach()[..., [1, 4, 7]])
    assert vocab.ids is ids and vocab.rows is rows  # refreshed in place: compiled graphs keep reading them


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([4, 1, 7], "ascending"),
        ([1, 1, 7], "ascending"),
        ([1, 4, 10], "outside"),
        ([1, 4], "3 ids"),
    ],
)
def test_bad_subsets_are_refused_and_the_old_one_kept(ids, match):
    head = torch.nn.Linear(4, 10, bias=False)
    vocab = DraftVocab(head, 3)
    with pytest.raises(ValueError, match=match):
        vocab.update(torch.tensor(ids), head)
    assert vocab.ids.tolist() == [0, 1, 2]


def test_a_draft_vocabulary_must_be_smaller_than_the_policys():
    with pytest.raises(ValueError, match=r"speculative.draftVocab must be in \[1, 9\]"):
        DraftVocab(torch.nn.Linear(4, 10), 10)


def test_the_drafter_drafts_from_its_subset_and_trains_on_the_whole_head():
    model = tiny_model("qwen2", vocab_size=32, seed=0)
    drafter = EagleDrafter(drafter_config_from_target(model.config))
    drafter.bind_policy(model)
    pred = torch.randn(3, model.config.hidden_size)
    assert drafter.set_draft_vocab(0) is None and drafter.draft_vocab is None
    torch.testing.assert_close(drafter.draft_logits(pred), drafter.logits(pred))
    vocab = drafter.set_draft_vocab(8)
    vocab.update(torch.arange(0, 32, 4), model.get_output_embeddings())
    drafts = drafter.draft_logits(pred).argmax(-1)
    assert all(int(t) % 4 == 0 for t in drafts)
    assert torch.isfinite(drafter.logits(pred)).all()  # the training objective's logits: the whole head
    other = tiny_model("qwen2", vocab_size=32, seed=1)
    drafter.bind_policy(other)  # rebinding (a replaced policy) takes the new head's rows for the same ids
    torch.testing.assert_close(drafter.draft_logits(pred)[:, ::4], drafter.logits(pred)[:, ::4])


def test_the_tracker_picks_from_prompts_then_counts_responses_and_their_coverage():
    head = torch.nn.Linear(4, 12, bias=False)
    tracker = DraftVocabTracker(DraftVocab(head, 3), head)
    tracker.before([[1, 1, 2], [1, 5]], always=[11])
    assert tracker.vocab.ids.tolist() == [1, 2, 11]  # the two commonest prompt tokens and the stop token
    assert tracker.after([[1, 3, 11], [3, 3]]) == (2, 5)  # 1 and 11 were in the subset; 3 three times was not
    tracker.before([[2]], always=[11])
    assert tracker.vocab.ids.tolist() == [1, 3, 11]  # 1 (x4) and 3 (x3) outcount 2 (x2)
    assert tracker.after([]) == (0, 0)
    resumed = DraftVocabTracker(DraftVocab(head, 3), head)
    resumed.load_counts(tracker.counts)  # from a whole-run checkpoint
    resumed.before([], always=[11])
    assert resumed.vocab.ids.tolist() == [1, 3, 11]
    with pytest.raises(ValueError, match=r"speculative.draftVocab \(3\) must hold the requests' 4 stop tokens"):
        resumed.before([], always=[0, 1, 2, 11])
    with pytest.raises(ValueError, match="this policy has 12"):
        resumed.load_counts(torch.zeros(13, dtype=torch.long))


def test_the_engine_repicks_the_subset_every_generate_and_reports_coverage():
    model = tiny_model("qwen2", vocab_size=32, seed=0)
    engine = Engine(model, max_batch_size=2, max_context=32)
    head = model.get_output_embeddings()
    engine.draft_vocab = DraftVocabTracker(DraftVocab(head, 4), head)
    requests = [
        Request(f"r{i}", [7, 7, 9, 3], SamplingParams(temperature=1.0, max_new_tokens=6, seed=i, stop_token_ids=(31,)))
        for i in range(3)
    ]
    out = engine.generate(requests)
    assert engine.draft_vocab.vocab.ids.tolist() == [3, 7, 9, 31]
    inside, total = engine.draft_vocab_coverage
    assert total == sum(len(c.token_ids) for c in out)
    assert inside == sum(t in (3, 7, 9, 31) for c in out for t in c.token_ids)


def test_the_spec_field_defaults_off_and_must_hold_every_trees_topk():
    assert RunSpec().speculative.draft_vocab == 0
    ok = RunSpec.model_validate({"speculative": {"draftVocab": 32768}})
    assert ok.speculative.draft_vocab == 32768
    arms = [{"kind": "tree", "depth": 2, "topk": 4}]
    with pytest.raises(ValidationError, match="speculative.draftVocab must be 0"):
        RunSpec.model_validate({"speculative": {"draftVocab": 3, "arms": arms}})
    with pytest.raises(ValidationError, match="draftVocab|draft_vocab"):
        RunSpec.model_validate({"speculative": {"draftVocab": -1}})
