"""Whole-run checkpoints: atomic, verified, never silently replaced."""

from __future__ import annotations

import pytest
import torch

from tlt.checkpoint.store import (
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


def _with_folder(step: int) -> Checkpoint:
    """A checkpoint whose folder `shards` a writer fills (as a policy group's ranks do through DCP)."""
    ckpt = _ckpt(step)

    def write(folder):
        (folder / "__0_0.distcp").write_bytes(b"rank 0")
        (folder / "nested").mkdir()
        (folder / "nested" / ".metadata").write_bytes(b"meta")

    ckpt.folders["shards"] = write
    return ckpt


def test_a_written_folder_is_inside_the_checkpoint_with_its_digests(tmp_path):
    final = save_checkpoint(tmp_path, _with_folder(2))
    got = load_latest(tmp_path)
    assert got.path == final
    assert (got.folder_path("shards") / "__0_0.distcp").read_bytes() == b"rank 0"
    assert (got.folder_path("shards") / "nested" / ".metadata").read_bytes() == b"meta"
    assert "shards" not in got.tensors and "shards" not in got.objects
    with pytest.raises(CheckpointError, match="no folder other"):
        got.folder_path("other")


def test_a_changed_file_of_a_written_folder_is_reported(tmp_path):
    final = save_checkpoint(tmp_path, _with_folder(2))
    (final / "shards" / "nested" / ".metadata").write_bytes(b"METa")
    with pytest.raises(CheckpointError, match="shards/nested/.metadata is corrupt"):
        load_latest(tmp_path)


def test_a_manifest_naming_a_file_outside_the_checkpoint_is_refused(tmp_path):
    import json

    final = save_checkpoint(tmp_path, _with_folder(2))
    manifest = json.loads((final / "manifest.json").read_text())
    manifest["files"]["../outside"] = "0" * 64
    (final / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        load_latest(tmp_path)


def test_a_writer_that_fails_leaves_the_previous_checkpoint_the_latest(tmp_path):
    save_checkpoint(tmp_path, _ckpt(1))
    broken = _ckpt(2)

    def write(folder):
        raise OSError(28, "No space left on device")

    broken.folders["shards"] = write
    with pytest.raises(Exception, match="No space left"):
        save_checkpoint(tmp_path, broken)
    assert latest_checkpoint(tmp_path).name == "step-00000001"
    assert not list(tmp_path.glob(".tmp-*"))
