"""`tlt bench run`: the pinned RL workload (`bench/workload.yaml`; the earlier `bench/workload-reduced-v1.yaml`
also runs with `--workload`) under each SD variant, side by side.

Every variant is a real RL run through the project's trainer on Ray (`ray_trainer`, local cluster), with
the same policy, engine, dtype, threads, prompts and seeds; only its `speculative` section differs.
Repeats are interleaved (every variant once per round) and sums over all steps are compared by
median and range. After every step the variant's current drafter is measured at ONE fixed arm
on held-out prompts (accept length, bonus token included), so drafters compare on equal terms.
The verify cost curve of the same policy and its drafter step's cost (`tlt.bench.cost_timing`) give
the ideal SD speedup. Drift, after every step: the held-out KL(step 0 || step t) of every variant's
policy (`tlt.bench.drift`), and in the `frozenIn` variants (default: vanilla) the accept length of
the frozen warm-start drafter with the current policy (how much a drafter that never adapts loses).
Aggregation lives in `tlt.bench.run_summary`; this module runs things.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from tlt.bench.cost_timing import measure_costs, measure_drafter_costs
from tlt.bench.drift import policy_kl, response_batch
from tlt.bench.machine import machine_info, weights_sha256
from tlt.bench.run_summary import summarize
from tlt.bench.workload import Workload, merge_spec, warm_drafter
from tlt.drafter.drafter_set import BLOCK_SNAPSHOTS, member_params
from tlt.models.drafter import EagleDrafter, drafter_config_from_target, load_drafter
from tlt.models.loading import resolve_dtype
from tlt.rollout.compiled import resolve_compile
from tlt.rollout.drafting import EagleChainDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.speculative import SpeculativeStepper
from tlt.rollout.types import Request, SamplingParams
from tlt.runtime import rl_step
from tlt.runtime.devices import gpu_plan
from tlt.spec.plan import learns_drafters
from tlt.spec.run import RunSpec, TLTTrainingRun
from tlt.tasks.datasets import load_problems
from tlt.tasks.warmstart import load_policy, warm_start

if TYPE_CHECKING:  # Ray is imported where a run starts: `tlt bench worker` uses this module without it
    from tlt.runtime.trainer import Trainer

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def variant_run(workload: Workload, variant: str, repeat: int, drafter: Path | None = None) -> TLTTrainingRun:
    """The TLTTrainingRun of one variant (the common spec with the variant's overrides); a variant with
    a learned drafter (mode static / tlt) starts from `drafter` when given."""
    spec = merge_spec(workload.spec, workload.variants[variant])
    run = TLTTrainingRun.model_validate({"metadata": {"name": f"bench-{variant}-{repeat}"}, "spec": spec})
    if drafter is None or not learns_drafters(run.spec.speculative):
        return run
    spec = merge_spec(spec, {"speculative": {"drafterPath": str(drafter)}})
    return TLTTrainingRun.model_validate({"metadata": {"name": f"bench-{variant}-{repeat}"}, "spec": spec})


def heldout_requests(trainer: Trainer, workload: Workload) -> list[Request]:
    """The held-out prompts (eval split) as requests sampled at the workload's temperature, fixed seeds."""
    cfg = workload.heldout
    problems = load_problems(trainer.spec.dataset, "eval")[: cfg["prompts"]]
    stop = (trainer.tokenizer.eos_token_id,) if trainer.tokenizer.eos_token_id is not None else ()
    algo = trainer.spec.algorithm
    return [
        Request(
            f"heldout-{i}",
            trainer.tokenizer(p.prompt).input_ids,
            SamplingParams(
                algo.temperature, algo.top_p, cfg["maxNewTokens"], stop, rl_step.derive_seed("heldout", cfg["seed"], i)
            ),
        )
        for i, p in enumerate(problems)
    ]


@torch.inference_mode()
def accept_length(
    policy: PreTrainedModel, params: dict[str, torch.Tensor], requests: list[Request], depth: int
) -> float:
    """Accept length of the drafter with `params` on `policy` (a copy is used), one request at a time,
    at one EAGLE chain arm of `depth` drafts."""
    drafter = EagleDrafter(drafter_config_from_target(policy.config)).to(policy.dtype)
    drafter.load_state_dict({k: v.to(policy.dtype) for k, v in params.items()})
    drafter.bind_policy(policy)
    context = min(
        policy.config.max_position_embeddings,
        max(len(r.prompt_ids) + r.params.max_new_tokens for r in requests) + depth + 1,
    )
    engine = Engine(policy, max_batch_size=1, max_context=context, return_hidden=True)
    stepper = SpeculativeStepper(
        engine.runner, EagleChainDrafter(drafter, policy.get_input_embeddings(), depth, 1, context)
    )
    engine.stepper = stepper
    engine.generate(requests)
    return stepper.stats.accept_length


def heldout_accept_length(trainer: Trainer, workload: Workload) -> float | None:
    """Accept length of the run's current drafter (the one its next step drafts with: `drafter.publish`)
    with the current policy, at one fixed EAGLE chain arm, on held-out prompts (its EAGLE member, with block
    arms); None for a run without an EAGLE drafter."""
    if trainer.executor.actors is None or trainer.executor.actors.hub is None:
        return None
    import ray

    if trainer.spec.drafter.publish == "validated" and trainer.executor.served is not None:
        params = trainer.executor.served[1]
    else:
        _, params = ray.get(trainer.executor.actors.hub.pull.remote())
    params = member_params(params).get("eagle")  # a run with block arms holds a `DrafterSet`
    if params is None:  # block arms only: no EAGLE drafter to measure at the chain arm
        return None
    # on the CPU wherever the run trains: one request at a time, the same numbers on any machine
    policy = copy.deepcopy(trainer.policy).to("cpu", resolve_dtype(trainer.spec.model.dtype)).eval()
    return accept_length(policy, params, heldout_requests(trainer, workload), workload.heldout["depth"])


class DriftProbe:
    """Per step of one run: held-out KL(step 0 || step t), and (when `frozen` is given) the frozen
    drafter's held-out accept length with the current policy. The step-0 policy is the warm start."""

    def __init__(self, workload: Workload, frozen: Path | None) -> None:
        self.workload, self.frozen_path = workload, frozen
        self.reference: PreTrainedModel | None = None
        self.batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @torch.inference_mode()
    def __call__(self, trainer: Trainer) -> dict[str, float | None]:
        dtype = resolve_dtype(trainer.spec.model.dtype)
        requests = heldout_requests(trainer, self.workload)
        if self.reference is None:
            self.reference = load_policy(warm_start(self.workload.warmstart))[0].to(dtype).eval()
            context = min(
                self.reference.config.max_position_embeddings,
                max(len(r.prompt_ids) + r.params.max_new_tokens for r in requests) + 1,
            )
            engine = Engine(self.reference, max_batch_size=len(requests), max_context=context, return_hidden=False)
            self.batch = response_batch([(c.prompt_ids, c.token_ids) for c in engine.generate(requests)])
        policy = copy.deepcopy(trainer.policy).to("cpu", dtype).eval()  # the reference's device
        out: dict[str, float | None] = {
            "heldout_kl": policy_kl(self.reference, policy, *self.batch, trainer.spec.algorithm.temperature),
            "frozen_accept_length": None,
        }
        if self.frozen_path is not None:
            params = load_drafter(self.frozen_path, policy).state_dict()
            out["frozen_accept_length"] = accept_length(policy, params, requests, self.workload.heldout["depth"])
        return out


def run_variant(
    workload: Workload, variant: str, repeat: int, out_dir: Path, num_cpus: int, drafter: Path | None = None
) -> dict[str, Any]:
    """One RL run of `variant`; returns its per-step metrics (plus held-out accept length)."""
    from tlt.runtime.ray_executor import ray_trainer

    run = variant_run(workload, variant, repeat, drafter)
    trainer = ray_trainer(run, out_dir, warmstart=workload.warmstart, num_cpus=num_cpus)
    accept: list[float | None] = []
    drift: list[dict[str, float | None]] = []
    probe = DriftProbe(workload, drafter if variant in workload.frozen_in else None)

    def on_step(_: Any) -> None:
        accept.append(heldout_accept_length(trainer, workload))
        drift.append(probe(trainer))

    started = time.perf_counter()
    history = trainer.train(on_step=on_step)
    keep = (
        "rollout_seconds",
        "step_seconds",
        "update_seconds",
        "pre_update_seconds",
        "bookkeeping_wait_seconds",
        "generated_tokens",
        "reward_mean",
        "response_lengths",
        "truncation_rate",
        "accept_length",
        "sd_row_steps",
        "sd_by_position",
        "harvested_seconds",
        "idle_seconds",
        "seconds_by_running",
        "steps_by_running",
        "tokens_by_running",
        "sd_arms",
        "sd_arm_rates",
        "drafter_updates",
        "tail_seconds",
        "generate_seconds",
        "rollout_overhead_seconds",
        "rollout_overhead_parts",
        "step_split",
    )
    return {
        "variant": variant,
        "repeat": repeat,
        "wall_seconds": time.perf_counter() - started,
        "steps": [{k: m.get(k) for k in keep} for m in history],
        "heldout_accept_length": accept,
        "heldout_kl": [d["heldout_kl"] for d in drift],
        "frozen_accept_length": [d["frozen_accept_length"] for d in drift],
    }


def _common_spec(workload: Workload) -> RunSpec:
    """The validated RunSpec of the workload's first variant (what every variant shares: model, roles)."""
    return variant_run(workload, next(iter(workload.variants)), 0).spec


def policy_costs(workload: Workload) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The verify cost curve of the starting policy in the workload's dtype, and the cost of one
    drafter step relative to one target step at each batch (see tlt.bench.cost_timing), on the device the
    rollout workers decode on (a GPU where `rollout.resources.gpus` asks for one)."""
    model, _ = load_policy(warm_start(workload.warmstart))
    gpus = _common_spec(workload).rollout.resources.gpus
    model = model.to("cuda" if gpus > 0 else "cpu", resolve_dtype(workload.spec["model"]["dtype"])).eval()
    c = workload.costs
    compiled = resolve_compile(workload.spec.get("rollout", {}).get("compile", "auto"), model)  # as the workers run
    points = measure_costs(
        model,
        batches=list(c["batches"]),
        widths=list(c["widths"]),
        context=int(c["context"]),
        repeats=int(c["repeats"]),
        compile=compiled,
    )
    drafter = measure_drafter_costs(
        model, batches=list(c["batches"]), context=int(c["context"]), repeats=int(c["repeats"]), compile=compiled
    )
    return [p.__dict__ for p in points], [d.__dict__ for d in drafter]


def _load_average() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def repeat_order(variants: list[str], repeat: int) -> list[str]:
    """The order the variants run in within repeat `repeat`: rotated by one place per repeat, so no
    variant always runs first (right after the cost curve, on a machine still settling) or last."""
    shift = repeat % len(variants) if variants else 0
    return variants[shift:] + variants[:shift]


def check_devices(workload: Workload) -> None:
    """Refuse, before any work, a workload whose roles ask for a GPU this machine lacks (ValueError naming
    the workload and the field; `tlt.runtime.devices.gpu_plan`)."""
    spec = _common_spec(workload)
    try:
        gpu_plan(
            spec.policy.resources.gpus,
            spec.rollout.resources.gpus,
            spec.rollout.replicas,
            {"GPU": float(torch.cuda.device_count())},
            role_pods=False,
            cuda_available=torch.cuda.is_available(),
        )
    except ValueError as exc:
        raise ValueError(f"{workload.path} (spec): {exc}") from exc


def run_bench(
    workload: Workload, *, work_dir: Path | None = None, num_cpus: int = 2, progress: Progress | None = None
) -> dict[str, Any]:
    """Run every variant `workload.repeats` times, interleaved (`repeat_order`); returns the summary
    (see run_summary).

    Each run's metrics are also written to `<work_dir>/<variant>-<repeat>.json` as soon as it ends
    (and the cost curve to `<work_dir>/costs.json`).
    """
    import ray

    check_devices(workload)
    note = progress or (lambda text: log.info("%s", text))
    load = {"before": _load_average()}
    note("building (or finding) the warm-start drafter")
    drafter, drafter_info = warm_drafter(workload)
    torch.set_num_threads(1)  # as the rollout workers (one thread each); exact CPU-time costs
    note("measuring the verify cost curve")
    costs, drafter_costs = policy_costs(workload)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tlt-bench-") as tmp:
        root = Path(work_dir) if work_dir is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        (root / "costs.json").write_text(json.dumps({"verify": costs, "drafter": drafter_costs}) + "\n")
        try:
            for repeat in range(workload.repeats):
                for variant in repeat_order(list(workload.variants), repeat):
                    note(f"repeat {repeat + 1}/{workload.repeats}: {variant}")
                    result = run_variant(workload, variant, repeat, root / f"{variant}-{repeat}", num_cpus, drafter)
                    load[f"after-{variant}-{repeat}"] = _load_average()
                    (root / f"{variant}-{repeat}.json").write_text(json.dumps(result, default=str) + "\n")
                    runs.append(result)
        finally:
            ray.shutdown()
    load["after"] = _load_average()
    info = workload_info(workload)
    # the exact weights the runs started from (the cache key names their settings, not their values)
    info["warmstart"]["weights_sha256"] = weights_sha256(warm_start(workload.warmstart))
    if drafter_info is not None and drafter is not None:
        drafter_info = {**drafter_info, "weights_sha256": weights_sha256(drafter)}
        if "block" in drafter_info:  # the block part (`tlt.drafter.warmstart`)
            block = {**drafter_info["block"], "weights_sha256": weights_sha256(drafter / BLOCK_SNAPSHOTS)}
            drafter_info = {**drafter_info, "block": block}
    report = summarize({**info, "drafter_warmstart": drafter_info}, runs, costs, load, drafter_costs=drafter_costs)
    return {**report, "machine": machine_info()}


def workload_info(workload: Workload) -> dict[str, Any]:
    return {
        "path": str(workload.path),
        "sha256": workload.sha256,
        "name": workload.name,
        "quick": workload.quick,
        "warmstart": {"cache_key": workload.warmstart.cache_key(), **dataclasses.asdict(workload.warmstart)},
        "repeats": workload.repeats,
        "variants": list(workload.variants),
        "heldout": workload.heldout,
        "speculative": {v: merge_spec(workload.spec, o).get("speculative", {}) for v, o in workload.variants.items()},
        "algorithm": workload.spec.get("algorithm", {}),
        "threads": torch.get_num_threads(),
    }
