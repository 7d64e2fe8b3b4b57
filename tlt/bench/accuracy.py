"""`tlt bench run` on a time-to-accuracy workload (`kind: time-to-accuracy`, e.g.
bench/time-to-accuracy-v1.yaml): every variant (sync or partial rollouts, with or without TLT's drafts) runs
as a real RL run through the trainer on Ray, each seed once, interleaved (the variants' order rotated by one
place per seed), with a held-out evaluation every `algorithm.evalEvery` steps. What is compared is the
wall-clock time to the workload's held-out accuracy `target` and the accuracy at equal samples and equal time
(`tlt.bench.accuracy_summary`); the figure plots held-out accuracy against seconds (`plot_accuracy`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tlt.bench.accuracy_summary import summarize
from tlt.bench.machine import machine_info, weights_sha256
from tlt.bench.run import _load_average, repeat_order
from tlt.bench.workload import DRAFTER_WARMSTART_KEYS, drafter_warm_start, merge_spec, resolve_warmstart
from tlt.spec.plan import learns_drafters
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.warmstart import WarmstartConfig, warm_start

log = logging.getLogger(__name__)

KIND = "time-to-accuracy"
KEYS = ("name", "kind", "warmstart", "spec", "variants", "seeds", "target")
# what each step keeps of a run's metrics
STEP_KEYS = (
    "step",
    "step_seconds",
    "rollout_seconds",
    "update_seconds",
    "generated_tokens",
    "reward_mean",
    "eval_accuracy",
    "off_policy_fraction",
    "harvested_seconds",
    "idle_seconds",
    "accept_length",
    "groups_dropped",
)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class AccuracyWorkload:
    """A parsed time-to-accuracy workload (quick overrides applied)."""

    path: Path
    sha256: str
    name: str
    warmstart: WarmstartConfig
    spec: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    seeds: list[int]
    target: float
    quick: bool
    drafter_warmstart: dict[str, Any] | None = None


def is_accuracy_workload(path: Path) -> bool:
    """Whether the workload file at `path` declares `kind: time-to-accuracy`."""
    data = yaml.safe_load(path.read_text())
    return isinstance(data, dict) and data.get("kind") == KIND


def load_accuracy_workload(path: Path, *, quick: bool = False, repeats: int | None = None) -> AccuracyWorkload:
    """Read `path` (ValueError with one line naming the field); `repeats` keeps the first that many seeds."""
    raw = path.read_bytes()
    data = yaml.safe_load(raw)
    missing = [k for k in KEYS if k not in data]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    if quick:
        data = merge_spec(data, data.get("quick", {}))
    target = data["target"]
    if not isinstance(target, int | float) or not 0 < float(target) <= 1:
        raise ValueError(f"{path}: target must be a held-out accuracy in (0, 1], got {target!r}")
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"{path}: seeds must be a non-empty list of integers, got {seeds!r}")
    if repeats is not None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        seeds = seeds[:repeats]
    if "vanilla" not in data["variants"]:
        raise ValueError(f"{path}: variants must include 'vanilla' (the ratios compare against it)")
    warm = data.get("drafterWarmstart")
    if warm is not None and sorted(set(warm) - set(DRAFTER_WARMSTART_KEYS)):
        raise ValueError(f"{path}: drafterWarmstart: unknown keys; allowed: {list(DRAFTER_WARMSTART_KEYS)}")
    workload = AccuracyWorkload(
        path,
        hashlib.sha256(raw).hexdigest(),
        data["name"],
        resolve_warmstart(data["warmstart"], path),
        data["spec"],
        data["variants"],
        seeds,
        float(target),
        quick,
        warm,
    )
    for variant in workload.variants:  # every variant's spec is valid before anything runs
        try:
            variant_run(workload, variant, seeds[0])
        except ValueError as exc:
            raise ValueError(f"{path}: variants.{variant}: {exc}") from exc
    if workload.spec.get("algorithm", {}).get("evalEvery", 0) < 1:
        raise ValueError(f"{path}: spec.algorithm.evalEvery must be >= 1 (the curves are held-out evaluations)")
    return workload


def variant_run(workload: AccuracyWorkload, variant: str, seed: int, drafter: Path | None = None) -> TLTTrainingRun:
    """The TLTTrainingRun of `variant` at `seed` (`algorithm.seed`), starting from `drafter` when it learns one."""
    spec = merge_spec(workload.spec, workload.variants[variant])
    spec = merge_spec(spec, {"algorithm": {"seed": seed}})
    name = f"bench-{variant.replace('+', '-')}-{seed}"
    run = TLTTrainingRun.model_validate({"metadata": {"name": name}, "spec": spec})
    if drafter is not None and learns_drafters(run.spec.speculative):
        spec = merge_spec(spec, {"speculative": {"drafterPath": str(drafter)}})
        run = TLTTrainingRun.model_validate({"metadata": {"name": name}, "spec": spec})
    return run


def run_variant(
    workload: AccuracyWorkload, variant: str, seed: int, out_dir: Path, num_cpus: int, drafter: Path | None
) -> dict[str, Any]:
    """One RL run; its per-step records (`STEP_KEYS`, plus the samples it trained)."""
    from tlt.runtime.ray_executor import ray_trainer

    run = variant_run(workload, variant, seed, drafter)
    trainer = ray_trainer(run, out_dir, warmstart=workload.warmstart, num_cpus=num_cpus)
    samples = run.spec.algorithm.prompts_per_step * run.spec.algorithm.group_size
    started = time.perf_counter()
    history = trainer.train()
    steps = [{**{k: m.get(k) for k in STEP_KEYS}, "samples": samples} for m in history]
    return {"variant": variant, "seed": seed, "wall_seconds": time.perf_counter() - started, "steps": steps}


def run_accuracy_bench(
    workload: AccuracyWorkload, *, work_dir: Path | None = None, num_cpus: int = 2, progress: Progress | None = None
) -> dict[str, Any]:
    """Every variant once per seed, interleaved; returns the summary with the workload, machine and load.
    Each run's records are written to `<work_dir>/<variant>-<seed>.json` as soon as it ends."""
    import ray

    note = progress or (lambda text: log.info("%s", text))
    load = {"before": _load_average()}
    drafter = None
    if workload.drafter_warmstart and any(
        learns_drafters(variant_run(workload, v, workload.seeds[0]).spec.speculative) for v in workload.variants
    ):
        note("building (or finding) the warm-start drafter")
        drafter, _ = drafter_warm_start(workload.warmstart, workload.drafter_warmstart)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tlt-bench-accuracy-") as tmp:
        root = Path(work_dir) if work_dir is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        try:
            for i, seed in enumerate(workload.seeds):
                for variant in repeat_order(list(workload.variants), i):
                    note(f"seed {seed} ({i + 1}/{len(workload.seeds)}): {variant}")
                    name = f"{variant.replace('+', '-')}-{seed}"
                    result = run_variant(workload, variant, seed, root / name, num_cpus, drafter)
                    load[f"after-{name}"] = _load_average()
                    (root / f"{name}.json").write_text(json.dumps(result, default=str) + "\n")
                    runs.append(result)
        finally:
            ray.shutdown()
    load["after"] = _load_average()
    summary = summarize(runs, workload.target, list(workload.variants))
    return {
        **summary,
        "workload": {
            "path": str(workload.path),
            "name": workload.name,
            "sha256": workload.sha256,
            "quick": workload.quick,
            "seeds": workload.seeds,
            "variants": workload.variants,
            "warmstart_weights_sha256": weights_sha256(warm_start(workload.warmstart)),
        },
        "runs": runs,
        "load_average": load,
        "machine": machine_info(),
    }


