"""A damaged newest checkpoint: `checkpoint.onCorrupt: fallback` resumes from the newest intact one (the damaged
folder kept aside, LATEST moved, a warning), `fail` stops with the damage named and nothing touched."""

from __future__ import annotations

import logging

import pytest
import torch

from tlt.checkpoint.recovery import resume_point
from tlt.checkpoint.resume_guard import ResumeError
from tlt.checkpoint.store import LATEST, Checkpoint, CheckpointError, load_latest, save_checkpoint
from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.spec.run import CheckpointSpec, TLTTrainingRun
from tlt.tasks.tokenizer import build_task_tokenizer


def _ckpt(step: int) -> Checkpoint:
    return Checkpoint(
        step=step,
        tensors={"policy": {"w": torch.full((16,), float(step))}},
        objects={"optimizer": {"step": torch.tensor(step)}},
        state={"step": step},
    )


def _saved(root, steps: int, keep: int = 3):
    for step in range(1, steps + 1):
        save_checkpoint(root, _ckpt(step), keep=keep)
    return root


def _truncate(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _listing(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_on_corrupt_defaults_to_fallback_and_allows_only_its_two_values():
    assert CheckpointSpec().on_corrupt == "fallback"
    assert CheckpointSpec.model_validate({"onCorrupt": "fail"}).on_corrupt == "fail"
    with pytest.raises(ValueError, match="fallback"):
        CheckpointSpec.model_validate({"onCorrupt": "ignore"})


def test_intact_checkpoints_resume_from_latest_with_nothing_skipped(tmp_path):
    ckpt, skipped = resume_point(_saved(tmp_path, 2), "fallback")
    assert ckpt.step == 2 and skipped == []


def test_no_checkpoint_yet_is_a_fresh_start(tmp_path):
    assert resume_point(tmp_path, "fallback") == (None, [])


def test_truncated_newest_falls_back_to_the_one_before(tmp_path, caplog):
    root = _saved(tmp_path, 3)
    _truncate(root / "step-00000003" / "policy.safetensors")
    with caplog.at_level(logging.WARNING):
        ckpt, skipped = resume_point(root, "fallback")
    assert ckpt.step == 2 and torch.equal(ckpt.tensors["policy"]["w"], torch.full((16,), 2.0))
    assert [(s.folder, s.moved_to) for s in skipped] == [("step-00000003", "corrupt-step-00000003")]
    assert "policy.safetensors is corrupt" in skipped[0].reason
    assert (root / LATEST).read_text() == "step-00000002"
    assert (root / "corrupt-step-00000003" / "policy.safetensors").is_file(), "the damaged folder is kept"
    assert "CHECKPOINT DAMAGED" in caplog.text and "resuming from the intact step-00000002" in caplog.text
    save_checkpoint(root, _ckpt(3), keep=3)  # the run redoes step 3: nothing in the way
    assert load_latest(root).step == 3 and (root / "corrupt-step-00000003").is_dir()


def test_fallback_passes_over_every_damaged_checkpoint(tmp_path):
    root = _saved(tmp_path, 3)
    _truncate(root / "step-00000003" / "optimizer.pt")
    (root / "step-00000002" / "manifest.json").write_text("{")
    ckpt, skipped = resume_point(root, "fallback")
    assert ckpt.step == 1 and [s.folder for s in skipped] == ["step-00000003", "step-00000002"]


def test_fallback_with_nothing_intact_stops_the_run(tmp_path):
    root = _saved(tmp_path, 1)
    _truncate(root / "step-00000001" / "policy.safetensors")
    before = _listing(root)
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        resume_point(root, "fallback")
    assert _listing(root) == before


def test_fail_stops_at_the_damaged_newest_and_touches_nothing(tmp_path):
    root = _saved(tmp_path, 3)
    _truncate(root / "step-00000003" / "policy.safetensors")
    before = _listing(root)
    with pytest.raises(CheckpointError, match="step-00000003: policy.safetensors is corrupt"):
        resume_point(root, "fail")
    assert _listing(root) == before


def test_latest_naming_a_missing_folder_falls_back(tmp_path):
    root = _saved(tmp_path, 2)
    (root / LATEST).write_text("step-00000009")
    ckpt, skipped = resume_point(root, "fallback")
    assert ckpt.step == 2 and skipped[0].folder == LATEST and (root / LATEST).read_text() == "step-00000002"


def test_a_folder_past_latest_is_no_resume_point(tmp_path):
    """A folder renamed into place by a run killed before LATEST moved is not the run's state: passed over."""
    root = _saved(tmp_path, 3)
    (root / LATEST).write_text("step-00000002")
    _truncate(root / "step-00000002" / "policy.safetensors")
    ckpt, _ = resume_point(root, "fallback")
    assert ckpt.step == 1


@pytest.mark.parametrize("on_corrupt, error", [("fail", CheckpointError), ("fallback", ResumeError)])
def test_a_ray_run_checks_its_checkpoint_before_ray_starts(tmp_path, monkeypatch, on_corrupt, error):
    """Damaged (fail), or intact but another run's (fallback passes over the damage to step 2, whose spec is
    not this run's): either way the run stops before `connect` starts or joins a Ray cluster."""
    from tlt.runtime import ray_executor

    def ray_started(*args, **kwargs):
        raise AssertionError("Ray started before the checkpoint was checked")

    monkeypatch.setattr(ray_executor, "connect", ray_started)
    tokenizer = build_task_tokenizer()
    save_policy(tiny_model("qwen2", vocab_size=len(tokenizer), seed=1), tokenizer, tmp_path / "policy")
    run = TLTTrainingRun.model_validate(
        {
            "metadata": {"name": "early"},
            "spec": {"model": {"path": str(tmp_path / "policy")}, "checkpoint": {"onCorrupt": on_corrupt}},
        }
    )
    root = _saved(tmp_path / "out" / "checkpoints", 3)
    _truncate(root / "step-00000003" / "policy.safetensors")
    with pytest.raises(error):
        ray_executor.ray_trainer(run, tmp_path / "out")
