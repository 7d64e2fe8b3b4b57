"""Speculative decoding in the engine is lossless.

Greedy: token for token equal to plain decoding in float64 for n-gram chains, EAGLE chains and trees,
block drafts (k tokens from one block-drafter forward), EAGLE and block drafters with a reduced draft vocabulary,
random (mostly rejected) trees and oracle drafters that are always right (also through non-first
branches, which forces cache compaction); on a tiny Qwen2, and for the n-gram, EAGLE, oracle-tree
and mixed drafters on a tiny Qwen3 too. After such a step the next logits equal a fresh full
forward; log-probs of accepted tokens equal the plain engine's in float32. Sampled: token for token
equal to plain sampling (the same uniforms). The engine's sampled distribution: test_sd_engine_sampling.py;
EAGLE catching up mid-generation: test_eagle_catch_up.py.
"""

from __future__ import annotations

from collections.abc import Callable

import _engine_cases as C
import _sd_helpers as H
import pytest
import torch
from transformers import PreTrainedModel

from tlt.models.tiny import tiny_model
from tlt.rollout.batch import RunningBatch
from tlt.rollout.block import BlockChainDrafter
from tlt.rollout.drafting import Draft, Drafter, EagleChainDrafter, NgramDrafter
from tlt.rollout.eagle_tree import EagleTreeDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.history import HistoryDrafter, HistoryTreeDrafter
from tlt.rollout.mixed import MixedDrafter
from tlt.rollout.runner import causal_mask
from tlt.rollout.sequence import Sequence
from tlt.rollout.speculative import SpeculativeStepper
from tlt.rollout.tree import DraftTree, build_tree, chain_tree
from tlt.rollout.types import Completion, Request, SamplingParams


class OracleDrafter:
    """Replays the plain engine's greedy answers: the next k true tokens as a chain, or (tree) each true
    token as the SECOND child of the previous true node, after a wrong first sibling."""

    def __init__(self, answers: dict[str, list[int]], k: int, vocab: int, tree: bool) -> None:
        self.answers, self.k, self.vocab, self.tree = answers, k, vocab, tree

    def propose(self, batch: RunningBatch) -> Draft:
        futures = []
        for s in batch.sequences:
            done = len(s.tokens)
            futures.append(self.answers[s.request.request_id][done : done + self.k])
        n = torch.tensor([len(f) for f in futures])
        padded = torch.tensor([f + [0] * (self.k - len(f)) for f in futures])
        if not self.tree:
            return Draft(chain_tree(batch.last_token, padded, n), chain=True)
        B, N = len(futures), 1 + 2 * self.k
        tokens = torch.zeros(B, N, dtype=torch.long)
        parents = torch.full((B, N), -1, dtype=torch.long)
        depth = torch.zeros(B, N, dtype=torch.long)
        tokens[:, 0] = batch.last_token
        for i in range(self.k):
            wrong, right = 1 + 2 * i, 2 + 2 * i
            real = i < n
            parent = 0 if i == 0 else right - 2
            tokens[:, wrong] = torch.where(real, (padded[:, i] + 1) % self.vocab, 0)
            tokens[:, right] = torch.where(real, padded[:, i], 0)
            parents[:, wrong] = torch.where(real, parent, -1)
            parents[:, right] = torch.where(real, parent, -1)
            depth[:, wrong] = depth[:, right] = torch.where(real, i + 1, 0)
        valid = parents >= 0
        valid[:, 0] = True
        return Draft(DraftTree(tokens, parents, depth, valid), chain=False)


