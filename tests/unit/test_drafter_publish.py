"""`drafter.publish: validated`: the rule that promotes a candidate drafter, the worker-side scoring of
both drafters on the same fresh rollouts, and the served drafter in whole-run checkpoints."""

from __future__ import annotations

import pytest
import torch
from test_drafter_hub import policy, sample_completions, trainer_for

from tlt.checkpoint.store import Checkpoint, add_drafter, drafter_of, load_latest, save_checkpoint
from tlt.drafter.buffer import OnlineBuffer, pack
from tlt.drafter.hub import DrafterHub
from tlt.drafter.intake import buffer_and_agreement
from tlt.drafter.publish import promote, step_drafters
from tlt.drafter.trainer import packed_agreement
from tlt.models.drafter import drafter_config_from_target


@pytest.mark.parametrize(
    "served, candidate, expected",
    [
        ((50, 100), (60, 100), True),  # better
        ((50, 100), (40, 100), False),  # worse
        ((50, 100), (50, 100), True),  # a tie goes to the newer drafter
        ((50, 100), (26, 50), True),  # rates, not counts, when totals differ
        ((50, 100), (24, 50), False),
        ((0, 0), (10, 10), False),  # nothing scored: nothing changes
        ((10, 10), (0, 0), False),
    ],
)
def test_promote_compares_agreement_rates(served, candidate, expected):
    assert promote(served, candidate) is expected


def test_step_drafters_serve_the_validated_one_and_score_the_newest():
    warm, newer = (0, "warm"), (12, "newer")
    assert step_drafters("validated", None, warm) == (warm, None)  # first step: nothing served yet
    assert step_drafters("validated", warm, newer) == (warm, newer)  # the served one drafts
    assert step_drafters("validated", newer, newer) == (newer, None)  # nothing newer to score
    assert step_drafters("latest", warm, newer) == (newer, None)  # the newest drafts, unscored
    with pytest.raises(ValueError, match="drafter.publish"):
        step_drafters("best", warm, newer)


def test_promote_refuses_impossible_counts():
    with pytest.raises(ValueError, match="candidate"):
        promote((1, 2), (3, 2))
    with pytest.raises(ValueError, match="served"):
        promote((-1, 2), (1, 2))


def test_both_drafters_are_scored_on_the_same_fresh_rollouts_and_training_goes_on_from_the_candidate():
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3)
    trainer = trainer_for("w0", model, hub, seed=0)
    served = hub.pull()
    gen = torch.Generator().manual_seed(3)
    candidate = (7, {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in served[1].items()})
    completions = sample_completions(model, seed=0)

    out = buffer_and_agreement(OnlineBuffer(1, 32), trainer, completions, 1, 32, candidate)
    assert trainer.version == 7
    assert all(torch.equal(trainer.drafter.state_dict()[k], v) for k, v in candidate[1].items())

    reference = OnlineBuffer(1, 32)  # the same completions, buffered on their own
    reference.add(sample_completions(model, seed=0), 1)
    packs = pack(reference.samples, 32)
    trainer.load(*served)
    assert (out["agree"], out["agree_total"]) == packed_agreement(trainer.drafter, packs)
    trainer.load(*candidate)
    assert (out["candidate_agree"], out["candidate_total"]) == packed_agreement(trainer.drafter, packs)
    assert out["candidate_total"] == out["agree_total"] > 0 and out["candidate_version"] == 7


def test_without_a_candidate_only_the_served_drafter_is_scored():
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3)
    trainer = trainer_for("w0", model, hub, seed=0)
    out = buffer_and_agreement(OnlineBuffer(1, 32), trainer, sample_completions(model, seed=0), 1, 32)
    assert "candidate_agree" not in out and trainer.version == 0


def test_the_served_drafter_is_in_the_checkpoint_and_comes_back(tmp_path):
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3)
    version, params = hub.pull()
    state = {**hub.state(), "served": {"version": 3, "params": {k: v + 1 for k, v in params.items()}}}
    ckpt = Checkpoint(step=1)
    add_drafter(ckpt, state, None)
    save_checkpoint(tmp_path, ckpt)
    restored, _ = drafter_of(load_latest(tmp_path))
    assert restored["served"]["version"] == 3
    for name, tensor in state["served"]["params"].items():
        assert torch.equal(restored["served"]["params"][name], tensor)
    ckpt = Checkpoint(step=2)
    add_drafter(ckpt, hub.state(), None)  # a run that serves the newest drafter stores none
    save_checkpoint(tmp_path, ckpt)
    assert "served" not in drafter_of(load_latest(tmp_path))[0]
