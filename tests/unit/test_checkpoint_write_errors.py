"""A checkpoint that cannot be written (a full disk, a file-size limit) is reported with the folder and the
bytes it needs, leaves no partial files behind, and the previous checkpoint stays the resume point."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap

import pytest
import torch

from tlt.checkpoint import store as checkpoint
from tlt.checkpoint.store import (
    LATEST,
    Checkpoint,
    CheckpointWriteError,
    checkpoint_bytes,
    load_latest,
    save_checkpoint,
    tensor_bytes,
)


def _ckpt(step: int, rows: int = 64) -> Checkpoint:
    g = torch.Generator().manual_seed(step)
    opt = {"state": {0: {"exp_avg": torch.randn(rows, 8, generator=g)}}, "param_groups": [{"lr": 1e-3}]}
    return Checkpoint(
        step=step,
        tensors={"policy": {"w": torch.randn(rows, 8, generator=g)}},
        objects={"optimizer": opt},
        state={"step": step},
    )


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_tensor_bytes_counts_every_tensor_in_nested_state():
    state = {
        "a": torch.zeros(3, 4),
        "b": [torch.zeros(2, dtype=torch.float64), (torch.zeros(5, dtype=torch.int8),)],
        "lr": 0.1,
    }
    assert tensor_bytes(state) == 3 * 4 * 4 + 2 * 8 + 5


@pytest.mark.parametrize("rows, share", [(64, 0.5), (4096, 0.97)])
def test_the_estimate_is_a_close_lower_bound_of_what_a_save_writes(tmp_path, rows, share):
    ckpt = _ckpt(1, rows)
    folder = save_checkpoint(tmp_path, ckpt)
    written = sum(p.stat().st_size for p in folder.iterdir())
    assert share * written <= checkpoint_bytes(ckpt) <= written


@pytest.mark.parametrize("writer", ["save_file", "torch_save"])
def test_full_disk_names_the_folder_and_bytes_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, writer):
    save_checkpoint(tmp_path, _ckpt(1))
    if writer == "save_file":
        monkeypatch.setattr(checkpoint, "save_file", _no_space)
    else:
        monkeypatch.setattr(checkpoint.torch, "save", _no_space)
    second = _ckpt(2)
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint(tmp_path, second)
    message = str(info.value)
    assert f"checkpoint.path {tmp_path}" in message and "No space left on device" in message
    assert f"at least {checkpoint_bytes(second):,} bytes" in message and "step-00000001 is intact" in message
    assert info.value.needed_bytes == checkpoint_bytes(second)
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "step-00000001"], "partial files left behind"
    monkeypatch.undo()
    assert load_latest(tmp_path).step == 1


def test_failed_pointer_write_frees_the_new_folder(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, _ckpt(1))
    real = checkpoint._write_file_synced

    def full_for_pointer(path, data):
        if path.name.startswith(f".tmp-{LATEST}"):
            path.write_bytes(data[:1])  # a partial pointer file, as a full disk leaves it
            _no_space()
        real(path, data)

    monkeypatch.setattr(checkpoint, "_write_file_synced", full_for_pointer)
    with pytest.raises(CheckpointWriteError, match="step-00000001 is intact"):
        save_checkpoint(tmp_path, _ckpt(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "step-00000001"]


def test_a_real_write_limit_is_reported_the_same_way(tmp_path):
    """The real writers (safetensors, torch.save) against a real OS write failure: a file-size limit
    (RLIMIT_FSIZE) set after the first checkpoint, in a child process (a full disk needs a mount)."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        sys.path[:0] = {sys.path!r}
        from tests.unit.test_checkpoint_write_errors import _ckpt
        from tlt.checkpoint.store import CheckpointWriteError, save_checkpoint
        save_checkpoint({str(tmp_path)!r}, _ckpt(1, rows=4))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            save_checkpoint({str(tmp_path)!r}, _ckpt(2, rows=4096))
        except CheckpointWriteError as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"checkpoint.path {tmp_path}: writing the step-2 checkpoint failed" in done.stdout
    assert "step-00000001 is intact" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "step-00000001"]
    assert load_latest(tmp_path).step == 1
