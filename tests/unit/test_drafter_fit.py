"""A checkpoint's drafter is checked against the drafter a run learns before anything loads it
(`tlt.checkpoint.drafter_fit`, `tlt.checkpoint.resume_guard.check_drafter_fits`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tlt.checkpoint.drafter_fit import describe, drafter_resume_problem, hub_param_shapes, params_problem
from tlt.checkpoint.resume_guard import ResumeError, check_drafter_fits
from tlt.checkpoint.store import Checkpoint, add_drafter
from tlt.drafter.hub import DrafterHub
from tlt.models.drafter import drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.spec.plan import LearnedDrafters

EAGLE = LearnedDrafters(eagle=True, block_size=0)
WIDE = LearnedDrafters(eagle=True, block_size=4, feature_layers=(0, 1, 2))
FINAL_NORM = LearnedDrafters(eagle=True, block_size=4, feature_layers=())
BLOCK_ONLY = LearnedDrafters(eagle=False, block_size=3, feature_layers=(1,))


def _target():
    return tiny_model(vocab_size=32, hidden_size=16, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=32)


def _hub_params(target, learned: LearnedDrafters) -> dict[str, torch.Tensor]:
    hub = DrafterHub(drafter_config_from_target(target.config), 1e-3)
    if learned.block_size:
        hub.use_drafters(learned)
    return hub.params()


@pytest.mark.parametrize("learned", [EAGLE, WIDE, FINAL_NORM, BLOCK_ONLY], ids=["eagle", "wide", "final", "block"])
def test_shapes_are_those_of_the_hub_a_run_builds(learned):
    target = _target()
    held = _hub_params(target, learned)
    assert hub_param_shapes(target.config, learned) == {k: tuple(v.shape) for k, v in held.items()}
    assert drafter_resume_problem(held, target.config, learned) is None


def test_params_problem_names_the_first_difference():
    expected = {"a": (2, 3), "b": (4,)}
    assert params_problem({"a": torch.zeros(2, 3), "b": torch.zeros(4)}, expected) is None
    assert params_problem({"a": torch.zeros(2, 3)}, expected) == "it holds no drafter parameter b (1 missing)"
    extra = params_problem({"a": torch.zeros(2, 3), "b": torch.zeros(4), "c": torch.zeros(1)}, expected)
    assert extra == "it holds drafter parameter c, which this run's drafter has no place for"
    assert params_problem({"a": torch.zeros(3, 2), "b": torch.zeros(4)}, expected) == (
        "its drafter parameter a has shape [3, 2], this run's [2, 3]"
    )


def test_a_final_norm_block_drafter_does_not_resume_a_wide_one():
    target = _target()
    problem = drafter_resume_problem(_hub_params(target, FINAL_NORM), target.config, WIDE)
    assert problem is not None and "block.layer_norms.0.weight" in problem
    assert describe(WIDE) == "an EAGLE drafter and a block drafter of 4 reading target layers 0, 1, 2"
    assert describe(WIDE) in problem


def test_adding_block_arms_to_a_run_of_the_eagle_drafter_is_refused():
    target = _target()
    problem = drafter_resume_problem(_hub_params(target, EAGLE), target.config, WIDE)
    assert problem is not None and "block." in problem
    problem = drafter_resume_problem(_hub_params(target, WIDE), target.config, EAGLE)
    assert problem is not None and "no drafter parameter fc.weight" in problem


def test_check_drafter_fits_raises_resume_error_naming_the_checkpoint(tmp_path: Path):
    target = _target()
    ckpt = Checkpoint(step=3)
    check_drafter_fits(ckpt, tmp_path, target.config, WIDE)  # no drafter: nothing to check
    check_drafter_fits(None, tmp_path, target.config, WIDE)
    add_drafter(ckpt, {"params": _hub_params(target, FINAL_NORM), "optimizer": {}, "version": 5}, None)
    with pytest.raises(ResumeError, match=rf"checkpoint of step 3 under {tmp_path}: the checkpoint's drafter"):
        check_drafter_fits(ckpt, tmp_path, target.config, WIDE)
    check_drafter_fits(ckpt, tmp_path, target.config, FINAL_NORM)
