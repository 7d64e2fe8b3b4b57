"""The sd part's block drafter: warm-started like the bench's EAGLE drafter (`tlt.bench.bench_drafter`: the
same prompts, steps, batch and learning rate), cached beside the policy by its settings; also the block
part of the workloads' drafter warm start (`with_block_part`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.bench.bench_drafter import DrafterBudget, drafter_data, drafter_requests, own_samples
from tlt.bench.drafter_cache import cached_drafter
from tlt.drafter.block_objective import BlockTraining, block_agreement, block_batch
from tlt.drafter.drafter_set import BLOCK_SNAPSHOTS
from tlt.models.block_drafter import BlockDrafter, load_block_drafter, new_block_drafter
from tlt.models.drafter import CONFIG_FILE
from tlt.progress import phase


def trained_block_drafter(
    cfg: DrafterBudget,
    block: int,
    layers: int,
    folder: Path,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    feature_layers: tuple[int, ...] = (),
) -> tuple[BlockDrafter, dict]:
    """A block drafter of block size `block` and `layers` layers, reading the target's `feature_layers` beside
    its final-norm state, trained for cfg.drafter_steps on the policy's own T=1 samples; info has its
    per-offset agreement on a held-out batch (`block_agreement`)."""
    settings = {
        "policy": folder.name,
        "prompts": cfg.drafter_prompts,
        "steps": cfg.drafter_steps,
        "batch": cfg.drafter_batch,
        "lr": cfg.drafter_lr,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
        "block_size": block,
        "layers": layers,
    }
    if feature_layers:  # (absent from the settings of a final-norm drafter: its cache key is unchanged)
        settings["feature_layers"] = list(feature_layers)

    def train() -> tuple[BlockDrafter, dict]:
        requests = drafter_requests(cfg, folder, tokenizer)
        started = time.perf_counter()
        batches = [block_batch(b, block) for b in own_samples(policy, requests, cfg.drafter_batch, feature_layers)]
        torch.manual_seed(cfg.seed)
        drafter = new_block_drafter(policy, block, layers, feature_layers)
        with phase("block drafter warm start: training", cfg.drafter_steps) as update:
            losses = BlockTraining(drafter, batches, cfg.drafter_lr).train(
                cfg.drafter_steps, lambda step, loss: update(step, f"loss {loss:.3f}")
            )
        held = drafter_data(policy, requests[: cfg.drafter_batch], cfg.drafter_batch, feature_layers)[0]
        held = block_batch(held, block)
        return drafter, {
            "train_seconds": time.perf_counter() - started,
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "train_agreement_by_offset": block_agreement(drafter, held),
        }

    return cached_drafter(folder, "bench-block-drafter", settings, train, lambda path: load_block_drafter(path, policy))


def with_block_part(eagle: Path, block: Path) -> Path:
    """The folder `<policy>/bench-drafter-set-<eagle key>-<block key>` beside the cached drafters `eagle` and
    `block` (`cached_drafter` folders): the EAGLE drafter's files with the block drafter's in `block/`, the
    layout `speculative.drafterPath` reads (`tlt.drafter.warmstart`). Built once, under a temporary name."""
    target = eagle.parent / f"bench-drafter-set-{eagle.name.rsplit('-', 1)[-1]}-{block.name.rsplit('-', 1)[-1]}"
    if (target / BLOCK_SNAPSHOTS / CONFIG_FILE).is_file():
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=eagle.parent))
    shutil.copytree(eagle, staging, dirs_exist_ok=True)
    shutil.copytree(block, staging / BLOCK_SNAPSHOTS)
    try:
        os.rename(staging, target)
    except OSError:  # another process built it first
        shutil.rmtree(staging, ignore_errors=True)
    return target
