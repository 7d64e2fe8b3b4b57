"""Runner promises: its logits equal the HF model's full forward (float64), for chunked prefill, for a
draft tree (positions by depth, ancestor mask) against the equivalent chains, and after compaction."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tlt.models.tiny import tiny_model
from tlt.rollout.runner import ModelRunner, causal_mask, check_supported, prefix_mask, run_layers

FAMILIES = ["qwen2", "qwen3", "llama"]


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def runner_for(model, rows=2):
    return ModelRunner(model, max_batch_size=rows, max_context=64, capacity=4)


def feed(runner, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Feed ids [B, Q] as a chain right after `start` [B] committed slots; return logits [B, Q, V]."""
    q = ids.shape[1]
    pos = start[:, None] + torch.arange(q)[None, :]
    hidden = runner.forward(ids, pos, pos, causal_mask(start, q, int(start.max()) + q))
    return runner.logits(hidden)


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_and_decode_logits_equal_hf_full_forward(family):
    model = tiny_model(family, dtype=torch.float64, tie_word_embeddings=family == "llama")
    runner = runner_for(model)
    ids = torch.randint(0, 64, (2, 11))
    runner.cache.start(2)
    first = feed(runner, ids[:, :6], torch.tensor([0, 0]))
    runner.cache.advance([6, 6])
    rest = torch.cat([feed(runner, ids[:, 6 + i : 7 + i], torch.tensor([6 + i] * 2)) for i in range(5)], dim=1)
    got = torch.cat([first, rest], dim=1)
    for b in range(2):
        torch.testing.assert_close(got[b], hf_logits(model, ids[b].tolist()), atol=1e-9, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_forward_equals_chains_and_compaction_keeps_cache_exact(family):
    model = tiny_model(family, dtype=torch.float64)
    runner = runner_for(model, rows=1)
    prefix = [5, 9, 17, 3]
    runner.cache.start(1)
    feed(runner, torch.tensor([prefix]), torch.tensor([0]))
    runner.cache.advance([len(prefix)])
    # tree nodes: 0 = root r, 1 = a (child of r), 2 = b (child of r), 3 = c (child of a)
    tokens = torch.tensor([[11, 22, 33, 44]])
    depth = torch.tensor([[0, 1, 1, 2]])
    ancestors = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool
    )  # [Q, Q] ancestor-or-self
    p = len(prefix)
    start = torch.tensor([p])
    slots = p + torch.arange(4)[None, :]
    hidden = runner.forward(tokens, p + depth, slots, prefix_mask(start, ancestors, p + 4))
    tree_logits = runner.logits(hidden)[0]
    for node, path in {0: [11], 1: [11, 22], 2: [11, 33], 3: [11, 22, 44]}.items():
        torch.testing.assert_close(tree_logits[node], hf_logits(model, prefix + path)[-1], atol=1e-9, rtol=0)
    # accept r -> a -> c: move c from slot p + 3 to p + 2, then decode right after the path
    runner.compact(torch.tensor([0]), torch.tensor([[p + 3]]), torch.tensor([[p + 2]]))
    runner.cache.advance([3])
    nxt = feed(runner, torch.tensor([[7]]), torch.tensor([p + 3]))[0, 0]
    torch.testing.assert_close(nxt, hf_logits(model, prefix + [11, 22, 44, 7])[-1], atol=1e-9, rtol=0)


def test_drafter_shaped_layer_with_identity_input_norm_runs_through_run_layers():
    model = tiny_model("llama", dtype=torch.float64, num_layers=1)
    layer = model.model.layers[0]
    layer.input_layernorm = nn.Identity()
    runner = runner_for(model, rows=1)
    runner.cache.start(1)
    x = torch.randn(1, 3, 64, dtype=torch.float64)
    pos = torch.arange(3)[None, :]
    rope = model.model.rotary_emb(x, pos)
    with torch.no_grad():
        got = model.model.norm(
            run_layers([layer], x, rope, runner.cache.k, runner.cache.v, pos, causal_mask(torch.tensor([0]), 3, 3))
        )
        expected = model.model(inputs_embeds=x, output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)


def test_unsupported_model_is_refused_with_the_field_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=16))
    with pytest.raises(ValueError, match="model_type"):
        check_supported(gpt2)
