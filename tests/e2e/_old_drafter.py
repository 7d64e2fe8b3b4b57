"""A whole-run checkpoint whose block drafter has the layout from before block drafters read target layers:
no per-layer norms, `fc` over (token embedding, final-norm state) only. What a run checkpointed then holds."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from tlt.checkpoint.store import load_latest, save_checkpoint


def final_norm_only(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`params` of a drafter set with the block member's layer norms dropped and its fc cut to 2H inputs."""
    width = params["block.fc.weight"].shape[0]
    old = {k: v for k, v in params.items() if not k.startswith("block.layer_norms.")}
    old["block.fc.weight"] = params["block.fc.weight"][:, : 2 * width].clone()
    return old


def write_final_norm_checkpoint(src: Path, dst: Path) -> Path:
    """Copy the newest checkpoint under `src` to `dst` with its hub's and served block drafter in the old layout;
    returns the written folder."""
    ckpt = load_latest(src)
    for name in ("drafter", "served_drafter"):
        if name in ckpt.tensors:
            ckpt.tensors[name] = final_norm_only(ckpt.tensors[name])
    return save_checkpoint(dst, ckpt)


def digests(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `root`."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
