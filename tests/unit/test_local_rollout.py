"""The one-process loop's rollout worker: its drafters published after scoring, resumed from a checkpoint
exactly, and its engine built for what its drafters read."""

from __future__ import annotations

import pytest
import torch
from test_drafter_hub import policy, sample_completions
from test_drafter_resume import _assert_same

from tlt.checkpoint.store import Checkpoint, load_latest, save_checkpoint
from tlt.models.tiny import tiny_model
from tlt.spec.plan import spread_layers
from tlt.spec.run import RunSpec
from tlt.workers.local_rollout import LocalWorker

SPEC = {
    "speculative": {
        "mode": "tlt",
        "arms": [{"kind": "block", "depth": 3}, {"kind": "chain", "depth": 2}, {"kind": "ngram"}],
    },
    "drafter": {"batchTokens": 32, "publish": "validated", "learningRate": 3e-3},
}


def _worker(spec: RunSpec, model=None) -> LocalWorker:
    return LocalWorker(spec, model if model is not None else policy(), None, None)


def _step(worker: LocalWorker, step: int) -> dict:
    """The worker's drafter part of `step` on fresh samples; the hub's pushes without their clock."""
    worker.load_drafters()
    out = worker.after_update(sample_completions(worker.engine.runner.model, seed=step), step)
    if "hub_pushes" in out:
        out["hub_pushes"] = [{k: v for k, v in push.items() if k != "time"} for push in out["hub_pushes"]]
    return out


def test_each_mode_gets_the_drafters_it_learns():
    off = _worker(RunSpec.model_validate({"speculative": {"mode": "off"}}))
    assert off.hub is None and off.drafting.drafter is None and off.after_update([], 1) == {}
    eagle = _worker(RunSpec())  # mode tlt, chain and tree arms
    assert eagle.drafting.eagle is not None and eagle.drafting.block is None and eagle.hub is not None
    both = _worker(RunSpec.model_validate(SPEC))
    assert both.drafting.eagle is not None and both.drafting.block is not None
    assert both.generator.drafter is both.drafting.eagle and both.generator.block is both.drafting.block


def test_the_candidate_is_scored_beside_the_served_drafter_before_it_is_served():
    worker = _worker(RunSpec.model_validate(SPEC))
    first = _step(worker, 1)
    assert first["drafter_served_version"] == 0 and first["drafter_candidate_version"] is None
    assert first["drafter_version"] > 0
    second = _step(worker, 2)
    assert second["drafter_served_version"] == 0, "validated: the trained drafter waits for its score"
    assert second["drafter_candidate_version"] == first["drafter_version"]
    assert worker.served[0] == (first["drafter_version"] if second["drafter_promoted"] else 0)


@pytest.mark.parametrize("drop", [None, "served", "optimizer", "buffer"])
def test_a_resumed_local_worker_continues_its_drafters_exactly(tmp_path, drop):
    spec = RunSpec.model_validate(SPEC)
    worker = _worker(spec)
    _step(worker, 1)
    _step(worker, 2)
    ckpt = Checkpoint(step=2)
    worker.add_to(ckpt)
    if drop == "served":
        del ckpt.tensors["served_drafter"]
    elif drop == "optimizer":
        trainer = worker.drafting.trainer
        ckpt.objects["drafter_buffers"][0]["optimizer"] = trainer.optimizer.__class__(
            worker.drafting.drafter.parameters()
        ).state_dict()
    elif drop == "buffer":
        ckpt.objects["drafter_buffers"][0]["buffer"]["current_step"] = 0
    save_checkpoint(tmp_path, ckpt)
    want = _step(worker, 3)

    resumed = _worker(spec)
    resumed.resume(load_latest(tmp_path))
    got = _step(resumed, 3)
    try:
        _assert_same(got, want)
        _assert_same(resumed.hub.state(), worker.hub.state())
        _assert_same(resumed.drafting.trainer.state_dict(), worker.drafting.trainer.state_dict())
        assert resumed.served[0] == worker.served[0] and all(
            torch.equal(resumed.served[1][k], v) for k, v in worker.served[1].items()
        )
    except AssertionError:
        assert drop is not None, "a complete checkpoint did not resume the drafters exactly"
    else:
        assert drop is None, f"dropping the drafters' {drop} went unnoticed"


def test_the_engine_keeps_the_target_layers_the_block_drafter_reads():
    model = tiny_model(vocab_size=32, hidden_size=16, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=32)
    worker = _worker(RunSpec.model_validate(SPEC), model)
    layers = spread_layers(4)
    assert worker.engine.runner.feature_layers == layers == worker.drafting.block.feature_layers != ()


def test_a_sidecar_trainer_is_refused_in_one_process():
    spec = RunSpec.model_validate({"drafter": {"placement": "sidecar", "deviceClassName": "gpu.nvidia.com"}})
    with pytest.raises(ValueError, match="drafter.placement 'sidecar' .* needs the Ray runtime"):
        _worker(spec)
