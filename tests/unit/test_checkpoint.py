"""Whole-run checkpoints: atomic, verified, never silently replaced."""

from __future__ import annotations

import pytest
import torch

from tlt.runtime.checkpoint import (
    LATEST,
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    load_latest,
    save_checkpoint,
)


def _ckpt(step: int) -> Checkpoint:
    g = torch.Generator().manual_seed(step)
    w = torch.randn(4, 3, generator=g)
    opt = {
        "state": {0: {"exp_avg": torch.randn(4, 3, generator=g), "step": torch.tensor(float(step))}},
        "param_groups": [{"lr": 1e-3, "params": [0]}],
    }
    return Checkpoint(
        step=step, tensors={"policy": {"w": w}}, objects={"optimizer": opt}, state={"step": step, "seed": 7}
    )


def test_round_trip_is_bitwise(tmp_path):
    saved = _ckpt(3)
    save_checkpoint(tmp_path, saved)
    got = load_latest(tmp_path)
    assert got.step == 3 and got.state == {"step": 3, "seed": 7}
    assert torch.equal(got.tensors["policy"]["w"], saved.tensors["policy"]["w"])
    assert torch.equal(
        got.objects["optimizer"]["state"][0]["exp_avg"], saved.objects["optimizer"]["state"][0]["exp_avg"]
    )


def test_empty_root_has_no_checkpoint(tmp_path):
    assert load_latest(tmp_path) is None


def test_keeps_newest_and_points_latest(tmp_path):
    for step in range(1, 5):
        save_checkpoint(tmp_path, _ckpt(step), keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000004"]
    assert (tmp_path / LATEST).read_text() == "step-00000004"


def test_interrupted_write_is_ignored_and_cleaned(tmp_path):
    save_checkpoint(tmp_path, _ckpt(1))
    partial = tmp_path / ".tmp-step-00000002-999"
    partial.mkdir()
    (partial / "policy.safetensors").write_bytes(b"half")
    assert load_latest(tmp_path).step == 1
    save_checkpoint(tmp_path, _ckpt(2))
    assert not partial.exists()
    assert load_latest(tmp_path).step == 2


def test_complete_but_unpointed_step_is_rewritten(tmp_path):
    """Killed after the rename but before LATEST moved: the step is redone and saved again."""
    save_checkpoint(tmp_path, _ckpt(1))
    save_checkpoint(tmp_path, _ckpt(2))
    (tmp_path / LATEST).write_text("step-00000001")
    save_checkpoint(tmp_path, _ckpt(2))
    assert load_latest(tmp_path).step == 2


def test_corrupt_file_is_reported_not_replaced(tmp_path):
    folder = save_checkpoint(tmp_path, _ckpt(1))
    data = bytearray((folder / "policy.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (folder / "policy.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="policy.safetensors is corrupt"):
        load_latest(tmp_path)
    assert (folder / "policy.safetensors").read_bytes() == bytes(data)


def test_missing_latest_target_is_reported(tmp_path):
    save_checkpoint(tmp_path, _ckpt(1))
    (tmp_path / LATEST).write_text("step-00000009")
    with pytest.raises(CheckpointError, match="does not exist"):
        latest_checkpoint(tmp_path)


def test_refuses_to_overwrite_the_latest(tmp_path):
    save_checkpoint(tmp_path, _ckpt(1))
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        save_checkpoint(tmp_path, _ckpt(1))
