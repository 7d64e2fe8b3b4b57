"""Wide target features: the engine keeps chosen layers' outputs beside the final-norm state, and a block
drafter reads them. The engine's features are the target's own (Hugging Face's forward), eager and compiled;
the final-norm part, the tokens and the log-probs are those of an engine that keeps no layers."""

from __future__ import annotations

import pytest
import torch

from tlt.drafter.block_objective import block_batch, block_loss
from tlt.drafter.objective import drafter_inputs
from tlt.models.block_drafter import load_block_drafter, new_block_drafter
from tlt.models.drafter import save_drafter
from tlt.models.feature_layers import check_feature_layers, feature_width, wide_features
from tlt.models.tiny import tiny_model
from tlt.rollout.block import BlockChainDrafter
from tlt.rollout.decode_step import prefill
from tlt.rollout.engine import Engine
from tlt.rollout.sequence import Sequence
from tlt.rollout.types import Request, SamplingParams
from tlt.spec.plan import spread_layers

PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [9, 10], [11, 12, 13, 14, 11]]


def _requests(temperature: float = 0.0) -> list[Request]:
    return [
        Request(f"r{i}", p, SamplingParams(temperature=temperature, max_new_tokens=12, seed=i))
        for i, p in enumerate(PROMPTS)
    ]


@pytest.fixture(scope="module")
def model4():
    return tiny_model("qwen2", dtype=torch.float64, vocab_size=32, num_layers=4, seed=3)


def test_layer_choices_are_checked_and_spread():
    assert check_feature_layers([2, 0], 4, "f") == (0, 2)
    for bad in ([0, 0], [3], [-1], [7]):
        with pytest.raises(ValueError, match=r"^f: .* must be distinct decoder layer indices in \[0, 2\]"):
            check_feature_layers(bad, 4, "f")
    assert spread_layers(16) == (1, 7, 13)
    assert spread_layers(28) == (1, 13, 25)
    assert spread_layers(4) == (1,)
    assert spread_layers(2) == (0,)
    assert spread_layers(1) == ()
    assert feature_width(64, (1, 7, 13)) == 256


@torch.no_grad()
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_engines_wide_features_are_the_targets_own(model4, temperature):
    plain = Engine(model4, max_batch_size=4, max_context=64).generate(_requests(temperature))
    wide = Engine(model4, max_batch_size=4, max_context=64, feature_layers=(0, 2)).generate(_requests(temperature))
    for p, w in zip(plain, wide):
        assert w.token_ids == p.token_ids
        torch.testing.assert_close(w.logprobs, p.logprobs, rtol=0, atol=0)
        assert w.hidden.shape == (p.hidden.shape[0], 3 * 64)
        torch.testing.assert_close(w.hidden[:, :64], p.hidden, rtol=0, atol=0)
        ids = torch.tensor([w.prompt_ids + w.token_ids])[:, :-1]
        torch.testing.assert_close(w.hidden, wide_features(model4, ids, None, (0, 2))[0], rtol=0, atol=1e-9)


@torch.no_grad()
def test_compiled_wide_features_equal_eager():
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, num_layers=4, seed=3)
    eager = Engine(model, max_batch_size=4, max_context=64, feature_layers=(1,)).generate(_requests())
    compiled = Engine(model, max_batch_size=4, max_context=64, feature_layers=(1,), compile=True)
    for e, c in zip(eager, compiled.generate(_requests())):
        assert c.token_ids == e.token_ids
        torch.testing.assert_close(c.hidden, e.hidden, rtol=1e-4, atol=1e-4)


def test_a_block_drafter_with_feature_layers_saves_loads_and_trains(model4, tmp_path):
    torch.manual_seed(0)
    drafter = new_block_drafter(model4, block_size=4, feature_layers=(2, 0))
    assert drafter.feature_layers == (0, 2) and drafter.feature_size == 192
    save_drafter(drafter, tmp_path / "d")
    loaded = load_block_drafter(tmp_path / "d", model4)
    assert loaded.feature_layers == (0, 2)
    for (name, a), b in zip(drafter.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    ids = torch.tensor([PROMPTS[0] + PROMPTS[2]])
    batch = block_batch(drafter_inputs(ids, wide_features(model4, ids, None, (0, 2))), 3)
    loss = block_loss(drafter, batch)
    loss.total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.layer_norms.parameters())
    with pytest.raises(ValueError, match="features have width 64; this block drafter reads 192"):
        drafter(batch.input_ids, batch.features[:, :64], 3)


@torch.no_grad()
def test_a_block_chain_refuses_an_engine_without_its_layers(model4):
    engine = Engine(model4, max_batch_size=4, max_context=64)
    batch = engine.running_batch([Sequence(r, limit=12) for r in _requests()])
    prefill(engine.runner, batch)
    drafter = new_block_drafter(model4, block_size=4, feature_layers=(1,))
    with pytest.raises(ValueError, match=r"build the Engine with feature_layers=drafter.feature_layers"):
        BlockChainDrafter(drafter, k=2).propose(batch)
