"""`tlt bench worker`: one rollout worker alone, vanilla against tlt, shard by shard, interleaved.

What a `tlt bench run` workload's rollout speed-up is without the rest of the Ray run (the other
worker, its spot trainer, the coordinator, the verifiers): per variant, one `RolloutWorker` in this
process, built from the workload's `vanilla` / `tlt` spec as the bench run builds it, on the torch
threads a Ray worker gets (1). Both take the same shards: the prompts of the run's first `shards`
steps that rollout worker 0 would get. The tlt worker drafts with the workload's warm drafter,
handed over as the coordinator hands it, and keeps its bandit and history store from shard to shard
as a worker does across rl_step. The policy stays fixed (no update): this measures the rollout engine.
Variants alternate shard by shard, the order flipped every shard. Verifiers are replaced by a no-op.
Device: the workload's `rollout.resources.gpus` >= 1 puts both workers on `cuda:0` (refused, naming the field,
without one); Ray is not needed (a GPU image without it runs this bench).
`repeats` times over, each with fresh workers: the bandit's choices follow measured step times, so two
repeats of the same shards take different arm paths (measured: 1.09x and 1.21x in two runs of one
repeat each), and one repeat says little.

Reports per variant (pooled over repeats): seconds and decode steps per shard, decode seconds by
running-batch range; tlt over vanilla per repeat: rollout speed-up (vanilla seconds / tlt seconds),
steps ratio, seconds per decode step ratio, and their medians (the speed-up's range too); and whether
both produced the same tokens (T=1 sampling is coupled, so they should).
"""

from __future__ import annotations

import collections
import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tlt.bench.run_summary import per_token_speedup
from tlt.rollout.step_timing import StepSplit, seconds_by_range
from tlt.runtime import rl_step


@dataclass(frozen=True)
class WorkerBenchConfig:
    workload: Path
    shards: int = 8
    threads: int = 1
    quick: bool = False
    split: bool = False
    repeats: int = 3

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


class _NoScore:
    def remote(self, *args: Any, **kwargs: Any) -> None:
        return None


class _NoVerifier:
    score = _NoScore()


