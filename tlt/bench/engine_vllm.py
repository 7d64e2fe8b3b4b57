"""`tlt bench engine --part vllm`: this engine against vLLM on one policy, greedy (whether the built-in
engine holds its own against vLLM; docs/vllm.md has the whole picture).

The workload's warm-started policy and warm drafter, one prompt stream, `algorithm.maxNewTokens`, stop at
eos, temperature 0. Variants, each engine built once: vllm-plain-eager / vllm-plain-compiled (vLLM without
SD, eager and its default compiled mode; at each batch the faster is the reference of the ratios; a
compiled mode that fails to start is recorded and skipped), vllm-eagle (vLLM's EAGLE with the warm drafter
exported, drafting the deepest chain arm's length), from one more EAGLE engine started with vLLM's dynamic
table: vllm-fixed-k<K> (K drafts at every batch size, one variant per EAGLE arm depth) and vllm-dynamic
(TLT's threshold and buckets as the table, each bucket's depth chosen by a bandit between calls, kept per
batch size as tlt-adaptive keeps its own; `tlt.workers.vllm_speculation`), tlt-plain (`tlt.rollout.engine.Engine`), and
tlt-adaptive: TLT's adaptive SD exactly as `RolloutWorker` builds it, `rollout_stepper` afresh per generate
call on the workload's `tlt` spec, compile as `rollout.compile` resolves, `warm_up` first. Its bandit and
history store are KEPT across the untimed warm-up round and the timed rounds of one batch size, as a worker
keeps them across RL steps; finished waves enter the store after each call, off the clock.

One untimed warm-up round, then `repeats` timed ones; in each, every batch size runs every variant (order
rotated per round). Each round draws its own held-out prompts, so a kept history store never holds the
greedy answers it is asked for again. At running batch B a round's requests run in groups of exactly B,
one `generate` call per group, the same groups for every variant; tokens/s = generated tokens / wall
seconds of those calls. vLLM runs inside this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set), on
the same torch threads as this engine. Every variant's greedy token ids are compared with tlt-plain's.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tlt.adaptive.arms import chain_depths
from tlt.bench.bench_drafter import countdown_task
from tlt.bench.vllm_compare import (
    DYNAMIC_GOAL,
    GOAL,
    Row,
    Runner,
    requests_per_batch,
    summarize,
    variant_order,
)
from tlt.bench.vllm_runners import adaptive_runner, plain_runner, table_runners, vllm_runner
from tlt.drafter.evaluate import make_requests
from tlt.drafter.export import export_eagle
from tlt.models.drafter import load_drafter
from tlt.models.loading import load_policy
from tlt.rollout.compiled import resolve_compile
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request
from tlt.rollout.vllm.availability import require_vllm
from tlt.rollout.warmup import warm_up
from tlt.tasks.countdown import generate
from tlt.tasks.datasets import EVAL_SEED_OFFSET
from tlt.tasks.warmstart import warm_start

log = logging.getLogger(__name__)

DEFAULT_WORKLOAD = Path(__file__).resolve().parents[2] / "bench" / "workload-vllm-v1.yaml"


@dataclass(frozen=True)
class VllmBenchConfig:
    """workload: a `tlt bench run` workload file (policy, warm drafter, spec); quick_workload: apply its
    `quick` overrides; min_prompts: requests per batch size and round (at least the batch size);
    compiled_vllm: also try vLLM's compiled mode; memory_fraction, kv_cache_bytes: `VllmEngine`'s (None:
    four times what the largest batch needs at full context)."""

    workload: str = str(DEFAULT_WORKLOAD)
    quick_workload: bool = False
    batches: tuple[int, ...] = (1, 4, 16, 32)
    min_prompts: int = 32
    repeats: int = 3
    threads: int = 2
    compiled_vllm: bool = True
    memory_fraction: float = 0.2
    kv_cache_bytes: int | None = None

    @classmethod
    def quick(cls, repeats: int = 1) -> VllmBenchConfig:
        return cls(quick_workload=True, batches=(1, 4), min_prompts=4, repeats=repeats)


def _tlt_engines(
    policy: Any, batches: tuple[int, ...], context: int, compiled: bool, drafter: Any, depths: list[int]
) -> tuple[dict[str, dict[int, Engine]], dict[str, float]]:
    """{"tlt-plain" / "tlt-adaptive": {batch: engine}}, warmed up (compiled graphs built); their start seconds."""
    engines: dict[str, dict[int, Engine]] = {}
    seconds: dict[str, float] = {}
    for name, adaptive in (("tlt-plain", False), ("tlt-adaptive", True)):
        started = time.perf_counter()
        engines[name] = {
            b: Engine(policy, max_batch_size=b, max_context=context, return_hidden=adaptive, compile=compiled)
            for b in batches
        }
        for engine in engines[name].values():
            warm_up(engine, drafter if adaptive else None, chain_depths=depths if adaptive else ())
        seconds[name] = time.perf_counter() - started
    return engines, seconds


def _kv_cache_bytes(config: Any, rows: int, context: int, dtype: torch.dtype) -> int:
    """Four times the KV bytes of `rows` full-context rows over the policy's layers and a drafter layer."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = (config.num_hidden_layers + 1) * 2 * config.num_key_value_heads * head_dim * dtype.itemsize
    return max(64 * 2**20, 4 * rows * context * per_token)


