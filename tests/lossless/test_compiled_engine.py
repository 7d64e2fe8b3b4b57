"""The compiled step computes what the eager step computes: the same tokens, log-probs and hidden states.

- Greedy decoding through compiled steps equals the eager engine token for token in float64 and
  float32, plain and speculative (n-gram chains, EAGLE chains and trees with compiled drafter steps,
  the adaptive stepper), while rows leave the batch and up to the context limit; on a Qwen2 and
  (one small config, plain and EAGLE) on a Qwen3.
- A bounded graph set: batch, width and span are symbolic, so a second generate with other batch
  sizes, prompt lengths and draft widths compiles nothing new.
- The padded mode (CUDA graphs' fixed shapes) gives the same results as the dynamic one.
- The sampled distribution through compiled steps: `test_sd_engine.py::test_engine_sampling_matches_exact_joint`.
"""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from tlt.adaptive.adaptive_stepper import build_adaptive_stepper
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout.compiled import AUTO_MIN_LAYERS, CompiledStep, bucket_size, resolve_compile
from tlt.rollout.drafting import EagleChainDrafter, NgramDrafter
from tlt.rollout.eagle_tree import EagleTreeDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.runner import causal_mask, decoder_forward
from tlt.rollout.speculative import AcceptanceStats, SpeculativeStepper
from tlt.rollout.types import Completion, Request, SamplingParams
from tlt.rollout.warmup import warm_up
from tlt.spec.run import ArmSpec, SpeculativeSpec

CONTEXT = 40
PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [9, 10], [11, 12, 13, 14, 11, 12, 13, 14, 11]]


def _requests(max_new: tuple[int, ...] = (20, 9, 14)) -> list[Request]:
    return [
        Request(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=n))
        for i, (p, n) in enumerate(zip(PROMPTS, max_new))
    ]


def _eagle(model: PreTrainedModel) -> EagleDrafter:
    torch.manual_seed(3)
    drafter = EagleDrafter(drafter_config_from_target(model.config)).to(model.dtype)
    drafter.bind_policy(model)
    return drafter


def _drafter(name: str, model: PreTrainedModel, compiled: bool):
    embed = model.get_input_embeddings()
    if name == "ngram":
        return NgramDrafter(k=4, ngram_min=1, ngram_max=3)
    if name == "eagle-chain":
        return EagleChainDrafter(_eagle(model), embed, k=4, max_batch_size=4, max_context=CONTEXT, compile=compiled)
    return EagleTreeDrafter(
        _eagle(model), embed, topk=2, depth=3, budget=5, max_batch_size=4, max_context=CONTEXT, compile=compiled
    )


def _generate(model, requests, drafter_name: str | None, compiled: bool) -> list[Completion]:
    engine = Engine(model, max_batch_size=4, max_context=CONTEXT, compile=compiled)
    if drafter_name is not None:
        engine.stepper = SpeculativeStepper(engine.runner, _drafter(drafter_name, model, compiled))
    return engine.generate(requests)


def _assert_same(got: list[Completion], want: list[Completion], atol: float) -> None:
    """Tokens equal; log-probs and hidden states to `atol`. HF's RMSNorm and RoPE compute in float32 even
    in a float64 model, and the compiled kernels order those float32 reductions differently, so a
    float64 model agrees to ~1e-7, not 1e-12."""
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids, f"{g.request_id}: compiled output diverged from eager"
        torch.testing.assert_close(g.logprobs, w.logprobs, rtol=0, atol=max(atol, 1e-6))  # stored in float32
        torch.testing.assert_close(g.hidden, w.hidden, rtol=0, atol=atol)


@pytest.fixture(scope="module", params=[torch.float64, torch.float32], ids=["fp64", "fp32"])
def model(request) -> PreTrainedModel:
    return tiny_model("qwen2", dtype=request.param, vocab_size=32, seed=11)


