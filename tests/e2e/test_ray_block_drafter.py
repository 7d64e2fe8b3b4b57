"""A 2-step Ray run with block arms (local cluster, 2 rollout workers, the tiny policy): the workers draft
with the block drafter the bandit picks, their spot trainers train the run's drafter set (EAGLE + block) in
idle time and sync it with the hub, and the checkpoint, the snapshots and the served drafter hold both. The
block drafter reads the target's wide features: the workers' engines keep its layers, the buffers carry them.

Idle time: a tiny run's shards end within milliseconds of each other, so the trainers run until the next
step's first rollout token (`stop_trainers_at="rollout"`) and a slow reward plug-in (0.1 s a sample) makes
the wait for rewards long enough for optimizer steps."""

from __future__ import annotations

import pytest
import ray
from _old_drafter import digests, write_final_norm_checkpoint
from _train_runs import tiny_policy  # tests/e2e is no package: its folder is on sys.path

from tlt.checkpoint.resume_guard import ResumeError
from tlt.checkpoint.store import load_latest
from tlt.drafter.drafter_set import BLOCK_SNAPSHOTS
from tlt.models.block_drafter import load_block_drafter
from tlt.models.drafter import load_drafter
from tlt.runtime.ray_executor import ray_trainer
from tlt.spec.plan import spread_layers
from tlt.spec.run import TLTTrainingRun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ARMS = [{"kind": "block", "depth": 4}, {"kind": "block", "depth": 2}, {"kind": "chain", "depth": 2}]


def test_ray_run_drafts_with_trains_and_checkpoints_the_block_drafter(tmp_path):
    spec = {
        "model": {"path": str(tiny_policy(tmp_path)), "dtype": "float32"},
        "dataset": {"builtin": {"numTrain": 32}},
        "algorithm": {"steps": 2, "promptsPerStep": 4, "groupSize": 4, "maxNewTokens": 48, "seed": 3},
        "rollout": {"replicas": 2},
        "verifier": {"replicas": 1, "reward": "_slow_reward:reward"},  # 0.1 s a sample: idle time to train in
        "speculative": {"mode": "tlt", "arms": ARMS, "threshold": 8, "buckets": [2, 8]},
        "drafter": {"enabledSlots": "all", "batchTokens": 64, "learningRate": 1e-3, "publish": "latest"},
        "checkpoint": {"intervalSteps": 1},
    }
    run = TLTTrainingRun.model_validate({"metadata": {"name": "block"}, "spec": spec})
    out = tmp_path / "out"
    try:
        # trainers also harvest the update and the rewards' wait (as on rollout pods with their own devices)
        trainer = ray_trainer(run, out, num_cpus=2, stop_trainers_at="rollout")
        history = trainer.train()
    finally:
        ray.shutdown()
    assert [m["step"] for m in history] == [1, 2]
    assert all(m["pre_update_seconds"] >= 0 and m["bookkeeping_wait_seconds"] >= 0 for m in history)
    chosen = {arm: sum(m["sd_arms"].get(arm, 0) for m in history) for arm in ("block-d4", "block-d2")}
    assert sum(chosen.values()) > 0, f"the bandit never drafted with a block arm: {[m['sd_arms'] for m in history]}"
    acks = [a for m in history for a in m["trainer_acks"]]
    assert all(a["error"] is None for a in acks), f"a spot trainer of the drafter set failed: {acks}"
    assert sum(m["drafter_updates"] for m in history) > 0, "no trainer pushed a step of the drafter set"
    ckpt = load_latest(out / "checkpoints")
    keys = set(ckpt.tensors["drafter"])
    assert any(k.startswith("block.") for k in keys) and any(k.startswith("eagle.") for k in keys)
    # the last step's trainers run on until the run ends (`stop_trainers_at="rollout"`): its checkpoint, written
    # while they may still sync, can be past the updates the steps counted
    assert ckpt.state["drafter_version"] >= sum(m["drafter_updates"] for m in history) > 0
    served = out / "drafter-served"
    block = load_block_drafter(served / BLOCK_SNAPSHOTS, trainer.policy.config)
    config = trainer.policy.config
    assert block.block_size == 4 and block.feature_layers == spread_layers(config.num_hidden_layers) != ()
    # the workers' engines kept those layers: the buffers the trainers learned from hold the wide features
    hidden = [h for b in ckpt.objects["drafter_buffers"] if b for h in b["buffer"]["hidden"]]
    assert hidden and {h.shape[-1] for h in hidden} == {block.feature_size}
    assert load_drafter(served, trainer.policy.config) is not None
    assert (out / "drafter" / BLOCK_SNAPSHOTS / "LATEST").is_file(), "the hub's block drafter snapshot"

    # the same run resumed from a checkpoint of the old block drafter layout: refused before any actor starts
    old = tmp_path / "old"
    write_final_norm_checkpoint(out / "checkpoints", old / "checkpoints")
    before = digests(old)
    longer = run.model_copy(deep=True)
    longer.spec.algorithm.steps = 3
    with pytest.raises(ResumeError, match=r"drafter does not fit .*block.layer_norms.0.weight"):
        try:
            ray_trainer(longer, old, num_cpus=2)
        finally:
            ray.shutdown()
    assert digests(old) == before