def run_worker_bench(
    cfg: WorkerBenchConfig, on_repeat: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Run the bench (see the module docstring); the result as a JSON-able dict. `on_repeat` gets the result so
    far after every repeat (`repeats_done` of `config.repeats`): a run cut short keeps its finished repeats."""
    from tlt.bench.run import _load_average, check_devices, variant_run
    from tlt.bench.workload import load_workload, warm_drafter
    from tlt.models.drafter import load_drafter
    from tlt.models.loading import load_policy
    from tlt.tasks.datasets import load_problems
    from tlt.tasks.warmstart import warm_start

    workload = load_workload(cfg.workload, quick=cfg.quick)
    check_devices(workload)
    load_before = _load_average()
    threads_before = torch.get_num_threads()
    drafter_path, _ = warm_drafter(workload)
    folder = warm_start(workload.warmstart)
    runs = {v: variant_run(workload, v, 0, drafter_path) for v in ("vanilla", "tlt")}
    spec = runs["tlt"].spec
    algo = spec.algorithm
    rows = math.ceil(algo.prompts_per_step / max(spec.rollout.replicas, 1)) * algo.group_size  # as create_actors
    policy = load_policy(str(folder), spec.model.dtype)[0]
    weights = {k: v.detach() for k, v in policy.state_dict().items()}
    drafter = None
    if drafter_path is not None:
        drafter = (
            0,
            {k: v.detach().clone() for k, v in load_drafter(drafter_path, policy.config).state_dict().items()},
        )
    problems = load_problems(spec.dataset, "train")
    split = StepSplit() if cfg.split else None
    device = torch.device("cuda", 0) if spec.rollout.resources.gpus > 0 else torch.device("cpu")
    inputs = _Inputs(runs, str(folder), rows, weights, drafter, problems, split, device)
    repeats: list[dict[str, dict[str, Any]]] = []
    try:
        for r in range(cfg.repeats):
            repeats.append(_repeat(cfg, inputs, r))
            if on_repeat is not None:
                on_repeat(_result(cfg, workload.name, inputs, repeats, load_before))
    finally:
        torch.set_num_threads(threads_before)
    return _result(cfg, workload.name, inputs, repeats, load_before)


def _result(
    cfg: WorkerBenchConfig,
    name: str,
    inputs: _Inputs,
    repeats: list[dict[str, dict[str, Any]]],
    load_before: list[float],
) -> dict[str, Any]:
    """The bench's result over the repeats done so far."""
    from tlt.bench.run import _load_average

    variants = {v: _pooled([rep[v] for rep in repeats]) for v in ("vanilla", "tlt")}
    ratios = [_ratios(rep) for rep in repeats]
    speedups = sorted(r["rollout_speedup"] for r in ratios)
    tokens = {v: [t for rep in repeats for t in rep[v]["token_ids"]] for v in variants}
    return {
        "workload": {"path": str(cfg.workload), "name": name, "quick": cfg.quick},
        "config": {
            "shards": cfg.shards,
            "threads": cfg.threads,
            "rows": inputs.rows,
            "repeats": cfg.repeats,
            "device": str(inputs.device),
        },
        "repeats_done": len(repeats),
        "variants": variants,
        "rollout_speedup": statistics.median(speedups),
        "rollout_speedup_range": [speedups[0], speedups[-1]],
        "steps_ratio": statistics.median(r["steps_ratio"] for r in ratios),
        "step_cost_ratio": statistics.median(r["step_cost_ratio"] for r in ratios),
        "repeats": ratios,
        "mismatched_responses": sum(a != b for a, b in zip(tokens["vanilla"], tokens["tlt"])),
        "speedup_per_token_by_running": per_token_speedup(
            variants["vanilla"]["ms_per_token_by_running"], variants["tlt"]["ms_per_token_by_running"]
        ),
        "load_average": {"before": load_before, "after": _load_average()},
        **({"step_split": inputs.split.table()} if inputs.split is not None else {}),
    }


@dataclass(frozen=True)
class _Inputs:
    """What every repeat's workers take: the variants' runs, the policy folder and weights, the warm drafter."""

    runs: dict[str, Any]
    folder: str
    rows: int
    weights: dict[str, torch.Tensor]
    drafter: tuple[int, dict[str, torch.Tensor]] | None
    problems: list[Any]
    split: StepSplit | None
    device: torch.device


def _repeat(cfg: WorkerBenchConfig, inputs: _Inputs, repeat: int) -> dict[str, dict[str, Any]]:
    """One repeat: fresh workers (a new bandit and history store each), every shard run by both variants,
    the order flipped every shard and every repeat. Per variant: seconds, steps, tokens per shard, decode
    seconds and steps by running batch, every response's tokens."""
    from tlt.runtime.rl_step import shards
    from tlt.workers.rollout import RolloutWorker

    algo = inputs.runs["tlt"].spec.algorithm
    replicas = inputs.runs["tlt"].spec.rollout.replicas
    workers = {
        v: RolloutWorker(
            0, run.spec, inputs.folder, inputs.rows, [_NoVerifier()], None, threads=cfg.threads, device=inputs.device
        )
        for v, run in inputs.runs.items()
    }
    out: dict[str, dict[str, Any]] = {
        v: {
            "seconds": [],
            "steps": [],
            "tokens": [],
            "token_ids": [],
            "by_running": collections.Counter(),
            "steps_by_running": collections.Counter(),
            "tokens_by_running": collections.Counter(),
        }
        for v in workers
    }
    for step in range(1, cfg.shards + 1):
        ids = shards(rl_step.select_prompts(len(inputs.problems), algo.prompts_per_step, algo.seed, step), replicas)[0]
        for v in ("vanilla", "tlt") if (step + repeat) % 2 else ("tlt", "vanilla"):
            worker = workers[v]
            started = time.perf_counter()
            with inputs.split if inputs.split is not None else contextlib.nullcontext():
                if inputs.split is not None:
                    inputs.split.label = f"{v}/"
                result = worker.rollout(
                    step, ids, [inputs.problems[i] for i in ids], inputs.weights, inputs.drafter if v == "tlt" else None
                )
            out[v]["seconds"].append(time.perf_counter() - started)
            trace = rl_step.RolloutTrace(steps=list(result["trace"]))
            out[v]["steps"].append(len(result["trace"]))
            out[v]["tokens"].append(sum(len(c.token_ids) for c in result["completions"]))
            out[v]["by_running"].update(trace.decode_seconds_by_running())
            out[v]["steps_by_running"].update(trace.decode_steps_by_running())
            out[v]["tokens_by_running"].update(trace.decode_tokens_by_running())
            out[v]["token_ids"].extend(list(c.token_ids) for c in result["completions"])
            # The bookkeeping a worker does before its next rollout (buffer and agreement, history index),
            # finished here, so that no thread of one variant runs in the other's timed rollout (one process:
            # the GIL and the cores are shared). Measured without the history wait: the same within noise.
            worker.agreement()
            worker.wait_history_indexed()
    return out


def _pooled(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's shards over every repeat, with totals."""
    by_running: collections.Counter = collections.Counter()
    steps_by_running: collections.Counter = collections.Counter()
    tokens_by_running: collections.Counter = collections.Counter()
    for rep in reps:
        by_running.update(rep["by_running"])
        steps_by_running.update(rep["steps_by_running"])
        tokens_by_running.update(rep["tokens_by_running"])
    pooled = {k: [x for rep in reps for x in rep[k]] for k in ("seconds", "steps", "tokens")}
    seconds, tokens = seconds_by_range(dict(by_running)), seconds_by_range(dict(tokens_by_running))
    return {
        **pooled,
        "seconds_total": sum(pooled["seconds"]),
        "steps_total": sum(pooled["steps"]),
        "decode_seconds_by_running": seconds,
        "decode_steps_by_running": seconds_by_range(dict(steps_by_running)),
        "decode_tokens_by_running": tokens,
        # decode ms per token kept, by range (a drafting variant drains its rows at other times, so
        # seconds alone by range mix how many tokens each variant generated there)
        "ms_per_token_by_running": {k: 1e3 * seconds[k] / n for k, n in tokens.items() if n},
    }


def _ratios(rep: dict[str, dict[str, Any]]) -> dict[str, float]:
    """tlt over vanilla in one repeat: rollout speed-up, decode-step count ratio, seconds-per-step ratio."""
    seconds = {v: sum(rep[v]["seconds"]) for v in rep}
    n_steps = {v: sum(rep[v]["steps"]) for v in rep}
    return {
        "rollout_speedup": seconds["vanilla"] / seconds["tlt"],
        "steps_ratio": n_steps["tlt"] / n_steps["vanilla"],
        "step_cost_ratio": (seconds["tlt"] / n_steps["tlt"]) / (seconds["vanilla"] / n_steps["vanilla"]),
        "vanilla_seconds": seconds["vanilla"],
        "tlt_seconds": seconds["tlt"],
    }
