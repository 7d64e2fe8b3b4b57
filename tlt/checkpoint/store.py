"""Whole-run checkpoints: written to a temporary folder, fsynced, then renamed into place.

Layout under the checkpoint root::

    step-00000005/            one finished checkpoint (never modified after the rename)
        manifest.json         step, file list with sha256 digests, free-form JSON state
        <name>.safetensors    flat tensor dicts (policy and drafter weights)
        <name>.pt             nested states (optimizers, the drafter's online buffers), loaded
                              with weights_only=True
        <name>/...            folders written by others (a sharded policy's DCP files), every file
                              in the manifest with its digest
    LATEST                    name of the newest complete checkpoint, replaced atomically
    .tmp-step-00000006-1234/  an interrupted write: ignored, removed by the next save

A SIGKILL at any point leaves either the previous checkpoint as LATEST or the new one complete.
A write that fails (a full disk, a quota, an I/O error) removes its temporary folder and raises
`CheckpointWriteError` naming the root and the bytes the checkpoint needs; LATEST is untouched.
A checkpoint that exists but cannot be read or whose digests differ raises `CheckpointError`;
it is never silently skipped or replaced (`tlt.checkpoint.recovery` decides what a run does then).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tlt.runtime.devices import tree_to_cpu

log = logging.getLogger(__name__)

LATEST = "LATEST"
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be used; the message names the folder and the problem."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, I/O error); the previous one is intact."""

    def __init__(self, message: str, needed_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes


# What the writers raise when a write fails: Python's OSError, safetensors' own error, and torch.save's
# RuntimeError (its C++ stream reports a full disk as "basic_ios::clear" or "unexpected pos", no errno).
WRITE_ERRORS = (OSError, SafetensorError, RuntimeError)


@dataclass
class Checkpoint:
    """What one checkpoint holds.

    tensors: name -> flat {key: tensor} dict, stored as safetensors (weights).
    objects: name -> nested state (optimizer state dicts), stored with torch.save.
    state: JSON-serialisable run state (step counters, RNG seeds, bandit tables, metrics).
    folders: name -> a writer that fills the folder it is given (writing only); a loaded checkpoint's
    `path` is its folder, where they are (`folder_path`).
    """

    step: int
    tensors: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    folders: dict[str, Callable[[Path], None]] = field(default_factory=dict)
    path: Path | None = None

    def folder_path(self, name: str) -> Path:
        """The folder `name` of a loaded checkpoint; CheckpointError when it holds none."""
        if self.path is None or not (self.path / name).is_dir():
            raise CheckpointError(f"{self.path or 'this checkpoint'}: it holds no folder {name}")
        return self.path / name


def add_drafter(
    ckpt: Checkpoint, hub_state: dict[str, Any] | None, trainer_states: list[dict[str, Any] | None] | None
) -> None:
    """Put the drafter into `ckpt`: the hub's parameters (tensors "drafter"), its AdamW state
    (objects "drafter_optimizer") and version (state "drafter_version"), and every rollout
    worker's online buffer, shuffle epoch and AdamW state in worker order (objects "drafter_buffers",
    `SpotTrainer.state_dict`; None for a worker without one); with `hub_state["served"]`, the drafter
    the rollouts draft with (tensors "served_drafter", state "served_drafter_version")."""
    if hub_state is not None:
        ckpt.tensors["drafter"] = hub_state["params"]
        ckpt.objects["drafter_optimizer"] = hub_state["optimizer"]
        ckpt.state["drafter_version"] = int(hub_state["version"])
        if hub_state.get("served") is not None:  # the drafter the rollouts draft with (`drafter.publish`)
            ckpt.tensors["served_drafter"] = hub_state["served"]["params"]
            ckpt.state["served_drafter_version"] = int(hub_state["served"]["version"])
    if trainer_states is not None:
        ckpt.objects["drafter_buffers"] = trainer_states


def drafter_of(ckpt: Checkpoint) -> tuple[dict[str, Any] | None, list[dict[str, Any] | None] | None]:
    """(hub state, trainer states) as `add_drafter` stored them; None for what the checkpoint lacks."""
    hub = None
    if "drafter" in ckpt.tensors:
        hub = {
            "params": ckpt.tensors["drafter"],
            "optimizer": ckpt.objects["drafter_optimizer"],
            "version": int(ckpt.state["drafter_version"]),
        }
        if "served_drafter" in ckpt.tensors:
            hub["served"] = {
                "params": ckpt.tensors["served_drafter"],
                "version": int(ckpt.state["served_drafter_version"]),
            }
    return hub, ckpt.objects.get("drafter_buffers")


def _name(step: int) -> str:
    return f"step-{step:08d}"


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor's elements in `obj` (a tensor, or dicts, lists and tuples holding them)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def checkpoint_bytes(ckpt: Checkpoint) -> int:
    """A lower bound of the disk space `ckpt` takes: its tensors' bytes plus its JSON state (file headers and
    pickled structure add about 2 KiB per file: a few per cent of a real checkpoint, most of a tiny one)."""
    state = len(json.dumps(ckpt.state, sort_keys=True, default=str).encode())
    return tensor_bytes(ckpt.tensors) + tensor_bytes(ckpt.objects) + state


def _write_failed(root: Path, step: int, partial: list[Path], exc: BaseException, needed: int) -> CheckpointWriteError:
    """Remove what the failed write left (`partial`: folders and files); the error that names the root, the
    bytes needed and the checkpoint that is still the resume point."""
    for path in partial:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    free = shutil.disk_usage(root).free
    pointer = root / LATEST
    kept = f"{pointer.read_text().strip()} is intact" if pointer.exists() else "there is no earlier checkpoint"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CheckpointWriteError(
        f"checkpoint.path {root}: writing the step-{step} checkpoint failed ({first}); it needs at least "
        f"{needed:,} bytes and {free:,} are free there; the partial files were removed and {kept}",
        needed,
    )


def save_checkpoint(root: str | Path, ckpt: Checkpoint, keep: int = 2) -> Path:
    """Write `ckpt` under `root` atomically, point LATEST at it, keep the newest `keep` checkpoints.
    Raises CheckpointWriteError when a file cannot be written (LATEST and its folder left as they were)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / _name(ckpt.step)
    if final.exists() and (root / LATEST).exists() and (root / LATEST).read_text().strip() == final.name:
        raise CheckpointError(f"{final} is the latest checkpoint; refusing to overwrite it")
    tmp = root / f".tmp-{_name(ckpt.step)}-{os.getpid()}"
    try:
        tmp.mkdir()
        _write_files(tmp, ckpt)
    except WRITE_ERRORS as exc:
        raise _write_failed(root, ckpt.step, [tmp], exc, checkpoint_bytes(ckpt)) from exc
    if final.exists():  # left by a run killed before LATEST moved to it: not the resume point
        aside = root / f".tmp-old-{final.name}-{os.getpid()}"
        os.replace(final, aside)
        shutil.rmtree(aside)
    os.replace(tmp, final)
    try:
        point_latest(root, final.name)
    except OSError as exc:  # unless LATEST moved before the error, the new folder is no resume point: freed
        moved = (root / LATEST).is_file() and (root / LATEST).read_text().strip() == final.name
        raise _write_failed(root, ckpt.step, [] if moved else [final], exc, checkpoint_bytes(ckpt)) from exc
    _prune(root, keep)
    log.info("checkpoint step %d written to %s", ckpt.step, final)
    return final


def point_latest(root: Path, name: str) -> None:
    """Point LATEST at the folder `name` atomically: a temporary file, fsynced, renamed over it. An OSError
    leaves LATEST as it was (the temporary file removed)."""
    pointer = root / f".tmp-{LATEST}-{os.getpid()}"
    try:
        _write_file_synced(pointer, name.encode())
        os.replace(pointer, root / LATEST)
    except OSError:
        pointer.unlink(missing_ok=True)
        raise
    _fsync_dir(root)


def _write_files(tmp: Path, ckpt: Checkpoint) -> None:
    """Every file of `ckpt` and its manifest into the folder `tmp`, each fsynced, then the folder."""
    files: dict[str, str] = {}
    for name, tensors in ckpt.tensors.items():
        path = tmp / f"{name}.safetensors"
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path))
        files[path.name] = file_sha256(path)
    for name, obj in ckpt.objects.items():
        path = tmp / f"{name}.pt"
        torch.save(tree_to_cpu(obj), path)  # readable on a machine without the GPU that trained it
        files[path.name] = file_sha256(path)
    for name, write in ckpt.folders.items():
        folder = tmp / name
        folder.mkdir()
        write(folder)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            files[path.relative_to(tmp).as_posix()] = file_sha256(path)
    manifest = {"step": ckpt.step, "files": files, "state": ckpt.state}
    _write_file_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    for name in files:
        with (tmp / name).open("rb") as fh:
            os.fsync(fh.fileno())
    for name in ckpt.folders:
        _fsync_dir(tmp / name)
    _fsync_dir(tmp)


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("step-*") if p.is_dir())
    latest = (root / LATEST).read_text().strip()
    for old in done[:-keep]:
        if old.name != latest:
            shutil.rmtree(old)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The folder LATEST names, or None when `root` holds no checkpoint yet."""
    root = Path(root)
    pointer = root / LATEST
    if not pointer.exists():
        if any(root.glob("step-*")):
            raise CheckpointError(f"{root}: checkpoint folders exist but {LATEST} is missing")
        return None
    folder = root / pointer.read_text().strip()
    if not folder.is_dir():
        raise CheckpointError(f"{pointer} names {folder.name}, which does not exist")
    return folder


def load_checkpoint(folder: str | Path) -> Checkpoint:
    """Read one checkpoint folder, verifying every file's digest."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{folder}: unreadable {MANIFEST}: {exc}") from exc
    ckpt = Checkpoint(step=int(manifest["step"]), state=manifest.get("state", {}), path=folder)
    for name, digest in manifest["files"].items():
        path = folder / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise CheckpointError(f"{folder}: {MANIFEST} lists {name!r}, outside the checkpoint")
        if not path.is_file():
            raise CheckpointError(f"{folder}: {name} listed in {MANIFEST} is missing")
        if file_sha256(path) != digest:
            raise CheckpointError(f"{folder}: {name} is corrupt (sha256 differs from {MANIFEST})")
        if "/" in name:  # a folder's file: read by whoever wrote the folder
            continue
        stem = name.rsplit(".", 1)[0]
        if name.endswith(".safetensors"):
            ckpt.tensors[stem] = load_file(str(path))
        else:
            ckpt.objects[stem] = torch.load(path, weights_only=True, map_location="cpu")
    return ckpt


def load_latest(root: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint under `root`, or None when there is none yet."""
    folder = latest_checkpoint(root)
    return None if folder is None else load_checkpoint(folder)