class RandomTreeDrafter:
    """Random top-k-shaped trees with random scores: nearly everything is rejected."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab, self.g = vocab, torch.Generator().manual_seed(seed)

    def propose(self, batch: RunningBatch) -> Draft:
        B = batch.num_rows
        cand = torch.randint(self.vocab, (B, 6), generator=self.g)
        parents = torch.tensor([[-1, -1, 0, 0, 1, 1]]).expand(B, 6)
        logprobs = -torch.rand(B, 6, generator=self.g)
        return Draft(build_tree(batch.last_token, cand, parents, logprobs, budget=5), chain=False)


_eagle = H.random_eagle


DrafterFactory = Callable[..., Drafter]  # (model, answers, max_context=C.MAX_CONTEXT) -> Drafter
DRAFTERS: dict[str, DrafterFactory] = {
    "ngram-chain": lambda m, a, ctx=C.MAX_CONTEXT: NgramDrafter(k=4, ngram_min=1, ngram_max=3),
    "random-tree": lambda m, a, ctx=C.MAX_CONTEXT: RandomTreeDrafter(m.config.vocab_size),
    "oracle-chain": lambda m, a, ctx=C.MAX_CONTEXT: OracleDrafter(a, k=4, vocab=m.config.vocab_size, tree=False),
    "oracle-tree-second-branch": lambda m, a, ctx=C.MAX_CONTEXT: OracleDrafter(
        a, k=3, vocab=m.config.vocab_size, tree=True
    ),
    "eagle-chain": lambda m, a, ctx=C.MAX_CONTEXT: EagleChainDrafter(
        _eagle(m), m.get_input_embeddings(), k=3, max_batch_size=4, max_context=ctx
    ),
    "eagle-chain-4": lambda m, a, ctx=C.MAX_CONTEXT: EagleChainDrafter(
        _eagle(m), m.get_input_embeddings(), k=4, max_batch_size=4, max_context=ctx
    ),
    "eagle-chain-argmax": lambda m, a, ctx=C.MAX_CONTEXT: EagleChainDrafter(
        _eagle(m), m.get_input_embeddings(), k=3, max_batch_size=4, max_context=ctx, guess="argmax"
    ),
    "eagle-tree": lambda m, a, ctx=C.MAX_CONTEXT: EagleTreeDrafter(
        _eagle(m), m.get_input_embeddings(), topk=2, depth=3, budget=5, max_batch_size=4, max_context=ctx
    ),
    # a reduced draft vocabulary: the even ids of the 32 (the target's other tokens are never drafted)
    "eagle-chain-draft-vocab": lambda m, a, ctx=C.MAX_CONTEXT: EagleChainDrafter(
        H.reduced_eagle(m, list(range(0, 32, 2))), m.get_input_embeddings(), k=3, max_batch_size=4, max_context=ctx
    ),
    "eagle-tree-draft-vocab": lambda m, a, ctx=C.MAX_CONTEXT: EagleTreeDrafter(
        H.reduced_eagle(m, list(range(0, 32, 2))),
        m.get_input_embeddings(),
        topk=2,
        depth=3,
        budget=5,
        max_batch_size=4,
        max_context=ctx,
    ),
    "block-2": lambda m, a, ctx=C.MAX_CONTEXT: BlockChainDrafter(H.random_block(m), k=2),
    "block-8": lambda m, a, ctx=C.MAX_CONTEXT: BlockChainDrafter(H.random_block(m), k=8),
    "block-argmax": lambda m, a, ctx=C.MAX_CONTEXT: BlockChainDrafter(H.random_block(m), k=4, guess="argmax"),
    "block-draft-vocab": lambda m, a, ctx=C.MAX_CONTEXT: BlockChainDrafter(
        H.random_block(m, list(range(0, 32, 2))), k=4
    ),
    # reads target layer 0's output beside the final-norm state: the engine keeps wide features
    "block-feature-layers": lambda m, a, ctx=C.MAX_CONTEXT: BlockChainDrafter(
        H.random_block(m, feature_layers=(0,)), k=4
    ),
    "history-chain": lambda m, a, ctx=C.MAX_CONTEXT: HistoryDrafter(_store(), k=4),
    "history-tree": lambda m, a, ctx=C.MAX_CONTEXT: HistoryTreeDrafter(_store(), topk=2, depth=3, budget=5),
    "mixed": lambda m, a, ctx=C.MAX_CONTEXT: MixedDrafter(
        _store(), EagleChainDrafter(_eagle(m), m.get_input_embeddings(), k=3, max_batch_size=4, max_context=ctx), k=3
    ),
}


_store = H.history_store


def _assert_greedy_speculative_equals_plain(name: str, model: PreTrainedModel, plain: list[Completion]) -> None:
    answers = {c.request_id: c.token_ids for c in plain}
    out, stepper = C.generate(model, C.requests(), DRAFTERS[name](model, answers))
    for want, spec in zip(plain, out):
        assert spec.token_ids == want.token_ids, f"{name}: {spec.request_id} diverged from plain decoding"
        torch.testing.assert_close(spec.logprobs, want.logprobs, rtol=0, atol=1e-9)
        torch.testing.assert_close(spec.hidden[:, : want.hidden.shape[1]], want.hidden, rtol=0, atol=1e-9)
    if name.startswith("oracle"):
        assert stepper.stats.accept_length > 2.0, f"{name}: an always-right drafter must be accepted"


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_speculative_equals_plain_decoding_float64(name: str, model64, plain64):
    _assert_greedy_speculative_equals_plain(name, model64, plain64)


@pytest.mark.parametrize(
    "name",
    [
        "ngram-chain",
        "eagle-chain",
        "eagle-tree",
        "oracle-tree-second-branch",
        "mixed",
        "block-8",
        "block-feature-layers",
    ],
)
def test_greedy_speculative_equals_plain_decoding_on_qwen3(name: str, qwen3_64):
    _assert_greedy_speculative_equals_plain(name, qwen3_64, C.generate(qwen3_64, C.requests(), None)[0])


@pytest.mark.parametrize(
    "name", ["oracle-tree-second-branch", "eagle-chain", "ngram-chain", "history-tree", "mixed", "block-8"]
)
def test_greedy_rows_in_a_sampling_batch_still_equal_plain_decoding(name: str, model64, plain64):
    answers = {c.request_id: c.token_ids for c in plain64}
    requests = C.requests()
    sampled = Request("hot", [3, 4, 3, 4], SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, seed=1))
    out, _ = C.generate(model64, [*requests, sampled], DRAFTERS[name](model64, {**answers, "hot": [0] * 12}))
    for plain, spec in zip(plain64, out):
        assert spec.token_ids == plain.token_ids, f"{name}: greedy row {spec.request_id} diverged in a mixed batch"
        torch.testing.assert_close(spec.logprobs, plain.logprobs, rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_near_the_context_limit_falls_back_to_plain_steps(name: str, model64):
    requests = C.requests(max_new=(200, 200, 200))
    engine = Engine(model64, max_batch_size=4, max_context=24)
    plain = engine.generate(requests)
    answers = {c.request_id: c.token_ids for c in plain}
    drafter = DRAFTERS[name](model64, answers, 24)
    spec_engine = Engine(model64, max_batch_size=4, max_context=24, feature_layers=C.feature_layers(drafter))
    stepper = SpeculativeStepper(spec_engine.runner, drafter)
    spec_engine.stepper = stepper
    out = spec_engine.generate(requests)
    assert [c.token_ids for c in out] == [c.token_ids for c in plain]
    assert all(c.finish_reason == "length" for c in out)
    assert stepper.stats.plain_fallbacks > 0


def test_next_logits_after_non_first_branch_equal_full_forward(model64, plain64):
    answers = {c.request_id: c.token_ids for c in plain64}
    engine = Engine(model64, max_batch_size=4, max_context=C.MAX_CONTEXT)
    requests = C.requests()
    batch = C.prefilled(engine, [Sequence(r, limit=r.params.max_new_tokens) for r in requests])
    stepper = SpeculativeStepper(engine.runner, OracleDrafter(answers, 3, 32, tree=True))
    stepper.step(batch)
    assert stepper.stats.last_step_accepted == [3, 3, 3]  # every accepted node was a second sibling
    lengths = batch.lengths()
    slots = lengths[:, None]
    hidden = engine.runner.forward(
        batch.last_token[:, None], slots, slots, causal_mask(lengths, 1, int(lengths.max()) + 1)
    )
    cached = engine.runner.logits(hidden[:, 0])
    for b, seq in enumerate(batch.sequences):
        ids = torch.tensor([seq.request.prompt_ids + seq.tokens])
        full = model64(input_ids=ids).logits[0, -1]
        torch.testing.assert_close(cached[b], full, rtol=0, atol=1e-9)


def test_accepted_logprobs_equal_plain_engine_float32():
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, seed=11)
    plain, _ = C.generate(model, C.requests(), None)
    answers = {c.request_id: c.token_ids for c in plain}
    spec, stepper = C.generate(model, C.requests(), OracleDrafter(answers, 3, 32, tree=True))
    assert stepper.stats.accepted > 0
    # every row-step counted once by the response position it started at, the first at position 1
    # (prefill made token 0)
    by_position = stepper.stats.by_position
    assert sum(n for n, _ in by_position.values()) == stepper.stats.row_steps
    assert sum(a for _, a in by_position.values()) == stepper.stats.accepted and 0 in by_position
    for a, b in zip(plain, spec):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(b.logprobs, a.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["history-chain", "history-tree", "mixed"])
def test_history_drafts_from_earlier_responses_are_accepted_and_exact(name: str, model64):
    """Greedy group of one prompt, twice through one store: the second rollout's rows find the first's
    whole responses; outputs stay token-for-token equal to plain decoding, and most drafts are accepted."""
    group = [Request(f"g{i}", C.PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=30)) for i in range(3)]
    plain = C.generate(model64, group, None)[0]
    store = _store()
    drafter = DRAFTERS[name](model64, {})
    drafter.store = store
    engine = Engine(model64, max_batch_size=2, max_context=C.MAX_CONTEXT)  # waves of 2, then 1
    engine.wave_observers.append(store.observe)
    engine.stepper = SpeculativeStepper(engine.runner, drafter)
    first = engine.generate(group)
    engine.stepper = stepper = SpeculativeStepper(engine.runner, drafter)
    second = engine.generate(group)
    for p, a, b in zip(plain, first, second):
        assert a.token_ids == p.token_ids and b.token_ids == p.token_ids
        torch.testing.assert_close(b.logprobs, p.logprobs, rtol=0, atol=1e-9)
    assert stepper.stats.accept_length > 3.0, f"{name}: history of identical responses must be accepted"


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.9)])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_sampled_speculative_equals_plain_sampling_token_for_token(
    name: str, temperature: float, top_p: float, model64
):
    """The coupled rule: each node's token is drawn with its generated position's uniform, so every drafter
    reproduces plain sampling exactly (same seeds, float64), whatever it drafts and accepts."""
    requests = [
        Request(f"s{i}", p, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=n, seed=i))
        for i, (p, n) in enumerate(zip(C.PROMPTS, (20, 9, 14)))
    ]
    plain = C.generate(model64, requests, None)[0]
    answers = {c.request_id: c.token_ids for c in plain}
    out, stepper = C.generate(model64, requests, DRAFTERS[name](model64, answers))
    for p, s in zip(plain, out):
        assert s.token_ids == p.token_ids, f"{name}: {s.request_id} differs from plain sampling"
        torch.testing.assert_close(s.logprobs, p.logprobs, rtol=0, atol=1e-9)
    if name.startswith("oracle"):
        assert stepper.stats.accept_length > 2.0, f"{name}: drafts of the plain samples must be accepted"
