"""The EAGLE drafter the benches start from: trained for a fixed budget on the warm-started policy's own
samples at T=1 (the step-0 distribution), cached beside the policy by its settings. Shared by `tlt bench
engine --part sd` and the workloads' `drafterWarmstart` (`tlt.bench.run`); the sd part's block drafter
(`tlt.bench.bench_block_drafter`) trains on the same samples."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.bench.drafter_cache import cached_drafter
from tlt.drafter.evaluate import make_requests
from tlt.drafter.objective import DrafterBatch, drafter_inputs, train_drafter_steps
from tlt.models.drafter import EagleDrafter, drafter_config_from_target, load_drafter
from tlt.models.feature_layers import wide_features
from tlt.progress import phase
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request
from tlt.tasks.countdown import CountdownTask, generate
from tlt.tasks.warmstart import load_metadata


@dataclass(frozen=True)
class DrafterBudget:
    """How the bench drafter is trained: drafter_prompts task prompts sampled at T=1 up to max_new_tokens,
    drafter_steps steps of drafter_batch sequences at drafter_lr, seeded by seed."""

    max_new_tokens: int
    drafter_prompts: int
    drafter_steps: int
    drafter_batch: int
    drafter_lr: float
    seed: int


def countdown_task(folder: Path) -> CountdownTask:
    return CountdownTask(**load_metadata(folder)["config"]["task"])


def sample_context(policy: PreTrainedModel, requests: list[Request]) -> int:
    longest = max(len(r.prompt_ids) + r.params.max_new_tokens for r in requests)
    return min(policy.config.max_position_embeddings, longest + 32)


def drafter_data(
    policy: PreTrainedModel, requests: list[Request], batch: int, feature_layers: tuple[int, ...] = ()
) -> list[DrafterBatch]:
    """The policy's own samples as aligned drafter batches (response positions only); the features wide
    (`tlt.models.feature_layers`) when `feature_layers` are given."""
    engine = Engine(policy, max_batch_size=64, max_context=sample_context(policy, requests), return_hidden=False)
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
        hidden = wide_features(policy, tokens, valid, feature_layers)
        out.append(drafter_inputs(tokens, hidden, mask))
    return out


def drafter_requests(cfg: DrafterBudget, folder: Path, tokenizer: PreTrainedTokenizerBase) -> list[Request]:
    """The warm-start prompts: `drafter_prompts` task prompts other than the timed ones, sampled at T=1."""
    problems = generate(cfg.drafter_prompts, cfg.seed + 7_777_777, countdown_task(folder))
    return make_requests(
        tokenizer, problems, max_new_tokens=cfg.max_new_tokens, temperature=1.0, seed=cfg.seed + 7_777_777
    )


def own_samples(
    policy: PreTrainedModel, requests: list[Request], batch: int, feature_layers: tuple[int, ...] = ()
) -> list[DrafterBatch]:
    """`drafter_data` under the progress line of the drafter warm start."""
    with phase("drafter warm start: the policy's own samples", len(requests), "prompts") as update:
        batches = drafter_data(policy, requests, batch, feature_layers)
        update(len(requests))
    return batches


def trained_drafter(
    cfg: DrafterBudget, folder: Path, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[EagleDrafter, dict]:
    """An EAGLE drafter trained on the policy's own outputs, cached next to the policy by its settings."""
    settings = {
        "policy": folder.name,
        "prompts": cfg.drafter_prompts,
        "steps": cfg.drafter_steps,
        "batch": cfg.drafter_batch,
        "lr": cfg.drafter_lr,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
    }

    def train() -> tuple[EagleDrafter, dict]:
        requests = drafter_requests(cfg, folder, tokenizer)
        started = time.perf_counter()
        batches = own_samples(policy, requests, cfg.drafter_batch)
        torch.manual_seed(cfg.seed)
        drafter = EagleDrafter(drafter_config_from_target(policy.config))
        drafter.bind_policy(policy)
        with phase("drafter warm start: training", cfg.drafter_steps) as update:
            losses = train_drafter_steps(
                drafter, batches, cfg.drafter_steps, cfg.drafter_lr, lambda step, loss: update(step, f"loss {loss:.3f}")
            )
        held = drafter_data(policy, requests[: cfg.drafter_batch], cfg.drafter_batch)[0]
        with torch.no_grad():
            pred = drafter(held.input_ids, held.features, held.position_ids)
            agree = (drafter.logits(pred).argmax(-1) == drafter.logits(held.target).argmax(-1)) & held.mask
        return drafter, {
            "train_seconds": time.perf_counter() - started,
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "train_top1_agreement": agree.sum().item() / max(held.mask.sum().item(), 1),
        }

    return cached_drafter(folder, "bench-drafter", settings, train, lambda path: load_drafter(path, policy))