@pytest.mark.parametrize("drafter_name", [None, "ngram", "eagle-chain", "eagle-tree"], ids=str)
def test_compiled_greedy_equals_eager(model, drafter_name):
    atol = 1e-6 if model.dtype == torch.float64 else 1e-4
    eager = _generate(model, _requests(), drafter_name, compiled=False)
    _assert_same(_generate(model, _requests(), drafter_name, compiled=True), eager, atol)


@pytest.mark.parametrize("k", [1, 4])
def test_compiled_eagle_chain_drafts_what_eager_drafts(k: int):
    """The fused catch-up + chain graph (one drafter call per step) drafts the eager function's tokens:
    every row accepts the same number of drafts at every step (same drafts, same verdicts), float64, for
    the shortest chain and a long one (each depth is a graph of its own, compiled cold: ~20-30 s)."""
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)
    accepted = {}
    for compiled in (False, True):
        engine = Engine(model, max_batch_size=4, max_context=CONTEXT, compile=compiled)
        chain = EagleChainDrafter(
            _eagle(model), model.get_input_embeddings(), k=k, max_batch_size=4, max_context=CONTEXT, compile=compiled
        )
        engine.stepper = SpeculativeStepper(engine.runner, chain)
        engine.generate(_requests())
        accepted[compiled] = dict(engine.stepper.stats.per_request)
        assert engine.stepper.stats.drafted > 0
    assert accepted[True] == accepted[False]


@pytest.mark.slow  # ~60-80 s on 2 CPU cores: two compiled engines on a fresh model shape
def test_compiled_greedy_equals_eager_on_qwen3():
    """Qwen3's q/k norms (before RoPE) and head_dim != hidden / heads through the compiled target (one
    token and several: plain steps, chain verification) and the drafter's fused chain: one small config.
    A tree adds no Qwen3 code, only the drafter's step at width > 1 (the Qwen2 trees above compile it)."""
    model = tiny_model("qwen3", dtype=torch.float32, vocab_size=32, seed=11, num_layers=1)
    for name in (None, "eagle-chain"):
        eager = _generate(model, _requests(), name, compiled=False)
        _assert_same(_generate(model, _requests(), name, compiled=True), eager, 1e-4)


def test_compiled_greedy_equals_eager_up_to_the_context_limit():
    """Every row runs into the context limit, token for token in float64 (the limit's bookkeeping is the
    same code in every dtype; fp32 is compared at shorter lengths above)."""
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)  # the fp64 `model`
    requests = _requests(max_new=(200, 200, 200))
    for name in (None, "eagle-chain", "eagle-tree"):
        eager = _generate(model, requests, name, compiled=False)
        assert all(c.finish_reason == "length" for c in eager)
        _assert_same(_generate(model, requests, name, compiled=True), eager, 1e-6)


def test_compiled_adaptive_stepper_equals_eager():
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)
    arms = [
        ArmSpec(kind="ngram", depth=3),
        ArmSpec(kind="chain", depth=2),
        ArmSpec(kind="tree", depth=3, topk=2, verify_tokens=5),
        ArmSpec(kind="plain"),
    ]
    spec = SpeculativeSpec(
        mode="tlt", threshold=2, buckets=[1, 2], arms=arms, epsilon=0.5, window=4, ngram_min=1, ngram_max=3
    )
    outs = []
    for compiled in (False, True):
        engine = Engine(model, max_batch_size=4, max_context=CONTEXT, compile=compiled)
        engine.stepper = build_adaptive_stepper(spec, engine.runner, _eagle(model), rows=4, context=CONTEXT, seed=0)
        outs.append(engine.generate(_requests()))
    _assert_same(outs[1], outs[0], 1e-6)


