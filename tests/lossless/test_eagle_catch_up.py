"""EAGLE drafts inside the engine: a drafter switched on mid-generation catches up from the cached hidden
states (no target prefill) and the output stays plain decoding's; rows far apart catch up inside the
drafter's cache; the cached drafter drafts what its own full forward predicts (Qwen2 and Qwen3 targets)."""

from __future__ import annotations

import _engine_cases as C
import _sd_helpers as H
import pytest
import torch

from tlt.models.drafter import EagleDrafter
from tlt.rollout.batch import RunningBatch
from tlt.rollout.drafting import Draft, EagleChainDrafter
from tlt.rollout.eagle_tree import EagleTreeDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.sequence import Sequence
from tlt.rollout.speculative import SpeculativeStepper
from tlt.rollout.types import Request, SamplingParams


def _assert_first_drafts_follow_full_forward(model, drafter: EagleDrafter, batch: RunningBatch, draft: Draft) -> None:
    """Each row's first draft is the argmax of the drafter's own full (cache-free) forward."""
    for b, seq in enumerate(batch.sequences):
        ids = torch.tensor([seq.request.prompt_ids + seq.tokens])
        feats = model.model(input_ids=ids).last_hidden_state
        pred = drafter(ids[:, 1:], feats[:, :-1], torch.arange(ids.shape[1] - 1)[None, :])
        assert int(draft.tree.tokens[b, 1]) == int(drafter.logits(pred)[0, -1].argmax())


def test_eagle_catch_up_switches_on_mid_generation_without_target_prefill(model64, plain64):
    """Plain steps first, then EAGLE: the drafter catches up from cached hidden states and the
    output is still plain decoding's; the drafter's first draft equals its own full forward's."""
    answers = {c.request_id: c.token_ids for c in plain64}
    engine = Engine(model64, max_batch_size=4, max_context=C.MAX_CONTEXT)
    batch = C.prefilled(engine, [Sequence(r, limit=r.params.max_new_tokens) for r in C.requests()])
    for _ in range(3):
        engine.stepper.step(batch)
    drafter = H.random_eagle(model64)
    eagle = EagleChainDrafter(drafter, model64.get_input_embeddings(), k=2, max_batch_size=4, max_context=C.MAX_CONTEXT)
    draft = eagle.propose(batch)
    _assert_first_drafts_follow_full_forward(model64, drafter, batch, draft)
    stepper = SpeculativeStepper(engine.runner, eagle)
    while batch.num_rows:
        stepper.step(batch)
        batch.drop_finished()
    for plain, seq in zip(plain64, batch.all_sequences):
        assert seq.tokens == answers[plain.request_id]


def test_eagle_catch_up_of_rows_far_apart_stays_inside_the_drafter_cache(model64):
    """Row 0 near the context limit with one position to catch up, row 1 with many: the catch-up pads
    row 0 to row 1's width without writing past the cache, and both rows' drafts equal the drafter's
    own full forward."""
    context = 24
    requests = [
        Request("long", list(range(3, 24)), SamplingParams(temperature=0.0, max_new_tokens=8)),
        Request("short", [5, 6, 7, 5, 6, 7, 5, 6, 7, 5], SamplingParams(temperature=0.0, max_new_tokens=8)),
    ]
    engine = Engine(model64, max_batch_size=2, max_context=context)
    batch = C.prefilled(
        engine, [Sequence(r, limit=min(r.params.max_new_tokens, context - len(r.prompt_ids))) for r in requests]
    )
    drafter = H.random_eagle(model64)
    eagle = EagleChainDrafter(drafter, model64.get_input_embeddings(), k=2, max_batch_size=2, max_context=context)
    eagle.propose(batch)  # caught up: seen = (21, 10)
    for _ in range(2):
        engine.stepper.step(batch)
    eagle.state.cache.lengths[1] = 0  # row 1 is behind by its whole context (12), row 0 by 2
    draft = eagle.propose(batch)
    _assert_first_drafts_follow_full_forward(model64, drafter, batch, draft)


@torch.no_grad()
@pytest.mark.parametrize("target", ["model64", "qwen3_64"])
def test_eagle_drafts_follow_the_drafters_own_full_forward(target: str, request):
    """The cached drafter (catch-up, scratch slots, tree masks, depth positions) drafts what the
    drafter itself predicts along each drafted path: chain = argmax, tree children in the top-k;
    for a Qwen2 target and for a Qwen3 one (whose drafter layer has head_dim != hidden / heads)."""
    model64 = request.getfixturevalue(target)
    engine = Engine(model64, max_batch_size=4, max_context=C.MAX_CONTEXT)
    batch = C.prefilled(engine, [Sequence(r, limit=r.params.max_new_tokens) for r in C.requests()])
    engine.stepper.step(batch)
    drafter = H.random_eagle(model64)
    embed = model64.get_input_embeddings()
    chain = EagleChainDrafter(drafter, embed, k=3, max_batch_size=4, max_context=C.MAX_CONTEXT).propose(batch)
    # budget 10 keeps every candidate: 2 children of the root, then 2 of each of the 2 best per level
    tree = EagleTreeDrafter(drafter, embed, topk=2, depth=3, budget=10, max_batch_size=4, max_context=C.MAX_CONTEXT)
    tree = tree.propose(batch).tree
    for b, seq in enumerate(batch.sequences):
        ids = torch.tensor([seq.request.prompt_ids + seq.tokens])
        drafts = chain.tree.tokens[b, 1:].tolist()
        for i, token in enumerate(drafts):
            assert token == int(H.drafter_logits_along(model64, drafter, ids, drafts[:i]).argmax())
        assert tree.depth[b].tolist() == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
        for j in range(1, tree.num_nodes):
            path, node = [], int(tree.parents[b, j])
            while node > 0:
                path.insert(0, int(tree.tokens[b, node]))
                node = int(tree.parents[b, node])
            top = H.drafter_logits_along(model64, drafter, ids, path).topk(2).indices.tolist()
            assert int(tree.tokens[b, j]) in top, f"row {b} node {j}: not a top-2 child of its parent path"


# ----- history drafts in a GRPO-shaped rollout: a prompt's responses draft its next ones -----
