"""A `tlt bench run` workload file: parsed and checked (`load_workload`), its warm-started policy, and the
drafter its learned-drafter variants start from (`warm_drafter`)."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tlt.bench.bench_block_drafter import trained_block_drafter, with_block_part
from tlt.bench.bench_drafter import DrafterBudget, trained_drafter
from tlt.drafter.drafter_set import BLOCK_LAYERS
from tlt.spec.plan import spread_layers
from tlt.tasks.warmstart import WarmstartConfig, deep_config, deep_v3_config, load_policy, reduced_config, warm_start

DEFAULT_WORKLOAD = Path(__file__).resolve().parents[2] / "bench" / "workload.yaml"
WARMSTARTS: dict[str, Callable[[], WarmstartConfig]] = {
    "reduced": reduced_config,
    "default": WarmstartConfig,
    "deep": deep_config,
    "deep-v3": deep_v3_config,
}
# The drafter warm start of bench/workload-deep-v3.yaml, also what `tlt demo` starts TLT from.
DRAFTER_WARMSTART = {"prompts": 256, "steps": 150, "batch": 32, "learningRate": 3.0e-3, "maxNewTokens": 256, "seed": 0}
DRAFTER_WARMSTART_KEYS = ("prompts", "steps", "batch", "learningRate", "maxNewTokens", "seed")


@dataclass(frozen=True)
class Workload:
    """The parsed workload file: its sha256, and the settings used (quick overrides applied)."""

    path: Path
    sha256: str
    name: str
    warmstart: WarmstartConfig
    spec: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    repeats: int
    heldout: dict[str, Any]
    costs: dict[str, Any]
    quick: bool
    drafter_warmstart: dict[str, Any] | None = None
    frozen_in: tuple[str, ...] = ("vanilla",)


def resolve_warmstart(value: Any, path: Path) -> WarmstartConfig:
    """A workload's `warmstart`: a built-in name (`default`, `reduced`) or a mapping of WarmstartConfig
    fields (nested `task` / `policy`), e.g. a deep policy's shape and schedule."""
    if isinstance(value, str) and value in WARMSTARTS:
        return WARMSTARTS[value]()
    if isinstance(value, dict):
        try:
            return WarmstartConfig.from_dict(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: warmstart: {exc}") from exc
    raise ValueError(
        f"{path}: warmstart must be one of {sorted(WARMSTARTS)} or a mapping of warm-start settings, got {value!r}"
    )


def merge_spec(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merge_spec(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_workload(path: Path = DEFAULT_WORKLOAD, *, quick: bool = False, repeats: int | None = None) -> Workload:
    """Read `path`; with quick, apply its `quick` overrides; `repeats` overrides the file's."""
    raw = path.read_bytes()
    data = yaml.safe_load(raw)
    missing = [k for k in ("name", "warmstart", "spec", "variants", "repeats", "heldout", "costs") if k not in data]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    if quick:
        data = merge_spec(data, data.get("quick", {}))
    warmstart = resolve_warmstart(data["warmstart"], path)
    n = repeats if repeats is not None else int(data["repeats"])
    if n < 1:
        raise ValueError(f"repeats must be >= 1, got {n}")
    for name in ("vanilla", "tlt", "static", "tlt-shadow"):
        if name not in data["variants"]:
            raise ValueError(f"{path}: variants must include {name!r} (the summary compares against it)")
    warm = data.get("drafterWarmstart")
    if warm is not None:
        unknown = sorted(set(warm) - set(DRAFTER_WARMSTART_KEYS))
        if unknown:
            raise ValueError(
                f"{path}: drafterWarmstart: unknown keys {unknown}; allowed: {list(DRAFTER_WARMSTART_KEYS)}"
            )
    frozen_in = data.get("frozenIn", ["vanilla"])
    if not isinstance(frozen_in, list) or any(v not in data["variants"] for v in frozen_in):
        raise ValueError(
            f"{path}: frozenIn must be a list of variant names from {sorted(data['variants'])}, got {frozen_in!r}"
        )
    return Workload(
        path,
        hashlib.sha256(raw).hexdigest(),
        data["name"],
        warmstart,
        data["spec"],
        data["variants"],
        n,
        data["heldout"],
        data["costs"],
        quick,
        warm,
        tuple(frozen_in),
    )


def warm_drafter(workload: Workload) -> tuple[Path | None, dict[str, Any] | None]:
    """The drafter every learned-drafter variant starts from (`drafterWarmstart`, see `drafter_warm_start`),
    with a block part when the workload's arms include block arms (block size: the largest block arm's
    depth). (None, None) when the workload has no `drafterWarmstart` (drafters then start untrained)."""
    if not workload.drafter_warmstart:
        return None, None
    return drafter_warm_start(workload.warmstart, workload.drafter_warmstart, block_size(workload))


def block_size(workload: Workload) -> int:
    """The largest depth of the block arms in the workload's `spec.speculative.arms` (0: none)."""
    arms = workload.spec.get("speculative", {}).get("arms", [])
    return max((int(a["depth"]) for a in arms if a.get("kind") == "block"), default=0)


def drafter_warm_start(warmstart: WarmstartConfig, cfg: dict[str, Any], block: int = 0) -> tuple[Path, dict[str, Any]]:
    """An EAGLE drafter trained for a fixed budget (`cfg`: prompts, steps, batch, learningRate,
    maxNewTokens, seed) on the warm-started policy's own samples at T=1 on task prompts (the step-0
    distribution), cached beside the warm start: (its folder, its training info). static freezes it,
    tlt keeps training it. With `block` > 0 also a block drafter of that block size, reading the layers a
    run's block drafter reads, on the same budget (`trained_block_drafter`, its cache): the folder is then
    `with_block_part`'s (the EAGLE drafter's files, the block drafter's in `block/`), and the info has the
    block drafter's under "block"."""
    folder = warm_start(warmstart)
    policy, tokenizer = load_policy(folder)
    budget = DrafterBudget(
        max_new_tokens=int(cfg["maxNewTokens"]),
        drafter_prompts=int(cfg["prompts"]),
        drafter_steps=int(cfg["steps"]),
        drafter_batch=int(cfg["batch"]),
        drafter_lr=float(cfg["learningRate"]),
        seed=int(cfg["seed"]),
    )
    _, info = trained_drafter(budget, folder, policy.eval(), tokenizer)
    eagle = folder / f"bench-drafter-{info['cache_key']}"
    if not block:
        return eagle, info
    layers = spread_layers(policy.config.num_hidden_layers)  # what a run's block drafter reads (`learned_drafters`)
    _, block_info = trained_block_drafter(budget, block, BLOCK_LAYERS, folder, policy, tokenizer, layers)
    path = with_block_part(eagle, folder / f"bench-block-drafter-{block_info['cache_key']}")
    return path, {**info, "block": block_info}