def print_accuracy_report(report: dict[str, Any], out: Callable[[str], None] = print) -> None:
    """The report as lines: a table of the variants, the ratios to vanilla, the identical-curve checks."""

    def fmt(s: dict[str, float] | None, spec: str = ".1f") -> str:
        return "n/a" if s is None else f"{s['median']:{spec}} [{s['min']:{spec}}, {s['max']:{spec}}]"

    w = report["workload"]
    out(
        f"tlt bench run: {w['name']} (sha256 {w['sha256'][:12]}), seeds {w['seeds']}, target held-out accuracy "
        f"{report['target']:.3f}; median [min, max] over seeds"
    )
    out(
        "variant | s to target (reached) | accuracy at equal s | final accuracy | rollout s/step | step s/step | "
        "off-policy | harvested s"
    )
    for name, v in report["variants"].items():
        out(
            f"{name} | {fmt(v['seconds_to_target'])} ({v['reached']}/{len(v['seeds'])}) | "
            f"{fmt(v['accuracy_at_equal_seconds'], '.3f')} | {fmt(v['final_accuracy'], '.3f')} | "
            f"{fmt(v['rollout_seconds_per_step'], '.2f')} | {fmt(v['step_seconds_per_step'], '.2f')} | "
            f"{fmt(v['off_policy_fraction'], '.3f')} | {fmt(v['harvested_seconds'])}"
        )
    out(f"equal seconds: {report['equal_seconds']:.1f} (the shortest variant's median run)")
    for name, r in report["ratios_to_vanilla"].items():
        out(
            f"{name} / vanilla: time to target {fmt(r['time_to_target_speedup'], '.2f')}x faster, run "
            f"{fmt(r['run_speedup'], '.2f')}x"
        )
    steps = sorted({int(s) for v in report["variants"].values() for s in v["accuracy_by_step"]})
    out(
        "held-out accuracy by step (= samples trained), median: "
        + "; ".join(
            f"{s}: "
            + ", ".join(
                f"{n} {fmt(v['accuracy_by_step'].get(str(s)), '.3f').split(' ')[0]}"
                for n, v in report["variants"].items()
            )
            for s in steps
        )
    )
    for pair, seeds in report["identical_curves"].items():
        out(f"identical held-out curves, {pair}: {seeds}")
    out(f"load average before/after: {report['load_average'].get('before')} / {report['load_average'].get('after')}")


def plot_accuracy(report: dict[str, Any], path: Path) -> Path:
    """Held-out accuracy against wall-clock seconds: every run, coloured by variant; the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, v) in enumerate(report["variants"].items()):
        for j, points in enumerate(v["curves"].values()):
            xs, ys = [p[1] for p in points], [p[3] for p in points]
            ax.plot(xs, ys, "o-", color=colours[i % len(colours)], alpha=0.7, label=name if j == 0 else None)
    ax.axhline(report["target"], color="grey", linestyle="--", label=f"target {report['target']:.3f}")
    ax.set_xlabel("wall-clock seconds (sum of step times; held-out evaluation left out)")
    ax.set_ylabel("held-out accuracy (sampled at algorithm.evalTemperature)")
    ax.set_title(f"{report['workload']['name']}: held-out accuracy against time, every seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
