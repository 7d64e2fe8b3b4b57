"""`speculative.drafterPath`: the drafter parameters a run starts from.

Layout (what a run's `drafter-served/` holds, `tlt.drafter.export.write_served_drafter`, so a run's served
drafter warm-starts the next run): the EAGLE drafter's `save_drafter` files in the folder itself, the block
drafter's in `<folder>/block/` (`BLOCK_SNAPSHOTS`). A run takes the parts its usable arms draft with
(`learned_drafters`); a part it learns that the folder lacks starts fresh, a part it does not learn is
ignored, a folder with none of the parts it learns is refused. A block part must have the run's block size
(the largest block arm's depth) and the hub's layer count (`BLOCK_LAYERS`), else one line names the field
and the file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from transformers import PretrainedConfig

from tlt.drafter.drafter_set import BLOCK_LAYERS, BLOCK_SNAPSHOTS, member_params
from tlt.models.block_drafter import load_block_drafter
from tlt.models.drafter import CONFIG_FILE, load_drafter
from tlt.spec.plan import LearnedDrafters

FIELD = "speculative.drafterPath"

log = logging.getLogger(__name__)


def has_eagle_part(folder: str | Path) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file()


def has_block_part(folder: str | Path) -> bool:
    return (Path(folder) / BLOCK_SNAPSHOTS / CONFIG_FILE).is_file()


def block_part_problem(
    folder: str | Path, block_size: int, feature_layers: tuple[int, ...] | None = None
) -> str | None:
    """Why the block part of `folder` does not fit a run whose block drafter has `block_size` and reads the
    target's `feature_layers` (None: not checked; reads its config.json only); None when it fits."""
    config_file = Path(folder) / BLOCK_SNAPSHOTS / CONFIG_FILE
    saved = json.loads(config_file.read_text())
    if saved.get("block_size") != block_size:
        return (
            f"{FIELD}: {config_file}: block_size {saved.get('block_size')!r}, this run's block drafter has "
            f"block_size {block_size} (the largest depth of its block arms in speculative.arms)"
        )
    if int(saved.get("num_hidden_layers", BLOCK_LAYERS)) != BLOCK_LAYERS:
        return (
            f"{FIELD}: {config_file}: num_hidden_layers {saved.get('num_hidden_layers')!r}, a run's block drafter "
            f"has {BLOCK_LAYERS}"
        )
    saved_layers = [int(i) for i in saved.get("feature_layers") or ()]
    if feature_layers is not None and saved_layers != list(feature_layers):
        return (
            f"{FIELD}: {config_file}: feature_layers {saved_layers}, this run's block drafter reads the target's "
            f"layers {list(feature_layers)} (spread over this policy's depth): warm-start from a block part "
            "trained for this policy, or remove block/ from the folder (the block drafter then starts fresh)"
        )
    return None


def warm_start_problem(folder: str | Path, learned: LearnedDrafters, check_layers: bool = True) -> str | None:
    """Why `folder` cannot warm-start a run that learns `learned`, one line naming the field and the file;
    None when it can (reads config files only). check_layers: compare the block part's feature layers too
    (off where the policy, and so its layer count, is not known yet)."""
    eagle, block = learned.eagle and has_eagle_part(folder), learned.block_size > 0 and has_block_part(folder)
    if block:
        return block_part_problem(folder, learned.block_size, learned.feature_layers if check_layers else None)
    if eagle:
        return None
    if not learned.block_size:
        return f"{FIELD}: {folder!r} has no {CONFIG_FILE} (an EAGLE drafter's folder, save_drafter writes it)"
    if learned.eagle:
        return (
            f"{FIELD}: {folder!r} holds neither an EAGLE drafter ({CONFIG_FILE}) nor a block drafter "
            f"({BLOCK_SNAPSHOTS}/{CONFIG_FILE})"
        )
    return (
        f"{FIELD}: {folder!r} holds no block drafter ({BLOCK_SNAPSHOTS}/{CONFIG_FILE}), and this run's arms use the "
        "block drafter only: add a chain, tree or mixed arm, or point it at a folder with a block/ part"
    )


def warm_start_params(
    folder: str | Path, target: PretrainedConfig, learned: LearnedDrafters
) -> dict[str, torch.Tensor]:
    """The float32 parameters of `folder` for a run that learns `learned`, in the hub's layout: a plain EAGLE
    drafter's without block arms, else a `DrafterSet`'s ("eagle.*", "block.*") holding the parts present.
    ValueError with `warm_start_problem`'s line when the folder does not fit."""
    problem = warm_start_problem(folder, learned)
    if problem is not None:
        raise ValueError(problem)
    if not learned.block_size:
        return load_drafter(folder, target).float().state_dict()
    params: dict[str, torch.Tensor] = {}
    if learned.eagle and has_eagle_part(folder):
        params.update({f"eagle.{k}": v for k, v in load_drafter(folder, target).float().state_dict().items()})
    if has_block_part(folder):
        block = load_block_drafter(Path(folder) / BLOCK_SNAPSHOTS, target).float()
        params.update({f"block.{k}": v for k, v in block.state_dict().items()})
    log.info("%s: the drafters start from %s (%s)", FIELD, folder, ", ".join(sorted(member_params(params))))
    return params
