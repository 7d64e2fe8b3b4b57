"""Whether a whole-run checkpoint's drafter fits the drafter this run learns, before anything loads it.

A checkpoint written by another drafter layout (a block drafter reading only the target's final-norm state
where this run's reads `spread_layers` of its layers too; arms that changed the drafters a run learns) would
otherwise stop the resume inside torch's `load_state_dict` with a shape error, or, in a Ray run, inside an
actor. Both loops check here first and refuse in one line that names the parameter and both layouts.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from tlt.drafter.drafter_set import unbound_drafter_set
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.spec.plan import LearnedDrafters

Shapes = dict[str, tuple[int, ...]]


def hub_param_shapes(target: PretrainedConfig, learned: LearnedDrafters) -> Shapes:
    """Parameter name -> shape of what a run's drafter hub holds for a target of config `target`: the EAGLE
    drafter alone (no block drafter learned), else the `DrafterSet` of `learned`. Built on the meta device
    (no memory, no initialisation)."""
    config = drafter_config_from_target(target)
    with torch.device("meta"):
        drafter = unbound_drafter_set(config, learned) if learned.block_size else EagleDrafter(config)
    return {name: tuple(value.shape) for name, value in drafter.state_dict().items()}


def describe(learned: LearnedDrafters) -> str:
    """The drafters of `learned` in words (for the refusal line)."""
    parts = ["an EAGLE drafter"] if learned.eagle or not learned.block_size else []
    if learned.block_size:
        layers = ", ".join(map(str, learned.feature_layers)) or "none"
        parts.append(f"a block drafter of {learned.block_size} reading target layers {layers}")
    return " and ".join(parts)


def params_problem(held: dict[str, torch.Tensor], expected: Shapes) -> str | None:
    """The first difference between a checkpoint's drafter parameters `held` and the `expected` shapes: a
    parameter missing, one this run's drafter has no place for, or one of another shape; None when they fit."""
    missing = sorted(set(expected) - set(held))
    if missing:
        return f"it holds no drafter parameter {missing[0]} ({len(missing)} missing)"
    unexpected = sorted(set(held) - set(expected))
    if unexpected:
        return f"it holds drafter parameter {unexpected[0]}, which this run's drafter has no place for"
    for name in sorted(expected):
        shape = tuple(held[name].shape)
        if shape != expected[name]:
            return f"its drafter parameter {name} has shape {list(shape)}, this run's {list(expected[name])}"
    return None


def drafter_resume_problem(
    held: dict[str, torch.Tensor], target: PretrainedConfig, learned: LearnedDrafters
) -> str | None:
    """One line saying why a checkpoint whose drafter hub holds `held` cannot resume a run learning `learned`
    for a target of config `target` (`hub_param_shapes`); None when it can."""
    problem = params_problem(held, hub_param_shapes(target, learned))
    if problem is None:
        return None
    return (
        f"the checkpoint's drafter does not fit this run's ({describe(learned)}): {problem}; "
        "it was written with another drafter layout (other block arms, or a block drafter from before it "
        "read several target layers)"
    )