def _threads_record(threads: int, preload: str | None) -> dict[str, Any]:
    """What set the threads: torch's before and after vLLM started, the vLLM and OpenMP variables."""
    keys = (
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_NUM_OF_RESERVED_CPU",
        "OMP_NUM_THREADS",
    )
    in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    return {
        "torch_threads": threads,
        "torch_threads_after_vllm_start": torch.get_num_threads(),
        "vllm_runs": "in this process, on the same torch threads"
        if in_process
        else "in its own processes, threads bound by VLLM_CPU_OMP_THREADS_BIND",
        "env": {k: os.environ.get(k) for k in keys},
        "LD_PRELOAD_at_start": preload,
    }


def run_vllm_bench(cfg: VllmBenchConfig, on_row: Callable[[str], None] | None = None) -> dict[str, Any]:
    """{"vllm": config, engines, rows per (variant, batch); "tlt_vs_vllm_plain", "vllm_eagle_vs_plain" (and
    their "_range"), "vllm_plain_reference", "goal_met": per batch; "load_average": before / after}."""
    require_vllm()
    import vllm

    from tlt.bench.run import _load_average, variant_run
    from tlt.bench.workload import load_workload, warm_drafter
    from tlt.rollout.vllm.vllm_engine import EagleSetup, VllmEngine
    from tlt.workers.vllm_speculation import VllmSpeculation, depth_choices

    note = on_row or (lambda text: log.info("%s", text))
    load = {"before": _load_average()}
    preload = os.environ.get("LD_PRELOAD")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    torch.set_num_threads(cfg.threads)  # a no-op (vLLM's) where a vLLM engine started in this process before
    threads_set = torch.get_num_threads()
    workload = load_workload(Path(cfg.workload), quick=cfg.quick_workload)
    note("building (or finding) the warm start and its drafter")
    drafter_path, drafter_info = warm_drafter(workload)
    if drafter_path is None:
        raise ValueError(f"{cfg.workload}: the vllm part needs the workload's drafterWarmstart (it has none)")
    spec = variant_run(workload, "tlt", 0, drafter_path).spec
    if spec.dataset.source != "builtin":
        raise ValueError(
            f"{cfg.workload}: the vllm part draws held-out prompts from the builtin task; "
            f"dataset.source is {spec.dataset.source!r}"
        )
    folder = warm_start(workload.warmstart)
    policy, tokenizer = load_policy(folder, spec.model.dtype)
    drafter = load_drafter(drafter_path, policy).to(policy.dtype).eval()
    context = min(spec.model.max_context, policy.config.max_position_embeddings)
    depth = max(a.depth for a in spec.speculative.arms if a.kind == "chain")
    compiled = resolve_compile(spec.rollout.compile, policy)
    sizes = {b: requests_per_batch(b, cfg.min_prompts) for b in cfg.batches}
    per_round = max(sizes.values())
    problems = generate(
        per_round * (cfg.repeats + 1), spec.dataset.builtin.seed + EVAL_SEED_OFFSET, countdown_task(folder)
    )
    rounds = [
        make_requests(
            tokenizer,
            problems[r * per_round : (r + 1) * per_round],
            temperature=0.0,
            max_new_tokens=spec.algorithm.max_new_tokens,
            seed=spec.algorithm.seed,
        )
        for r in range(cfg.repeats + 1)
    ]

    note("starting this engine (plain and adaptive, every batch size)")
    engines, start_seconds = _tlt_engines(
        policy, cfg.batches, context, compiled, drafter, chain_depths(spec.speculative)
    )
    runners: dict[str, Runner] = {
        "tlt-plain": plain_runner(engines["tlt-plain"]),
        "tlt-adaptive": adaptive_runner(spec, engines["tlt-adaptive"], drafter),
    }
    kv_bytes = cfg.kv_cache_bytes or _kv_cache_bytes(policy.config, max(cfg.batches), context, policy.dtype)
    common = dict(
        dtype=spec.model.dtype,
        max_context=context,
        max_batch_size=max(cfg.batches),
        seed=spec.algorithm.seed,
        memory_fraction=cfg.memory_fraction,
        kv_cache_bytes=kv_bytes,
    )
    depths = [k for k in depth_choices(spec.speculative) if k > 0]
    with tempfile.TemporaryDirectory(prefix="tlt-bench-vllm-") as tmp:
        exported = str(export_eagle(drafter_path, folder, Path(tmp) / "eagle").path)
        eagle = {"eagle": EagleSetup(exported, depth)}
        compiled_error = _start_vllm(cfg, folder, common, eagle, runners, start_seconds, note)
        note("starting vllm-table (vllm-fixed-k*, vllm-dynamic)")
        started = time.perf_counter()
        table = tuple(VllmSpeculation(spec.speculative, spec.drafter.health, max(cfg.batches), 0).start_table())
        table_engine = VllmEngine(folder, **common, eagle=EagleSetup(exported, max(depths), table=table))
        runners.update(table_runners(table_engine, spec, depths, cfg.batches))
        start_seconds["vllm-table"] = time.perf_counter() - started
        threads = _threads_record(threads_set, preload)
        rows = _run_rounds(runners, rounds, sizes, cfg.batches, note)
    note("timing the drafter features' policy forward over vllm-dynamic's responses")
    features = feature_forward_cost(policy, rounds, rows, sizes, max(cfg.batches))
    load["after"] = _load_average()
    info = {
        "config": asdict(cfg),
        "workload": {
            "path": str(workload.path),
            "sha256": workload.sha256,
            "name": workload.name,
            "quick": workload.quick,
        },
        "policy": {
            "folder": str(folder),
            "params": sum(p.numel() for p in policy.parameters()),
            "dtype": spec.model.dtype,
            "context": context,
            "max_new_tokens": spec.algorithm.max_new_tokens,
        },
        "drafter": {**(drafter_info or {}), "path": str(drafter_path), "vllm_draft_tokens": depth},
        "vllm_fixed_depths": depths,
        "feature_forward": features,
        "tlt_compile": compiled,
        "vllm_compiled_error": compiled_error,
        "threads": threads,
        "kv_cache_bytes": kv_bytes,
        "start_seconds": start_seconds,
        "requests_per_round": sizes,
        "goal": GOAL,
        "dynamic_goal": DYNAMIC_GOAL,
        "versions": {"torch": torch.__version__, "vllm": vllm.__version__},
    }
    return summarize(info, rows, cfg.batches, load)