def test_steady_state_compiles_nothing_new(fresh_graphs):
    """After one generate has met every shape class, other batch sizes, prompt lengths and widths reuse them."""
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, seed=2)
    engine = Engine(model, max_batch_size=4, max_context=CONTEXT, compile=True)
    engine.stepper = SpeculativeStepper(engine.runner, _drafter("eagle-chain", model, True))
    engine.generate(_requests())
    compiled = engine.runner.compiled
    drafter_step = engine.stepper.drafter.state.compiled
    before = (compiled.compiles, drafter_step.compiles)
    assert 0 < before[0] <= 6 and before[1] <= 6, f"graphs compiled (target, drafter): {before}"
    more = [
        Request("a", [3, 4, 5, 6, 7, 8], SamplingParams(temperature=0.0, max_new_tokens=11)),
        Request("b", [1, 2, 3], SamplingParams(temperature=0.0, max_new_tokens=5)),
    ]
    engine.generate(more)
    engine.stepper = SpeculativeStepper(engine.runner, NgramDrafter(k=2, ngram_min=1, ngram_max=2))
    engine.generate(_requests(max_new=(7, 12, 3)))
    assert (compiled.compiles, drafter_step.compiles) == before


def test_padded_mode_equals_dynamic_mode():
    """CUDA graphs' mode (batch padded to a power of two, span to the full cache) computes the same."""
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=4, num_layers=1)
    padded = CompiledStep(decoder_forward, name="padded", padded=True)
    engine = Engine(model, max_batch_size=8, max_context=CONTEXT, compile=True)
    cache = engine.runner.cache
    lengths = torch.tensor([3, 7, 5])
    tokens = torch.tensor([[4, 5], [6, 7], [8, 9]])
    slots = lengths[:, None] + torch.arange(2)[None, :]
    mask = causal_mask(lengths, 2, 9)
    with torch.no_grad():
        want = decoder_forward(model.model, tokens, slots, slots, mask, cache.k, cache.v)
        got = padded(model.model, tokens, slots, slots, mask, cache.k, cache.v)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert [bucket_size(b, 8) for b in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError, match="outside"):
        bucket_size(9, 8)


def test_rollout_compile_setting():
    shallow = tiny_model("qwen2", num_layers=2)
    deep = tiny_model("qwen2", num_layers=AUTO_MIN_LAYERS, hidden_size=32, num_heads=2, intermediate_size=32)
    assert resolve_compile("off", deep) is False
    assert resolve_compile("on", shallow) is True
    assert resolve_compile("auto", shallow) is False and resolve_compile("auto", deep) is True
    with pytest.raises(ValueError, match="rollout.compile"):
        resolve_compile("sometimes", shallow)


