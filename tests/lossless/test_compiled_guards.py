"""Compiled steps skip dynamo's full guard check only for input classes they have already served, and
compute exactly what a fully guarded call computes.

`CompiledStep` runs the first call of each `shape_class` with every guard and later calls of that class
under dynamo's `skip_guard_eval_unsafe` stance (tensor guards and guards that ever failed still run).
These tests drive one step through calls that differ in batch (1 / more), width, span (including a span
equal to the cache's whole capacity, a relation dynamo guards), model (same shapes, other weights),
dtype and grad mode, interleaved, and compare every output bit for bit with a step that guards every call.
"""

from __future__ import annotations

import torch

from tlt.models.tiny import tiny_model
from tlt.rollout.compiled import CompiledStep, shape_class
from tlt.rollout.kv_cache import KVCache
from tlt.rollout.runner import causal_mask, decoder_forward

CAPACITY = 12


def _call_inputs(model, rows: int, width: int, context: int, seed: int):
    """token ids, slots [rows, width] after `context` cached slots; mask [rows, width, context + width]."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, model.config.vocab_size, (rows, width), generator=g)
    lengths = torch.full((rows,), context, dtype=torch.long)
    slots = lengths[:, None] + torch.arange(width)[None, :]
    return tokens, slots, causal_mask(lengths, width, context + width)


def _cache(model, rows: int = 4) -> KVCache:
    """A static cache of random k/v [rows, Hkv, CAPACITY, D] per layer."""
    c = model.config
    cache = KVCache(
        num_layers=c.num_hidden_layers,
        num_kv_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads,
        max_batch_size=rows,
        capacity=CAPACITY,
        max_capacity=CAPACITY,
        dtype=model.dtype,
        static=True,
    )
    g = torch.Generator().manual_seed(0)
    for t in (*cache.k, *cache.v):
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float64))
    return cache


def test_shape_class_tells_apart_what_dynamo_guards():
    model = tiny_model("qwen2", vocab_size=32, num_layers=1)
    other = tiny_model("qwen2", vocab_size=32, num_layers=1, seed=9)
    k = torch.zeros(4, 2, CAPACITY, 8)

    def key(m, rows, width, span, dtype=torch.float32):
        tokens = torch.zeros(rows, width, dtype=torch.long)
        mask = torch.zeros(rows, width, span, dtype=torch.bool)
        return shape_class(m, 1, (tokens, tokens.clone(), tokens.clone(), mask, k.to(dtype), k.to(dtype)))

    base = key(model, 3, 5, 7)
    assert base == key(model, 5, 3, 9), "other sizes, same pattern: one class"
    assert base != key(model, 1, 5, 7)  # batch 1 is specialised
    assert base != key(model, 3, 1, 7)  # width 1 is specialised
    assert base != key(model, 3, 5, CAPACITY), "a span equal to the capacity is its own class"
    assert base != key(model, 4, 5, 7), "a batch equal to the cache's rows is its own class"
    assert base != key(other, 3, 5, 7)
    assert base != key(model, 3, 5, 7, torch.float64)
    with torch.no_grad():
        assert base != key(model, 3, 5, 7)  # grad mode


def test_skipping_guards_computes_what_full_guards_compute():
    models = [tiny_model("qwen2", dtype=torch.float32, vocab_size=32, num_layers=2, seed=s) for s in (1, 2)]
    models.append(tiny_model("qwen2", dtype=torch.float64, vocab_size=32, num_layers=2, seed=3))
    caches = {id(m): _cache(m) for m in models}
    fast = CompiledStep(decoder_forward, name="skip guards")
    full = CompiledStep(decoder_forward, name="full guards", skip_guards=False)
    # (model, rows, width, context): every class twice or more, interleaved; spans 2..CAPACITY
    plan = [
        (m, rows, width, context) for context in (1, 5, 9) for rows in (1, 2, 3) for width in (1, 3) for m in models
    ]
    plan += [(models[0], 2, 3, CAPACITY - 3), (models[1], 1, 1, CAPACITY - 1), (models[0], 2, 3, CAPACITY - 3)]
    classes = set()
    with torch.no_grad():
        for i, (m, rows, width, context) in enumerate(plan):
            cache = caches[id(m)]
            tokens, slots, mask = _call_inputs(m, rows, width, context, seed=i)
            # the two steps write the same k/v at the same slots: the second call's writes repeat the first's
            want = full(m.model, tokens, slots, slots, mask, cache.k, cache.v)
            got = fast(m.model, tokens, slots, slots, mask, cache.k, cache.v)
            assert torch.equal(got, want), f"call {i} {(rows, width, context)}: skipped guards changed the output"
            classes.add(shape_class(m.model, len(cache.k), (tokens, slots, slots, mask, cache.k[0], cache.v[0])))
    assert fast.guarded_calls == len(classes) < len(plan), "only a class's first call runs every guard"
    assert full.guarded_calls == len(plan)


def test_every_width_and_batch_shares_four_graphs(fresh_graphs):
    """The graph set stays bounded with every guard checked: widths 2..5 and batches 2..4 reuse the (B > 1 |
    B = 1) x (Q > 1 | Q = 1) graphs (a change that specialises a size, e.g. a region whose inputs lose
    their dynamic marks, compiles a graph per width and fails here)."""
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, num_layers=2, seed=7)
    cache = _cache(model)
    step = CompiledStep(decoder_forward, name="bounded", skip_guards=False)
    with torch.no_grad():
        for i, (rows, width) in enumerate([(r, w) for r in (1, 2, 3, 4) for w in (1, 2, 3, 4, 5)]):
            tokens, slots, mask = _call_inputs(model, rows, width, 4, seed=i)
            step(model.model, tokens, slots, slots, mask, cache.k, cache.v)
    assert step.compiles <= 4, f"{step.compiles} graphs for 4 shape classes"


def test_a_class_wrongly_taken_as_served_falls_back_to_full_guards(fresh_graphs):
    """If `shape_class` ever called two graphs' inputs one class, dynamo refuses to compile under the
    skip-guards stance; the step then calls again with every guard, and computes what eager computes."""
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, num_layers=2, seed=8)
    cache = _cache(model)
    step = CompiledStep(decoder_forward, name="fallback")
    with torch.no_grad():
        tokens, slots, mask = _call_inputs(model, 1, 1, 4, seed=0)
        step(model.model, tokens, slots, slots, mask, cache.k, cache.v)  # compiles the batch-1 decode graph
        tokens, slots, mask = _call_inputs(model, 3, 2, 6, seed=1)  # a class never compiled ...
        step._served.add(shape_class(model.model, len(cache.k), (tokens, slots, slots, mask, cache.k[0], cache.v[0])))
        guarded = step.guarded_calls
        got = step(model.model, tokens, slots, slots, mask, cache.k, cache.v)  # ... taken as served
        want = decoder_forward(model.model, tokens, slots, slots, mask, cache.k, cache.v)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert step.guarded_calls == guarded + 1, "the refused call ran again with every guard"
