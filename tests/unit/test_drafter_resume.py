"""The drafter's AdamW moments and online buffer survive RL steps and a kill + restart, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from test_drafter_hub import filled_buffer, policy

from tlt.checkpoint.store import Checkpoint, add_drafter, drafter_of, load_latest, save_checkpoint
from tlt.drafter.buffer import OnlineBuffer
from tlt.drafter.drafter_set import DrafterSet, new_drafter_set, unbound_drafter_set
from tlt.drafter.hub import MAX_GRAD_NORM, DrafterHub
from tlt.drafter.objective import make_optimizer
from tlt.drafter.trainer import SpotTrainer, local_step
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.spec.plan import LearnedDrafters

LR = 3e-3


# the drafters a run learns: the EAGLE drafter alone (no block arms), EAGLE + block, block alone
LEARNED = [None, LearnedDrafters(eagle=True, block_size=4), LearnedDrafters(eagle=False, block_size=3)]


def _hub(config, learned: LearnedDrafters | None, seed: int) -> DrafterHub:
    hub = DrafterHub(config, LR, seed=seed)
    if learned is not None:
        hub.use_drafters(learned)
    return hub


def _trainer(model, hub: DrafterHub, buffer: OnlineBuffer) -> SpotTrainer:
    if isinstance(hub.drafter, DrafterSet):
        drafter = new_drafter_set(model, hub.learned)
    else:
        drafter = EagleDrafter(drafter_config_from_target(model.config))
        drafter.bind_policy(model)
    trainer = SpotTrainer("rollout-0", drafter, buffer, hub.push_delta, learning_rate=LR)
    trainer.load(*hub.pull())
    return trainer


def _train(trainer: SpotTrainer, hub: DrafterHub, epochs: int) -> None:
    """What the trainer's loop does, synchronously: a local AdamW step on every packed row of each
    epoch, each step's parameter change pushed to the hub."""
    for _ in range(epochs):
        state = trainer.state_dict()
        for packed in trainer.buffer.batches(state["epoch"]):
            before = {n: p.detach().clone() for n, p in trainer.drafter.named_parameters()}
            loss = local_step(trainer.drafter, trainer.optimizer, packed)
            delta = {n: p.detach() - before[n] for n, p in trainer.drafter.named_parameters()}
            trainer.load(*hub.push_delta(trainer.trainer_id, delta, trainer.version, 1, packed.num_trained, loss))
        trainer.load_state_dict({**trainer.state_dict(), "epoch": state["epoch"] + 1})


def _assert_same(a, b) -> None:
    """Nested dicts / lists of tensors and numbers are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_hub_adamw_keeps_its_moments_from_one_rl_step_to_the_next():
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), LR, seed=1)
    reference = copy.deepcopy(hub.drafter)
    ref_opt = make_optimizer(reference, LR)
    gen = torch.Generator().manual_seed(0)
    for step in range(1, 4):  # one push per RL step; the hub (an actor) lives across steps
        grads = {n: torch.randn(p.shape, generator=gen) for n, p in hub.drafter.named_parameters()}
        hub.push("rollout-0", {n: g.clone() for n, g in grads.items()}, hub.version, 1, 0.0)
        for name, param in reference.named_parameters():
            param.grad = grads[name].clone()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_GRAD_NORM)
        ref_opt.step()
        assert all(int(s["step"]) == step for s in hub.optimizer.state.values())
    _assert_same(hub.params(), {k: v.detach() for k, v in reference.state_dict().items()})
    _assert_same(hub.optimizer.state_dict()["state"], ref_opt.state_dict()["state"])


@pytest.mark.parametrize("learned", LEARNED, ids=["eagle", "eagle+block", "block"])
@pytest.mark.parametrize("drop", [None, "optimizer", "buffer", "epoch", "served"])
def test_kill_and_restart_resume_the_drafter_exactly(tmp_path, drop, learned):
    """A run trains, checkpoints, trains on; a second process restored from the checkpoint trains
    the same epochs and must end bit-identical, and serves the same drafter. Dropping any part of the
    drafter's state (the mutants) must break that. A run with block arms holds a `DrafterSet`."""
    model = policy()
    config = drafter_config_from_target(model.config)
    hub = _hub(config, learned, seed=1)
    trainer = _trainer(model, hub, filled_buffer(model, seed=4))
    _train(trainer, hub, epochs=1)
    served = hub.pull()  # what the rollouts draft with: an older version than the hub's newest
    _train(trainer, hub, epochs=1)
    ckpt = Checkpoint(step=1)
    add_drafter(ckpt, {**hub.state(), "served": {"version": served[0], "params": served[1]}}, [trainer.state_dict()])
    if drop == "optimizer":  # the trainer's own AdamW moments
        fresh = EagleDrafter(config) if learned is None else unbound_drafter_set(config, learned)
        ckpt.objects["drafter_buffers"][0]["optimizer"] = make_optimizer(fresh, LR).state_dict()
    elif drop == "served":
        del ckpt.tensors["served_drafter"]
    elif drop == "buffer":
        ckpt.objects["drafter_buffers"][0]["buffer"] = {
            **trainer.buffer.state_dict(),
            "tokens": [],
            "hidden": [],
            "prompt_len": [],
            "step": [],
        }
    elif drop == "epoch":
        ckpt.objects["drafter_buffers"][0]["epoch"] = 0
    save_checkpoint(tmp_path, ckpt)
    _train(trainer, hub, epochs=2)  # the first run goes on, then is "killed": its objects are gone

    hub_state, trainer_states = drafter_of(load_latest(tmp_path))
    resumed_hub = _hub(config, learned, seed=99)
    resumed_hub.load_state(hub_state)
    fresh = trainer.buffer
    resumed = _trainer(model, resumed_hub, OnlineBuffer(fresh.buffer_steps, fresh.row_tokens, fresh.seed))
    resumed.load_state_dict(trainer_states[0])
    resumed.load(*resumed_hub.pull())
    _train(resumed, resumed_hub, epochs=2)

    try:
        _assert_same(resumed.state_dict(), trainer.state_dict())
        _assert_same(resumed_hub.state(), hub.state())
        _assert_same(hub_state.get("served"), {"version": served[0], "params": served[1]})
    except AssertionError:
        assert drop is not None, "a complete checkpoint did not resume exactly"
    else:
        assert drop is None, f"dropping the drafter's {drop} went unnoticed"


def test_buffer_state_refuses_other_settings():
    model = policy()
    buffer = filled_buffer(model, seed=2)
    state = buffer.state_dict()
    other = OnlineBuffer(buffer_steps=2, row_tokens=buffer.row_tokens, seed=buffer.seed)
    with pytest.raises(ValueError, match="buffer_steps"):
        other.load_state_dict(state)