def test_warm_up_compiles_every_shape_class_before_the_first_generate(fresh_graphs):
    """After `warm_up`, a first generate with an EAGLE chain (prefill, decode, verify, drafter
    catch-up and chain steps, at batch 1 and above; greedy, then sampling) compiles nothing."""
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, seed=5)
    engine = Engine(model, max_batch_size=4, max_context=CONTEXT, compile=True)
    drafter = _eagle(model)
    assert warm_up(engine, drafter, chain_depths=[3]) > 0
    assert warm_up(Engine(model, max_batch_size=4, max_context=CONTEXT), drafter) == 0.0  # eager: nothing to do
    compiled_before = engine.runner.compiled.compiles
    chain = EagleChainDrafter(
        drafter, model.get_input_embeddings(), k=3, max_batch_size=4, max_context=CONTEXT, compile=True
    )
    drafter_before = chain.state.compiles
    engine.stepper = SpeculativeStepper(engine.runner, chain)
    engine.generate(_requests())
    # a sampling batch drafts coupled guesses: the chain's second graph, warmed up as well
    engine.generate(
        [Request(f"s{i}", p, SamplingParams(temperature=1.0, max_new_tokens=9, seed=i)) for i, p in enumerate(PROMPTS)]
    )
    # one row alone (the long tail), then three: the drafter's graphs were met at both as well
    engine.generate([Request("one", PROMPTS[0], SamplingParams(temperature=1.0, max_new_tokens=7, seed=9))])
    engine.generate(_requests())
    assert engine.runner.compiled.compiles == compiled_before
    assert chain.state.compiles == drafter_before
    assert chain.state.compiles == 0, "the fused catch-up + chain graphs of depth 3 were warmed up"
    assert set(chain.state._chains) == {3}


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_compiled_draft_vocabulary_equals_eager_and_follows_in_place_updates(kind: str, fresh_graphs):
    """A reduced draft vocabulary through compiled drafter graphs, float64: plain decoding's tokens; the same
    drafts as eager (every row accepts as many at every step) under one subset and, after the subset changes
    in place (as a rollout worker re-picks it), under the next, which compiles nothing new."""
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)
    plain = Engine(model, max_batch_size=4, max_context=CONTEXT).generate(_requests())
    emitted = sorted({t for c in plain for t in c.token_ids})
    others = [t for t in range(32) if t not in emitted]
    assert len(emitted) <= 16 <= len(others)
    # the tokens plain decoding emits (padded with others), then 16 it never emits: no draft can be accepted
    subsets = [sorted(emitted + others[: 16 - len(emitted)]), others[-16:]]
    accepted = {}
    for compiled in (False, True):
        drafter = _eagle(model)
        vocab = drafter.set_draft_vocab(16)
        engine = Engine(model, max_batch_size=4, max_context=CONTEXT, compile=compiled)
        embed = model.get_input_embeddings()
        chosen = (
            EagleChainDrafter(drafter, embed, k=3, max_batch_size=4, max_context=CONTEXT, compile=compiled)
            if kind == "chain"
            else EagleTreeDrafter(
                drafter, embed, topk=2, depth=3, budget=5, max_batch_size=4, max_context=CONTEXT, compile=compiled
            )
        )
        engine.stepper = SpeculativeStepper(engine.runner, chosen)
        accepted[compiled] = []
        for i, ids in enumerate(subsets):
            vocab.update(torch.tensor(ids), model.get_output_embeddings())
            graphs = (engine.runner.compiled.compiles, chosen.state.compiles) if compiled else None
            engine.stepper.stats = AcceptanceStats()  # this subset's steps alone
            out = engine.generate(_requests())
            assert [c.token_ids for c in out] == [c.token_ids for c in plain]
            accepted[compiled].append({r: list(n) for r, n in engine.stepper.stats.per_request.items()})
            if compiled and i > 0:
                assert (engine.runner.compiled.compiles, chosen.state.compiles) == graphs, "a subset update recompiled"
    assert accepted[True] == accepted[False]
    assert sum(map(sum, accepted[False][0].values())) > 0  # drafts from the first subset are accepted ...
    assert sum(map(sum, accepted[True][1].values())) == 0  # ... from the second never: the update was read


def test_a_draft_vocabulary_set_after_compiling_gets_graphs_of_its_own(fresh_graphs):
    """Compiled drafter graphs of the whole vocabulary are not served to a drafter that later drafts from a
    subset (`shape_class`'s graph key; dynamo's skipped guards would not notice): with a subset of tokens plain
    decoding never emits, no draft is accepted, and the chain compiled anew for it."""
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)
    plain = Engine(model, max_batch_size=4, max_context=CONTEXT).generate(_requests())
    emitted = {t for c in plain for t in c.token_ids}
    never = [t for t in range(32) if t not in emitted][-8:]
    drafter = _eagle(model)
    engine = Engine(model, max_batch_size=4, max_context=CONTEXT, compile=True)
    chain = EagleChainDrafter(
        drafter, model.get_input_embeddings(), k=3, max_batch_size=4, max_context=CONTEXT, compile=True
    )
    engine.stepper = SpeculativeStepper(engine.runner, chain)
    engine.generate(_requests())
    before = chain.state.compiles
    drafter.set_draft_vocab(8).update(torch.tensor(never), model.get_output_embeddings())
    engine.stepper.stats = AcceptanceStats()
    out = engine.generate(_requests())
    assert [c.token_ids for c in out] == [c.token_ids for c in plain]
    assert engine.stepper.stats.drafted > 0 and engine.stepper.stats.accepted == 0
    assert chain.state.compiles > before
