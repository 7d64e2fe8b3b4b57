"""`tlt bench worker`: one rollout worker alone, vanilla against tlt, shard by shard, interleaved.

What a `tlt bench run` workload's rollout speed-up is without the rest of the Ray run (the other
worker, its spot trainer, the coordinator, the verifiers): per variant, one `RolloutWorker` in this
process, built from the workload's `vanilla` / `tlt` spec as the bench run builds it, on the torch
threads a Ray worker gets (1). Both take the same shards: the prompts of the run's first `shards`
steps that rollout worker 0 would get. The tlt worker drafts with the workload's warm drafter,
handed over as the coordinator hands it, and keeps its bandit and history store from shard to shard
as a worker does across steps. The policy stays fixed (no update): this measures the rollout engine.
Variants alternate shard by shard, the order flipped every shard. Verifiers are replaced by a no-op.

Reports per variant: seconds and decode steps per shard, decode seconds by running-batch range; and
tlt over vanilla: rollout speed-up (vanilla seconds / tlt seconds), steps ratio, seconds per decode
step ratio; and whether both produced the same tokens (T=1 sampling is coupled, so they should).
"""

from __future__ import annotations

import collections
import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tlt.rollout.step_split import StepSplit, seconds_by_range
from tlt.runtime import steps



@dataclass(frozen=True)
class WorkerBenchConfig:
    workload: Path
    shards: int = 8
    threads: int = 1
    quick: bool = False
    split: bool = False

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


class _NoScore:
    def remote(self, *args: Any, **kwargs: Any) -> None:
        return None


class _NoVerifier:
    score = _NoScore()


def run_worker_bench(cfg: WorkerBenchConfig) -> dict[str, Any]:
    """Run the bench (see the module docstring); the result as a JSON-able dict."""
    from tlt.bench.run import _load_average, load_workload, variant_run, warm_drafter
    from tlt.models.drafter import load_drafter
    from tlt.models.loading import load_policy
    from tlt.runtime.steps import shards
    from tlt.runtime.ray_workers import RolloutWorker
    from tlt.tasks.datasets import load_problems
    from tlt.tasks.warmstart import warm_start

    workload = load_workload(cfg.workload, quick=cfg.quick)
    load_before = _load_average()
    threads_before = torch.get_num_threads()
    drafter_path, _ = warm_drafter(workload)
    folder = warm_start(workload.warmstart)
    runs = {v: variant_run(workload, v, 0, drafter_path) for v in ("vanilla", "tlt")}
    spec = runs["tlt"].spec
    algo = spec.algorithm
    rows = math.ceil(algo.prompts_per_step / max(spec.rollout.replicas, 1)) * algo.group_size  # as create_actors
    try:
        workers = {v: RolloutWorker(0, run.spec, str(folder), rows, [_NoVerifier()], None, threads=cfg.threads)
                   for v, run in runs.items()}
        policy = load_policy(str(folder), spec.model.dtype)[0]
        weights = {k: v.detach() for k, v in policy.state_dict().items()}
        drafter = None
        if drafter_path is not None:
            drafter = (0, {k: v.detach().clone() for k, v in load_drafter(drafter_path, policy.config).state_dict().items()})
        problems = load_problems(spec.dataset, "train")
        split = StepSplit() if cfg.split else None
        per: dict[str, dict[str, list]] = {v: {"seconds": [], "steps": [], "tokens": []} for v in workers}
        by_running: dict[str, collections.Counter] = {v: collections.Counter() for v in workers}
        steps_by_running: dict[str, collections.Counter] = {v: collections.Counter() for v in workers}
        tokens: dict[str, list[list[int]]] = {v: [] for v in workers}
        for step in range(1, cfg.shards + 1):
            ids = shards(steps.select_prompts(len(problems), algo.prompts_per_step, algo.seed, step),
                         spec.rollout.replicas)[0]
            for v in (("vanilla", "tlt") if step % 2 else ("tlt", "vanilla")):
                worker = workers[v]
                started = time.perf_counter()
                with split if split is not None else contextlib.nullcontext():
                    if split is not None:
                        split.label = f"{v}/"
                    result = worker.rollout(step, ids, [problems[i] for i in ids], weights,
                                            drafter if v == "tlt" else None)
                per[v]["seconds"].append(time.perf_counter() - started)
                trace = steps.RolloutTrace(steps=list(result["trace"]))
                per[v]["steps"].append(len(result["trace"]))
                per[v]["tokens"].append(sum(len(c.token_ids) for c in result["completions"]))
                by_running[v].update(trace.decode_seconds_by_running())
                steps_by_running[v].update(trace.decode_steps_by_running())
                tokens[v].extend(list(c.token_ids) for c in result["completions"])
                worker.agreement()  # the bookkeeping a worker does before its next rollout
    finally:
        torch.set_num_threads(threads_before)
    total = {v: sum(per[v]["seconds"]) for v in per}
    n_steps = {v: sum(per[v]["steps"]) for v in per}
    mismatched = sum(a != b for a, b in zip(tokens["vanilla"], tokens["tlt"]))
    return {
        "workload": {"path": str(cfg.workload), "name": workload.name, "quick": cfg.quick},
        "config": {"shards": cfg.shards, "threads": cfg.threads, "rows": rows},
        "variants": {v: {**per[v], "seconds_total": total[v], "steps_total": n_steps[v],
                         "decode_seconds_by_running": seconds_by_range(dict(by_running[v])),
                         "decode_steps_by_running": seconds_by_range(dict(steps_by_running[v]))} for v in per},
        "rollout_speedup": total["vanilla"] / total["tlt"],
        "steps_ratio": n_steps["tlt"] / n_steps["vanilla"],
        "step_cost_ratio": (total["tlt"] / n_steps["tlt"]) / (total["vanilla"] / n_steps["vanilla"]),
        "mismatched_responses": mismatched,
        "load_average": {"before": load_before, "after": _load_average()},
        **({"step_split": split.table()} if split is not None else {}),
    }