def _start_vllm(
    cfg: VllmBenchConfig,
    folder: Path,
    common: dict[str, Any],
    eagle: dict[str, Any],
    runners: dict[str, Runner],
    start_seconds: dict[str, float],
    note: Callable[[str], None],
) -> str | None:
    """Start the vLLM variants into `runners` (their start seconds into `start_seconds`); returns why the
    compiled mode did not start, or None. Only the compiled mode may fail without failing the run."""
    from tlt.rollout.vllm.vllm_engine import VllmEngine

    compiled_error = None if cfg.compiled_vllm else "not tried (compiled_vllm is False)"
    starts = [("vllm-plain-eager", {}), ("vllm-plain-compiled", {"enforce_eager": False}), ("vllm-eagle", eagle)]
    for name, extra in [(n, e) for n, e in starts if cfg.compiled_vllm or n != "vllm-plain-compiled"]:
        note(f"starting {name}")
        started = time.perf_counter()
        try:
            runners[name] = vllm_runner(VllmEngine(folder, **common, **extra))
        except Exception as exc:  # noqa: BLE001 -- recorded as the result of trying the compiled mode
            if name != "vllm-plain-compiled":
                raise
            compiled_error = f"{type(exc).__name__}: {exc}"
            log.warning("vLLM's compiled mode did not start, eager alone runs: %s", compiled_error)
            continue
        start_seconds[name] = time.perf_counter() - started
    return compiled_error


