"""EAGLE chains in a sampling batch draft the drafter's coupled guess of the target's sample.

The target's token at a sampled position is the inverse-CDF draw of its processed distribution with
that position's uniform (the coupled rule). The chain drafts, per position, the drafter's own draw with
the same uniform (`coupled_guess`): when the drafter's distribution equals the target's the guess is the
target's token for every uniform. What is emitted never depends on the guess (token-for-token equality
with plain sampling, every drafter: `test_sd_engine.py`); these tests pin what is drafted.
"""

from __future__ import annotations

import _engine_cases as C
import _sd_helpers as H
import pytest
import torch
from transformers import PreTrainedModel

from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout.batch import RunningBatch
from tlt.rollout.drafting import EagleChainDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.guess import coupled_guess
from tlt.rollout.sampling import process_logits, sample_from
from tlt.rollout.sequence import Sequence
from tlt.rollout.types import Request, SamplingParams

CONTEXT = 64
PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [9, 10], [11, 12, 13, 14, 11, 12, 13, 14, 11]]
TEMPERATURES = (0.8, 1.0, 0.0)  # the last row is greedy inside a sampling batch


@pytest.fixture(scope="module")
def model64() -> PreTrainedModel:
    return tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)


def _eagle(model: PreTrainedModel) -> EagleDrafter:
    torch.manual_seed(3)
    drafter = EagleDrafter(drafter_config_from_target(model.config)).to(model.dtype)
    drafter.bind_policy(model)
    return drafter


def _sampling_batch(model: PreTrainedModel) -> tuple[Engine, RunningBatch]:
    """Three rows (T = 0.8, 1.0 and a greedy one), prefilled and advanced by one plain step."""
    requests = [
        Request(f"r{i}", p, SamplingParams(temperature=t, max_new_tokens=12, seed=i))
        for i, (p, t) in enumerate(zip(PROMPTS, TEMPERATURES))
    ]
    engine = Engine(model, max_batch_size=4, max_context=CONTEXT)
    batch = C.prefilled(engine, [Sequence(r, limit=r.params.max_new_tokens) for r in requests])
    engine.stepper.step(batch)
    return engine, batch


def test_coupled_guess_is_the_targets_token_when_the_drafter_equals_the_target():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g) * 3  # [B, V]
    u = torch.rand(64, generator=g, dtype=torch.float64)
    temperature = torch.rand(64, generator=g, dtype=torch.float64) * 1.5
    temperature[::7] = 0.0  # greedy rows
    target = sample_from(process_logits(logits, temperature), u)
    assert torch.equal(coupled_guess(logits, u, temperature), target)


def test_coupled_guess_of_an_underconfident_drafter_can_differ_from_its_argmax():
    """Not the argmax in disguise: with u past the top token's mass the guess is the next token."""
    logits = torch.log(torch.tensor([[0.6, 0.4]]))
    one = torch.ones(1, dtype=torch.float64)
    assert int(coupled_guess(logits, torch.tensor([0.7], dtype=torch.float64), one)) == 1
    assert int(coupled_guess(logits, torch.tensor([0.3], dtype=torch.float64), one)) == 0


@torch.no_grad()
@pytest.mark.parametrize("guess", ["coupled", "argmax"])
def test_chain_drafts_are_the_drafters_own_guesses_along_the_path(guess: str, model64):
    """Draft i + 1 of a sampled row is the drafter's draw (own full forward along the drafted path, the
    row's temperature) with the uniform the target draws the token at offset i with; greedy rows and
    guess="argmax" draft the argmax."""
    _, batch = _sampling_batch(model64)
    drafter = _eagle(model64)
    chain = EagleChainDrafter(
        drafter, model64.get_input_embeddings(), k=3, max_batch_size=4, max_context=CONTEXT, guess=guess
    ).propose(batch)
    u = batch.uniforms_at(torch.arange(3)[None, :].expand(len(batch.sequences), 3).contiguous())
    differs = 0
    for b, seq in enumerate(batch.sequences):
        ids = torch.tensor([seq.request.prompt_ids + seq.tokens])
        drafts = chain.tree.tokens[b, 1:].tolist()
        t = batch.temperature[b : b + 1]
        for i, token in enumerate(drafts):
            logits = H.drafter_logits_along(model64, drafter, ids, drafts[:i])
            best = int(logits.argmax())
            want = (
                best
                if guess == "argmax" or float(t) == 0
                else int(sample_from(process_logits(logits[None], t), u[b, i : i + 1])[0])
            )
            assert token == want, f"row {b} draft {i + 1}"
            differs += token != best
    if guess == "coupled":
        assert differs > 0, "every coupled guess was the argmax: the test does not tell the two apart"


@pytest.mark.slow
@torch.no_grad()
def test_compiled_coupled_chain_drafts_equal_eager(model64):
    _, batch = _sampling_batch(model64)
    drafter = _eagle(model64)
    embed = model64.get_input_embeddings()
    eager = EagleChainDrafter(drafter, embed, k=3, max_batch_size=4, max_context=CONTEXT).propose(batch)
    compiled = EagleChainDrafter(drafter, embed, k=3, max_batch_size=4, max_context=CONTEXT, compile=True)
    assert torch.equal(compiled.propose(batch).tree.tokens, eager.tree.tokens)
