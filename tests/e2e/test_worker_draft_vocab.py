"""A rollout worker with `speculative.draftVocab`: its drafter drafts from the tokens its prompts and responses
hold most often, re-picked every rollout (stop tokens kept), and each rollout reports how many generated
tokens that subset held. Lossless drafting from a subset: tests/lossless."""

from __future__ import annotations

from test_worker_history import _worker


def test_each_rollout_repicks_the_draft_vocabulary_and_reports_its_coverage():
    worker, weights, problems = _worker(draftVocab=8, arms=[{"kind": "chain", "depth": 2}])
    vocab = worker.drafting.drafter.draft_vocab
    assert vocab is not None and vocab.size == 8 and worker.engine.draft_vocab is worker.drafting.draft_vocab
    stop = worker.tokenizer.eos_token_id
    first = worker.rollout(1, [0, 1], problems[:2], weights, None)
    inside, total = first["draft_vocab_coverage"]
    assert total == sum(len(c.token_ids) for c in first["completions"]) > 0 and 0 <= inside <= total
    assert stop in vocab.ids.tolist()  # a draft can end a response
    counts = worker.drafting.draft_vocab.counts.clone()
    second = worker.rollout(2, [2, 3], problems[2:4], weights, None)
    assert second["draft_vocab_coverage"][1] == sum(len(c.token_ids) for c in second["completions"])
    assert int(worker.drafting.draft_vocab.counts.sum()) > int(counts.sum())  # the second rollout's tokens were counted
    assert worker.drafting.drafter.draft_vocab is vocab  # refreshed in place, never replaced (compiled graphs read it)


def test_the_counts_travel_with_the_workers_checkpointed_drafter_state():
    worker, weights, problems = _worker(draftVocab=8, arms=[{"kind": "chain", "depth": 2}])
    worker.rollout(1, [0, 1], problems[:2], weights, None)
    state = worker.trainer_state()
    assert "buffer" in state and state["draft_vocab_counts"].sum() == worker.drafting.draft_vocab.counts.sum() > 0
    resumed, _, _ = _worker(draftVocab=8, arms=[{"kind": "chain", "depth": 2}])
    resumed.load_trainer_state(state)
    assert resumed.drafting.draft_vocab.counts.equal(worker.drafting.draft_vocab.counts)
    assert len(resumed.drafting.trainer.buffer.samples) == len(worker.drafting.trainer.buffer.samples) > 0
    off, _, _ = _worker(arms=[{"kind": "chain", "depth": 2}])  # a run resumed without a draft vocabulary
    off.load_trainer_state(state)  # ignores the counts, restores the buffer
