"""A compiled step traces one decoder layer and stamps it out for the others, then hands the backend one
flat graph.

Why it matters: warm compile time is mostly dynamo tracing, so tracing one layer instead of every layer
is what keeps a deep policy's compile within budget (`tlt.rollout.runner.decoder_layer_region`); and the
backend must see the layers inlined, or the region's in-place cache write is functionalised in a way that
makes every size a constant (`test_every_width_and_batch_shares_four_graphs` covers that half).
"""

from __future__ import annotations

import torch

from tlt.models.tiny import tiny_model
from tlt.rollout.compiled import CompiledStep
from tlt.rollout.kv_cache import KVCache
from tlt.rollout.runner import causal_mask, decoder_forward


def _inputs(model, rows: int = 2, width: int = 3, context: int = 4):
    c = model.config
    cache = KVCache(
        num_layers=c.num_hidden_layers,
        num_kv_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads,
        max_batch_size=rows,
        capacity=12,
        max_capacity=12,
        dtype=model.dtype,
        static=True,
    )
    lengths = torch.full((rows,), context, dtype=torch.long)
    slots = lengths[:, None] + torch.arange(width)[None, :]
    tokens = torch.randint(1, c.vocab_size, (rows, width), generator=torch.Generator().manual_seed(0))
    return (model.model, tokens, slots, slots, causal_mask(lengths, width, context + width), cache.k, cache.v)


def _graph_of(fn, args, inline: bool) -> torch.fx.GraphModule:
    """The FX graph dynamo hands a backend for fn(*args), with invoke_subgraph inlining on or off."""
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list):
        graphs.append(gm)
        return gm.forward

    # a new backend object: dynamo compiles anew for it, without resetting other tests' compiled graphs
    with torch._dynamo.config.patch(inline_invoke_subgraph=inline), torch.no_grad():
        torch.compile(fn, backend=capture, fullgraph=True, dynamic=False)(*args)
    assert len(graphs) == 1
    return graphs[0]


def _subgraph_calls(gm: torch.fx.GraphModule) -> list[str]:
    """The subgraph each invoke_subgraph call of gm runs (by attribute name)."""
    return [
        n.args[0].target
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is torch.ops.higher_order.invoke_subgraph
    ]


def test_decoder_layers_are_traced_once_and_inlined_for_the_backend():
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, num_layers=3, seed=3, hidden_size=32)
    args = _inputs(model)
    regions = _subgraph_calls(_graph_of(decoder_forward, args, inline=False))
    assert len(regions) == 3, "each layer runs as a nested compile region"
    assert len(set(regions)) == 1, "the three layers share one traced subgraph"
    assert _subgraph_calls(_graph_of(decoder_forward, args, inline=True)) == [], "the backend sees a flat graph"


def test_compiled_step_inlines_layer_regions_and_matches_eager():
    """`CompiledStep` turns inlining on; its output equals the eager forward's (to the float32 rounding of
    the model's RoPE tables, which compiled and eager steps round in different places, as before the regions)."""
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, num_layers=3, seed=4, hidden_size=32)
    args = _inputs(model)
    with torch.no_grad():
        got = CompiledStep(decoder_forward, name="layers")(*args)
        want = decoder_forward(*args)
    assert torch._dynamo.config.inline_invoke_subgraph
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_a_torch_without_inlining_traces_every_layer(monkeypatch):
    """Where dynamo has no `inline_invoke_subgraph` (torch 2.11: `LAYER_REGIONS` False), no layer is a region:
    the backend gets the same flat graph by tracing each layer, and the compiled step still equals eager."""
    import tlt.rollout.runner as runner

    monkeypatch.setattr(runner, "LAYER_REGIONS", False)
    model = tiny_model("qwen2", dtype=torch.float64, vocab_size=32, num_layers=3, seed=4, hidden_size=32)
    args = _inputs(model)
    assert _subgraph_calls(_graph_of(decoder_forward, args, inline=False)) == [], "no region without inlining"
    with torch.no_grad():
        want = decoder_forward(*args)
        got = torch.compile(decoder_forward, backend="inductor", fullgraph=True, dynamic=False)(*args)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
