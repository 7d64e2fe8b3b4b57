"""Block drafts read the right inputs: each row's newest token and the target state that produced it.

Lossless whatever they draft is shown with every other drafter (test_sd_engine.py, greedy and sampled
token for token, the context limit; test_sd_engine_sampling.py, the G-test; test_adaptive_engine.py, as
bandit arms). Here: what the engine's block drafts are. An off-by-one in the anchor (f[L] or f[L-2]
instead of f[L-1]) would still be lossless but accept almost nothing, so it is tested against the
drafter run on the target's own full forward.
"""

from __future__ import annotations

import _engine_cases as C
import _sd_helpers as H
import pytest
import torch
from transformers import PreTrainedModel

from tlt.models.feature_layers import wide_features
from tlt.models.tiny import tiny_model
from tlt.rollout.batch import RunningBatch
from tlt.rollout.block import BlockChainDrafter, block_guesses, warm_up_block
from tlt.rollout.engine import Engine
from tlt.rollout.sampling import sample_from
from tlt.rollout.sequence import Sequence
from tlt.rollout.types import Request, SamplingParams

PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [9, 10], [11, 12, 13, 14, 11, 12, 13, 14, 11]]


@pytest.fixture(scope="module")
def model64() -> PreTrainedModel:
    return tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)


def _batch_after_steps(
    model: PreTrainedModel, steps: int, temperature: float = 0.0, rows: int = 3, feature_layers: tuple[int, ...] = ()
) -> RunningBatch:
    """A running batch of the first `rows` prompts, prefilled and advanced `steps` plain steps."""
    engine = Engine(model, max_batch_size=4, max_context=64, feature_layers=feature_layers)
    requests = [
        Request(f"r{i}", p, SamplingParams(temperature=temperature, max_new_tokens=20, seed=i))
        for i, p in enumerate(PROMPTS[:rows])
    ]
    batch = C.prefilled(engine, [Sequence(r, limit=20) for r in requests])
    for _ in range(steps):
        engine.stepper.step(batch)
    return batch


@torch.no_grad()
@pytest.mark.parametrize("layers", [(), (0,)], ids=["final-norm", "feature-layers"])
@pytest.mark.parametrize("steps", [0, 3])
def test_block_drafts_are_the_drafters_forward_on_the_targets_own_features(steps: int, layers, model64):
    batch = _batch_after_steps(model64, steps, feature_layers=layers)
    drafter = H.random_block(model64, feature_layers=layers)
    drafts = BlockChainDrafter(drafter, k=5).propose(batch).tree.tokens[:, 1:]  # [B, 5]
    for b, seq in enumerate(batch.sequences):
        ids = torch.tensor([seq.request.prompt_ids + seq.tokens])  # x[0 .. L], x[L] the newest (unfed) token
        features = wide_features(model64, ids[:, :-1], None, layers)[:, -1]  # f[L-1] [1, H * (1 + n)]
        want = drafter.logits(drafter(ids[:, -1], features, 5)).argmax(-1)[0]
        assert drafts[b].tolist() == want.tolist(), f"row {b}: block drafts from other inputs than x[L], f[L-1]"


@torch.no_grad()
def test_a_block_of_k_is_the_first_k_drafts_of_a_longer_block(model64):
    """Causal inside the block: one drafter serves every arm depth up to its block size."""
    batch = _batch_after_steps(model64, 2)
    drafter = H.random_block(model64)
    eight = BlockChainDrafter(drafter, k=8).propose(batch).tree.tokens[:, 1:]
    for k in (2, 5):
        assert torch.equal(BlockChainDrafter(drafter, k=k).propose(batch).tree.tokens[:, 1:], eight[:, :k])


@torch.no_grad()
def test_sampled_block_drafts_are_the_coupled_guesses_with_the_targets_uniforms(model64):
    batch = _batch_after_steps(model64, 2, temperature=0.8)
    drafter = H.random_block(model64)
    drafts = BlockChainDrafter(drafter, k=4).propose(batch).tree.tokens[:, 1:]
    tokens, features = batch.last_token, batch.hidden_buf[batch.wave_rows, batch.lengths() - 1]
    logits = drafter.logits(drafter(tokens, features, 4))  # [B, 4, V]
    u = batch.uniform_window(4)
    want = sample_from(torch.softmax(logits / 0.8, dim=-1), u)  # draft i: the uniform of generated offset i
    assert torch.equal(drafts, want)
    assert torch.equal(block_guesses(logits, None, None), logits.argmax(-1))


def test_block_depth_beyond_the_drafters_block_size_is_refused(model64):
    with pytest.raises(ValueError, match="block arm depth must be in"):
        BlockChainDrafter(H.random_block(model64), k=9)


@torch.no_grad()
def test_compiled_block_drafts_equal_eager_and_compile_nothing_after_warm_up(model64):
    """Compiled: the same drafts as eager at one row and at several, greedy and sampled; after
    `warm_up_block` (batch 1 and 2) a batch of 3 compiles no graph."""
    drafter = H.random_block(model64, list(range(0, 32, 2)))
    warm_up_block(drafter, [3])
    for rows in (1, 3):
        for temperature in (0.0, 0.8):
            batch = _batch_after_steps(model64, 2, temperature, rows)
            compiled = BlockChainDrafter(drafter, k=3, compile=True)
            got = compiled.propose(batch).tree.tokens
            assert torch.equal(got, BlockChainDrafter(drafter, k=3).propose(batch).tree.tokens), (rows, temperature)
            assert compiled.compiles == 0, f"{rows} rows at T={temperature} compiled a graph after warm-up"