def feature_forward_cost(
    policy: Any, rounds: list[list[Request]], rows: dict[tuple[str, int], Row], sizes: dict[int, int], batch: int
) -> dict[str, Any]:
    """What the vLLM worker pays for the drafter's features (vLLM keeps its hidden states, so the worker runs
    its own policy copy over each finished response, `tlt.workers.vllm_rollout.with_features`): seconds of
    that forward over vllm-dynamic's responses of each timed round at `batch`, beside that round's generate
    seconds."""
    from tlt.rollout.types import Completion
    from tlt.workers.vllm_rollout import with_features

    row = rows["vllm-dynamic", batch]
    seconds = []
    for r, requests in enumerate(rounds[1:], start=1):
        outputs = row.outputs[r]
        started = time.perf_counter()
        for request, tokens in zip(requests[: sizes[batch]], outputs):
            with_features(policy, Completion(request.request_id, list(request.prompt_ids), tokens, None, None, "stop"))
        seconds.append(time.perf_counter() - started)
    ratios = [f / g for f, g in zip(seconds, row.seconds)]
    return {
        "batch": batch,
        "seconds": seconds,
        "generate_seconds": row.seconds,
        "over_generate": statistics.median(ratios),
        "over_generate_range": [min(ratios), max(ratios)],
    }


def _run_rounds(
    runners: dict[str, Runner],
    rounds: list[list[Request]],
    sizes: dict[int, int],
    batches: tuple[int, ...],
    note: Callable[[str], None],
) -> dict[tuple[str, int], Row]:
    """Round 0 untimed, then the timed ones; each round every batch size, every variant (order rotated)."""
    from tlt.bench.run import repeat_order

    names = variant_order(list(runners))
    rows = {(v, b): Row(v, b, sizes[b] // b) for b in batches for v in names}
    for r, requests in enumerate(rounds):
        for b in batches:
            groups = [requests[i : i + b] for i in range(0, sizes[b], b)]
            for name in repeat_order(names, r):
                note(f"round {r}/{len(rounds) - 1}{' (warm-up)' if r == 0 else ''}: {name} at batch {b}")
                calls = [runners[name](b, group) for group in groups]
                row = rows[name, b]
                row.outputs.append([ids for call in calls for ids in call.outputs])
                if r > 0:
                    row.tokens.append(sum(len(ids) for ids in row.outputs[-1]))
                    row.seconds.append(sum(call.seconds for call in calls))
                    row.sd_rows += sum(call.sd_rows for call in calls)
                    row.accepted += sum(call.accepted for call in calls)
                    row.arms.update(sum((call.arms for call in calls), Counter()))
    return rows
