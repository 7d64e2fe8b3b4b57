"""The single-process loop's block drafter: published after scoring, and resumed from a checkpoint exactly."""

from __future__ import annotations

import pytest
import torch
from test_drafter_hub import policy, sample_completions
from test_drafter_resume import _assert_same

from tlt.adaptive.adaptive_stepper import AdaptiveStepper
from tlt.models.tiny import tiny_model
from tlt.rollout.engine import Engine
from tlt.runtime.checkpoint import Checkpoint, load_latest, save_checkpoint
from tlt.runtime.local_drafter import LocalBlockDrafter, local_block_drafter
from tlt.spec.plan import spread_layers
from tlt.spec.run import RunSpec

SPEC = {
    "speculative": {"mode": "tlt", "arms": [{"kind": "block", "depth": 3}, {"kind": "ngram"}]},
    "drafter": {"batchTokens": 32, "publish": "validated", "learningRate": 3e-3},
}


def _drafter(spec: RunSpec) -> LocalBlockDrafter:
    engine = Engine(policy(), max_batch_size=4, max_context=64, return_hidden=True)
    block = local_block_drafter(spec, engine, None)
    assert block is not None
    return block


def _step(block: LocalBlockDrafter, step: int) -> dict:
    stepper = block.stepper(rows=4, context=64)
    assert isinstance(stepper, AdaptiveStepper) and any(a.label == "block-d3" for a in stepper.arms)
    return {**block.take(sample_completions(block.engine.runner.model, seed=step), step), **block.train(step)}


def test_no_block_arm_no_block_drafter():
    engine = Engine(policy(), max_batch_size=4, max_context=64, return_hidden=True)
    assert local_block_drafter(RunSpec(), engine, None) is None


def test_the_candidate_is_scored_beside_the_served_drafter_before_it_is_served():
    block = _drafter(RunSpec.model_validate(SPEC))
    first = _step(block, 1)
    assert first["drafter_served_version"] == 0 and first["drafter_candidate_version"] is None
    assert first["drafter_version"] > 0
    second = _step(block, 2)
    assert second["drafter_served_version"] == 0, "validated: the trained drafter waits for its score"
    assert second["drafter_candidate_version"] == first["drafter_version"]
    assert block.served[0] == (first["drafter_version"] if second["drafter_promoted"] else 0)


@pytest.mark.parametrize("drop", [None, "served", "optimizer", "buffer"])
def test_a_resumed_local_block_drafter_continues_exactly(tmp_path, drop):
    spec = RunSpec.model_validate(SPEC)
    block = _drafter(spec)
    _step(block, 1)
    _step(block, 2)
    ckpt = Checkpoint(step=2)
    block.add_to(ckpt)
    if drop == "served":
        del ckpt.tensors["served_drafter"]
    elif drop == "optimizer":
        ckpt.objects["drafter_buffers"][0]["optimizer"] = block.trainer.optimizer.__class__(
            block.drafters.parameters()
        ).state_dict()
    elif drop == "buffer":
        ckpt.objects["drafter_buffers"][0]["buffer"]["current_step"] = 0
    save_checkpoint(tmp_path, ckpt)
    want = _step(block, 3)

    resumed = _drafter(spec)
    resumed.resume(load_latest(tmp_path))
    got = _step(resumed, 3)
    try:
        _assert_same(got, want)
        _assert_same(resumed.hub.state(), block.hub.state())
        _assert_same(resumed.trainer.state_dict(), block.trainer.state_dict())
        assert resumed.served[0] == block.served[0] and all(
            torch.equal(resumed.served[1][k], v) for k, v in block.served[1].items()
        )
    except AssertionError:
        assert drop is not None, "a complete checkpoint did not resume the block drafter exactly"
    else:
        assert drop is None, f"dropping the block drafter's {drop} went unnoticed"


def test_an_engine_without_the_drafters_layers_is_refused():
    model = tiny_model(vocab_size=32, hidden_size=16, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=32)
    spec = RunSpec.model_validate(SPEC)
    layers = spread_layers(4)
    refusal = rf"engine keeps feature layers \[\]; this run's block drafter reads \[{', '.join(map(str, layers))}\]"
    with pytest.raises(ValueError, match=refusal):
        LocalBlockDrafter(spec, Engine(model, max_batch_size=4, max_context=64, return_hidden=True))
    kept = Engine(model, max_batch_size=4, max_context=64, return_hidden=True, feature_layers=layers)
    assert LocalBlockDrafter(spec, kept).drafters.block.feature_layers == layers != ()
