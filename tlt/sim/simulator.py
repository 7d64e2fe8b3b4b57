"""A whole simulation: every step of a trace, for each variant, with each replica's bandit and the
drafter's training carried from step to step (the drafter trained in step s serves step s + 1).

The variants' arms come from `tlt.spec.plan.usable_arms` under mode static / tlt and their bandits
from `tlt.adaptive.adaptive_stepper.new_bandit`: the engine's own choice of arms and bandit settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from tlt.adaptive.adaptive_stepper import new_bandit
from tlt.sim.accept import AcceptCurve
from tlt.sim.cost_model import CostModel
from tlt.sim.replica import Drafting
from tlt.sim.step import ClusterConfig, StepResult, Variant, simulate_step
from tlt.spec.plan import usable_arms
from tlt.spec.run import SpeculativeSpec

VARIANTS = ("vanilla", "static", "tlt")


def build_variants(
    spec: SpeculativeSpec, names: tuple[str, ...] = VARIANTS, drafter_training: bool = True
) -> list[Variant]:
    """vanilla (no SD), static (every arm, the drafter never trained) and tlt (trained in idle time)."""
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise ValueError(f"variants must be among {list(VARIANTS)}, got {sorted(unknown)}")
    out = []
    for name in names:
        if name == "vanilla":
            out.append(Variant("vanilla"))
        else:
            moded = spec.model_copy(update={"mode": name})
            out.append(
                Variant(
                    name, tuple(spec.arms[i] for i in usable_arms(moded)), trains=name == "tlt" and drafter_training
                )
            )
    return out


@dataclass
class SimResult:
    """Per variant, its steps in order."""

    steps: dict[str, list[StepResult]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per variant: mean step, rollout share, idle and harvested GPU-seconds per step, SD share of
        decode time, final acceptance, and speedup over vanilla (when vanilla ran)."""
        out: dict[str, dict[str, Any]] = {}
        for name, results in self.steps.items():
            step = mean(r.step_seconds for r in results)
            out[name] = {
                "step_seconds": step,
                "rollout_share": mean(r.rollout_seconds / r.step_seconds for r in results),
                "idle_gpu_seconds_per_step": mean(r.idle_gpu_seconds for r in results),
                "harvested_gpu_seconds_per_step": mean(r.harvested_gpu_seconds for r in results),
                "sd_seconds_per_step": mean(r.sd_seconds for r in results),
                "final_alpha": results[-1].alpha,
            }
        if "vanilla" in out:
            for row in out.values():
                row["speedup"] = out["vanilla"]["step_seconds"] / row["step_seconds"]
        return out


def simulate(
    trace: list[list[int]],
    variants: list[Variant],
    cost: CostModel,
    cluster: ClusterConfig,
    spec: SpeculativeSpec,
    curve: AcceptCurve,
    *,
    seed: int = 0,
    on_step: Callable[[str, int], None] | None = None,
) -> SimResult:
    """Run every step of `trace` for every variant; on_step(variant, step) after each step."""
    result = SimResult()
    for variant in variants:
        bandits = [
            new_bandit(spec, len(variant.arms), seed + r) if variant.arms else None for r in range(cluster.replicas)
        ]
        trained = 0.0
        steps = result.steps.setdefault(variant.name, [])
        for number, lengths in enumerate(trace, 1):
            alpha = curve.alpha(trained)
            drafting = [
                None
                if b is None
                else Drafting(variant.arms, spec.threshold, tuple(spec.buckets), b, alpha, curve.ngram)
                for b in bandits
            ]  # None: vanilla
            step = simulate_step(lengths, variant, cost, cluster, drafting)
            trained += step.harvested_gpu_seconds
            steps.append(step)
            if on_step is not None:
                on_step(variant.name, number)
    return result
