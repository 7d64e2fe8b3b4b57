"""`tlt bench update`: the GRPO policy update with and without a separate pass that recomputes the old
log-probs, on one step's responses of a workload's warm-started policy, in interleaved pairs.

"recompute" is the update's earlier form (a no-grad forward over every micro-batch for the old
log-probs, then the update); "first-pass" takes them from the update's own first forward
(`policy_update(old_from_first_pass=True)`, what `rl_step.learn` does now). Both start every pair from the
same weights and a fresh optimizer; timings are wall seconds in this process at `threads` torch threads
(the coordinator's on a 2-core machine)."""

from __future__ import annotations

import copy
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from tlt.bench.run import variant_run
from tlt.bench.workload import DEFAULT_WORKLOAD, load_workload
from tlt.rollout.engine import Engine
from tlt.runtime import rl_step
from tlt.tasks.countdown import generate
from tlt.tasks.warmstart import load_policy, warm_start

MODES = ("recompute", "first-pass")


def _update(
    mode: str, policy: torch.nn.Module, completions: list, rewards: torch.Tensor, algo: Any, pad_id: int
) -> float:
    """Seconds of one step's learning in `mode` on a copy of `policy` with a fresh AdamW."""
    model = copy.deepcopy(policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=algo.learning_rate)
    started = time.perf_counter()
    if mode == "recompute":
        batch = rl_step.build_batch(completions, rewards)
        batch.old_logprobs = rl_step.policy_logprobs(model, batch, algo, pad_id=pad_id)
        rl_step.update_policy(model, optimizer, batch, algo, pad_id=pad_id)
    else:
        rl_step.learn(model, optimizer, completions, rewards, algo, pad_id=pad_id)
    return time.perf_counter() - started


def run_update_bench(
    workload_path: Path = DEFAULT_WORKLOAD, *, pairs: int = 5, threads: int = 2, seed: int = 0
) -> dict[str, Any]:
    """Time `pairs` interleaved (recompute, first-pass) updates on one step of the workload: its
    prompts_per_step problems x group_size samples at its temperature, from its warm-started policy.
    Returns seconds per mode, the ratio recompute / first-pass per pair (median, min, max) and the load."""
    if pairs < 1:
        raise ValueError(f"--pairs must be >= 1, got {pairs}")
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    workload = load_workload(workload_path)
    algo = variant_run(workload, "vanilla", 0).spec.algorithm
    policy, tokenizer = load_policy(warm_start(workload.warmstart))
    problems = generate(algo.prompts_per_step, seed=seed, task=workload.warmstart.task)
    engine = Engine(
        copy.deepcopy(policy).eval(),
        max_batch_size=algo.prompts_per_step * algo.group_size,
        max_context=min(workload.spec["model"]["maxContext"], policy.config.max_position_embeddings),
        return_hidden=False,
    )
    completions = engine.generate(rl_step.make_requests(problems, list(range(len(problems))), tokenizer, algo, 1))
    rewards = torch.rand(algo.prompts_per_step, algo.group_size, generator=torch.Generator().manual_seed(seed))
    before = list(os.getloadavg())
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(pairs):
        for mode in MODES:
            seconds[mode].append(_update(mode, policy, completions, rewards, algo, tokenizer.pad_token_id))
    ratios = [a / b for a, b in zip(seconds["recompute"], seconds["first-pass"])]
    return {
        "workload": workload.name,
        "workload_sha256": workload.sha256,
        "threads": threads,
        "responses": len(completions),
        "response_tokens": sum(len(c.token_ids) for c in completions),
        "seconds": seconds,
        "recompute_over_first_pass": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "load_average": {"before": before, "after": list(os.getloadavg())},
    }
