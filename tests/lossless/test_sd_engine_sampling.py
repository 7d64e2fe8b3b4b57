"""Sampling with speculative decoding in the engine keeps the target's distribution: the joint of the
first three tokens of a tiny real model (vocabulary 8, peaked head) sampled through every drafter
(block drafts too), eager and compiled, matches the exact joint (G-test, alpha 1e-3)."""

from __future__ import annotations

from collections.abc import Callable

import _sd_helpers as H
import pytest
import torch
from transformers import PreTrainedModel

from tlt.models.tiny import tiny_model
from tlt.rollout.block import BlockChainDrafter
from tlt.rollout.drafting import Drafter, EagleChainDrafter, NgramDrafter
from tlt.rollout.eagle_tree import EagleTreeDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.history import HistoryDrafter, HistoryTreeDrafter
from tlt.rollout.mixed import MixedDrafter
from tlt.rollout.sampling import process_logits
from tlt.rollout.speculative import SpeculativeStepper
from tlt.rollout.types import Request, SamplingParams

_eagle = H.random_eagle
_store = H.history_store

ENGINE_VOCAB = 8
ENGINE_PROMPT = [1, 3, 5, 3, 5]
ENGINE_SAMPLES = 3000


def _peaked_model() -> PreTrainedModel:
    model = tiny_model("llama", dtype=torch.float64, vocab_size=ENGINE_VOCAB, seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)  # random init is near-uniform: make the test meaningful
    return model


@torch.no_grad()
def _exact_joint(model: PreTrainedModel, temperature: float, top_p: float) -> torch.Tensor:
    V = ENGINE_VOCAB
    t1, t2 = torch.meshgrid(torch.arange(V), torch.arange(V), indexing="ij")
    ids = torch.cat([torch.tensor(ENGINE_PROMPT).expand(V * V, -1), t1.reshape(-1, 1), t2.reshape(-1, 1)], 1)
    logits = model(input_ids=ids).logits[:, -3:]  # [V*V, 3, V]
    probs = process_logits(logits, torch.full((V * V,), temperature, dtype=torch.float64), torch.full((V * V,), top_p))
    p1 = probs[0, 0]
    p2 = probs[:, 1].reshape(V, V, V)[:, 0]  # [t1, t2]
    p3 = probs[:, 2].reshape(V, V, V)  # [t1, t2, t3]
    return p1[:, None, None] * p2[:, :, None] * p3


ENGINE_SAMPLERS: dict[str, Callable[[PreTrainedModel, bool], Drafter]] = {
    # reads a chosen target layer's output beside the final-norm state (wide features)
    "block-coupled-feature-layers": lambda m, c: BlockChainDrafter(
        H.random_block(m, feature_layers=(0,)), k=2, compile=c
    ),
    "block-argmax-draft-vocab": lambda m, c: BlockChainDrafter(
        H.random_block(m, [0, 2, 3, 5, 7]), k=3, guess="argmax", compile=c
    ),
    "eagle-chain-sampled": lambda m, c: EagleChainDrafter(
        _eagle(m), m.get_input_embeddings(), k=2, max_batch_size=500, max_context=16, compile=c
    ),
    "eagle-tree-deterministic": lambda m, c: EagleTreeDrafter(
        _eagle(m), m.get_input_embeddings(), topk=2, depth=2, budget=4, max_batch_size=500, max_context=16, compile=c
    ),
    # a reduced draft vocabulary of 5 of the 8 tokens: drafts never hold the other 3
    "eagle-chain-draft-vocab": lambda m, c: EagleChainDrafter(
        H.reduced_eagle(m, [0, 2, 3, 5, 6]),
        m.get_input_embeddings(),
        k=2,
        max_batch_size=500,
        max_context=16,
        compile=c,
    ),
    "ngram-deterministic": lambda m, c: NgramDrafter(k=3, ngram_min=1, ngram_max=2),
    # 3000 samples of one prompt in waves of 500: later waves draft from the earlier waves' responses
    "history-chain-deterministic": lambda m, c: HistoryDrafter(_store(), k=2),
    "history-tree-deterministic": lambda m, c: HistoryTreeDrafter(_store(), topk=2, depth=2, budget=4),
    "mixed-eagle-and-history": lambda m, c: MixedDrafter(
        _store(),
        EagleChainDrafter(_eagle(m), m.get_input_embeddings(), k=2, max_batch_size=500, max_context=16, compile=c),
        k=2,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
@pytest.mark.parametrize("name", list(ENGINE_SAMPLERS))
def test_engine_sampling_matches_exact_joint(name: str, temperature: float, top_p: float, compiled: bool):
    model = _peaked_model()
    drafter = ENGINE_SAMPLERS[name](model, compiled)
    layers = getattr(getattr(drafter, "drafter", None), "feature_layers", ())
    engine = Engine(model, max_batch_size=500, max_context=16, compile=compiled, feature_layers=layers)
    engine.stepper = SpeculativeStepper(engine.runner, drafter)
    params = [
        SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=3, seed=s) for s in range(ENGINE_SAMPLES)
    ]
    out = engine.generate([Request(f"r{i}", ENGINE_PROMPT, p) for i, p in enumerate(params)])
    samples = torch.tensor([c.token_ids for c in out])
    if "history" in name:
        assert engine.stepper.stats.accepted > 0, f"{name}: the history drafts were never accepted: not tested"
    p = H.g_test_pvalue(samples, _exact_joint(model, temperature, top_p))
    assert p > 1e-3, f"{name}: engine samples differ from the model (p={p:.3g})"
