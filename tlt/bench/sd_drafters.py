"""The sd bench's drafters: an EAGLE drafter and a block drafter, each warm-started on the policy's own
T=1 samples of task prompts other than the timed ones, and cached beside the policy by their settings
(`tlt.bench.drafter_cache`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.bench.drafter_cache import cached_drafter
from tlt.drafter.block_objective import BlockTraining, block_agreement, block_batch
from tlt.drafter.evaluate import make_requests
from tlt.drafter.objective import DrafterBatch, drafter_inputs, train_drafter_steps
from tlt.models.block_drafter import BlockDrafter, load_block_drafter, new_block_drafter
from tlt.models.drafter import (
    EagleDrafter,
    drafter_config_from_target,
    load_drafter,
    target_features,
)
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request
from tlt.tasks.countdown import CountdownTask, generate
from tlt.tasks.warmstart import load_metadata

if TYPE_CHECKING:
    from tlt.bench.engine_sd import SdBenchConfig


def task_of(folder: Path) -> CountdownTask:
    """The task the warm-started policy in `folder` was trained on."""
    return CountdownTask(**load_metadata(folder)["config"]["task"])


def context_for(policy: PreTrainedModel, requests: list[Request]) -> int:
    """A KV context that holds every request's prompt and response, within the policy's positions."""
    longest = max(len(r.prompt_ids) + r.params.max_new_tokens for r in requests)
    return min(policy.config.max_position_embeddings, longest + 32)


def drafter_data(policy: PreTrainedModel, requests: list[Request], batch: int) -> list[DrafterBatch]:
    """The policy's own samples as aligned drafter batches (response positions only)."""
    engine = Engine(policy, max_batch_size=64, max_context=context_for(policy, requests), return_hidden=False)
    seqs = [(c.prompt_ids + c.token_ids, len(c.prompt_ids)) for c in engine.generate(requests)]
    out = []
    for start in range(0, len(seqs), batch):
        chunk = seqs[start : start + batch]
        width = max(len(ids) for ids, _ in chunk)
        tokens = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.bool)
        valid = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, (ids, prompt_len) in enumerate(chunk):
            tokens[row, : len(ids)] = torch.tensor(ids)
            valid[row, : len(ids)] = 1
            mask[row, prompt_len - 1 : len(ids)] = True  # f[t] that produced a response token
        hidden = target_features(policy, tokens, valid)
        out.append(drafter_inputs(tokens, hidden, mask))
    return out


def drafter_requests(cfg: SdBenchConfig, folder: Path, tokenizer: PreTrainedTokenizerBase) -> list[Request]:
    """The drafters' warm-start prompts: `drafter_prompts` task prompts other than the timed ones, at T=1."""
    problems = generate(cfg.drafter_prompts, cfg.seed + 7_777_777, task_of(folder))
    return make_requests(tokenizer, problems, max_new_tokens=cfg.max_new_tokens, temperature=1.0,
                         seed=cfg.seed + 7_777_777)


def trained_drafter(cfg: SdBenchConfig, folder: Path, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
                    ) -> tuple[EagleDrafter, dict]:
    """An EAGLE drafter trained on the policy's own outputs, cached next to the policy by its settings."""
    settings = {"policy": folder.name, "prompts": cfg.drafter_prompts, "steps": cfg.drafter_steps,
                "batch": cfg.drafter_batch, "lr": cfg.drafter_lr, "max_new_tokens": cfg.max_new_tokens,
                "seed": cfg.seed}

    def train() -> tuple[EagleDrafter, dict]:
        requests = drafter_requests(cfg, folder, tokenizer)
        started = time.perf_counter()
        batches = drafter_data(policy, requests, cfg.drafter_batch)
        torch.manual_seed(cfg.seed)
        drafter = EagleDrafter(drafter_config_from_target(policy.config))
        drafter.bind_policy(policy)
        losses = train_drafter_steps(drafter, batches, cfg.drafter_steps, cfg.drafter_lr)
        held = drafter_data(policy, requests[: cfg.drafter_batch], cfg.drafter_batch)[0]
        with torch.no_grad():
            pred = drafter(held.input_ids, held.features, held.position_ids)
            agree = (drafter.logits(pred).argmax(-1) == drafter.logits(held.target).argmax(-1)) & held.mask
        return drafter, {"train_seconds": time.perf_counter() - started, "loss_first": losses[0],
                         "loss_last": losses[-1],
                         "train_top1_agreement": agree.sum().item() / max(held.mask.sum().item(), 1)}

    return cached_drafter(folder, "bench-drafter", settings, train, lambda path: load_drafter(path, policy))


def trained_block_drafter(cfg: SdBenchConfig, folder: Path, policy: PreTrainedModel,
                          tokenizer: PreTrainedTokenizerBase) -> tuple[BlockDrafter, dict]:
    """A block drafter of block size max(cfg.block_depths) and `cfg.block_layers` layers, trained like the EAGLE
    drafter (the same prompts, steps, batch, learning rate); info has its per-offset agreement on a held-out batch."""
    block, layers = max(cfg.block_depths), cfg.block_layers
    settings = {"policy": folder.name, "prompts": cfg.drafter_prompts, "steps": cfg.drafter_steps,
                "batch": cfg.drafter_batch, "lr": cfg.drafter_lr, "max_new_tokens": cfg.max_new_tokens,
                "seed": cfg.seed, "block_size": block, "layers": layers}

    def train() -> tuple[BlockDrafter, dict]:
        requests = drafter_requests(cfg, folder, tokenizer)
        started = time.perf_counter()
        batches = [block_batch(b, block) for b in drafter_data(policy, requests, cfg.drafter_batch)]
        torch.manual_seed(cfg.seed)
        drafter = new_block_drafter(policy, block, layers)
        losses = BlockTraining(drafter, batches, cfg.drafter_lr).train(cfg.drafter_steps)
        held = block_batch(drafter_data(policy, requests[: cfg.drafter_batch], cfg.drafter_batch)[0], block)
        return drafter, {"train_seconds": time.perf_counter() - started, "loss_first": losses[0],
                         "loss_last": losses[-1], "train_agreement_by_offset": block_agreement(drafter, held)}

    return cached_drafter(folder, "bench-block-drafter", settings, train,
                          lambda path: load_block_drafter(path, policy))
