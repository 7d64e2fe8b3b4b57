"""Spot trainers, the drafter hub and asynchronous drafter snapshots, in one process (no Ray)."""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import Future

import pytest
import torch

from tlt.drafter.async_ckpt import AsyncCheckpointer
from tlt.drafter.buffer import OnlineBuffer
from tlt.drafter.hub import DrafterHub
from tlt.drafter.objective import drafter_loss, make_optimizer
from tlt.drafter.priority import BACKGROUND_NICE, lower_thread_priority
from tlt.drafter.trainer import SpotTrainer, local_step
from tlt.models.drafter import EagleDrafter, drafter_config_from_target, load_drafter
from tlt.models.tiny import tiny_model
from tlt.rollout.types import Completion


def policy():
    return tiny_model(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)


def filled_buffer(model, seed: int) -> OnlineBuffer:
    buffer = OnlineBuffer(buffer_steps=1, row_tokens=32, seed=seed)
    buffer.add(sample_completions(model, seed), step=1)
    return buffer


def sample_completions(model, seed: int) -> list[Completion]:
    """Six finished completions of random tokens with the model's own hidden states."""
    g = torch.Generator().manual_seed(seed)
    completions = []
    for i in range(6):
        n = 4 + 3 * i
        tokens = torch.randint(4, 32, (n + 3,), generator=g).tolist()
        with torch.no_grad():
            hidden = model.model(input_ids=torch.tensor([tokens])).last_hidden_state[0, :-1]
        completions.append(Completion(f"r{i}", tokens[:3], tokens[3:], torch.zeros(n), hidden, "stop"))
    return completions


def trainer_for(name: str, model, hub: DrafterHub, seed: int, sync_every: int = 2) -> SpotTrainer:
    drafter = EagleDrafter(drafter_config_from_target(model.config))
    drafter.bind_policy(model)
    lr = hub.optimizer.param_groups[0]["lr"]
    trainer = SpotTrainer(
        name, drafter, filled_buffer(model, seed), hub.push_delta, learning_rate=lr, sync_every=sync_every
    )
    trainer.load(*hub.pull())
    return trainer


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_stop_is_acknowledged_with_both_timestamps_and_the_thread_ends():
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3)
    trainer = trainer_for("w0", model, hub, seed=0)
    started = trainer.start(step=1)
    wait_for(lambda: trainer.current.iterations >= 2)
    ack = trainer.stop()
    assert not trainer.active
    assert started <= ack["stop_received_at"] <= ack["stopped_at"]
    assert ack["iterations"] >= 2 and ack["error"] is None
    assert hub.version == ack["iterations"] == ack["version_last"]


def gated_trainer() -> tuple[DrafterHub, SpotTrainer, Future]:
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3)
    return hub, trainer_for("w0", model, hub, seed=0), Future()


def test_training_waits_for_the_rollouts_bookkeeping_which_may_load_parameters_meanwhile():
    """start(after=...): no gradient before the work it waits for (the step's samples entering the
    buffer, a candidate's load) is done; that work may load parameters while the thread waits."""
    hub, trainer, gate = gated_trainer()
    trainer.start(step=1, after=gate)
    time.sleep(0.2)
    assert trainer.active and trainer.current.iterations == 0 and hub.version == 0
    trainer.load(*hub.pull())  # the bookkeeping takes the candidate while the thread waits
    gate.set_result({"agree": 0, "agree_total": 0})
    wait_for(lambda: trainer.current.iterations >= 1)
    with pytest.raises(RuntimeError, match="while training"):
        trainer.load(*hub.pull())
    assert trainer.stop()["error"] is None


def test_a_stop_before_the_bookkeeping_ends_returns_at_once_and_trains_nothing():
    hub, trainer, gate = gated_trainer()
    trainer.start(step=1, after=gate)
    time.sleep(0.05)
    ack = trainer.stop()
    assert not trainer.active and ack["iterations"] == 0 and ack["error"] is None
    assert ack["stopped_at"] - ack["started_at"] < 0.5
    assert hub.version == 0


def test_a_failed_bookkeeping_is_reported_in_the_stop_acknowledgement():
    hub, trainer, gate = gated_trainer()
    gate.set_exception(ValueError("buffer refused the samples"))
    trainer.start(step=1, after=gate)
    wait_for(lambda: not trainer.active)
    assert trainer.stop()["error"] == "ValueError: buffer refused the samples"
    assert hub.version == 0


LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")


def thread_priority() -> tuple[int, int]:
    """(scheduling policy, nice value) of the calling thread."""
    tid = threading.get_native_id()
    return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)


@LINUX_ONLY
def test_the_trainer_thread_runs_in_the_idle_class_and_the_caller_keeps_its_own():
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3)
    seen: list[tuple[int, int]] = []

    def push(*args):
        seen.append(thread_priority())
        return hub.push_delta(*args)

    trainer = trainer_for("w0", model, hub, seed=0)
    trainer.push = push
    caller = thread_priority()
    trainer.start(step=1)
    wait_for(lambda: len(seen) >= 2)
    ack = trainer.stop()
    assert ack["priority"] == "idle"
    assert set(seen) == {(os.SCHED_IDLE, BACKGROUND_NICE)}
    assert thread_priority() == caller != (os.SCHED_IDLE, BACKGROUND_NICE)


@LINUX_ONLY
def test_where_the_idle_class_is_refused_the_thread_still_gets_the_lowest_nice_value(monkeypatch):
    def refuse(*_):
        raise PermissionError("not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    got: list[tuple[str | None, tuple[int, int]]] = []
    thread = threading.Thread(target=lambda: got.append((lower_thread_priority(), thread_priority())))
    thread.start()
    thread.join()
    assert got == [(f"nice {BACKGROUND_NICE}", (os.SCHED_OTHER, BACKGROUND_NICE))]


@LINUX_ONLY
def test_the_hub_actor_serves_pushes_at_the_trainers_priority():
    from tlt.workers.services import HubWorker

    model = policy()
    hub = HubWorker(model.config, 1e-3, seed=0, snapshot_dir=None)
    grads = {n: torch.zeros_like(p) for n, p in hub.drafter.named_parameters()}
    after: list[tuple[int, tuple[int, int]]] = []

    def serve(push):  # a thread of the actor's push group
        version, _ = push()
        after.append((version, thread_priority()))

    caller = thread_priority()
    for push in (lambda: hub.push("w0", grads, 0, 1, 0.0), lambda: hub.push_delta("w0", grads, 1, 3, 10, 0.0)):
        thread = threading.Thread(target=serve, args=(push,))
        thread.start()
        thread.join()
    assert after == [(1, (os.SCHED_IDLE, BACKGROUND_NICE)), (4, (os.SCHED_IDLE, BACKGROUND_NICE))]
    assert thread_priority() == caller


def test_trainers_push_through_the_hubs_own_push_group(monkeypatch):
    """The threads that served a push stay in the idle class: pushes go to `PUSH_GROUP`, whose threads serve
    nothing else, so the coordinator's pulls and snapshots keep the default group's normal threads."""
    from tlt.workers.services import PUSH_GROUP, hub_push

    calls: list[tuple[str, tuple]] = []

    class Method:
        def options(self, **kwargs):
            calls.append(("options", tuple(sorted(kwargs.items()))))
            return self

        def remote(self, *args):
            calls.append(("remote", args))
            return "ref"

    class Handle:
        push_delta = Method()

    monkeypatch.setattr("tlt.workers.services.ray.get", lambda ref: (7, {}) if ref == "ref" else None)
    assert hub_push(Handle())("w0", {}, 3, 2, 10, 0.5) == (7, {})
    assert calls == [("options", (("concurrency_group", PUSH_GROUP),)), ("remote", ("w0", {}, 3, 2, 10, 0.5))]


def test_two_active_trainers_update_one_drafter():
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3)
    first, second = trainer_for("w0", model, hub, seed=1), trainer_for("w1", model, hub, seed=2)
    first.start(step=1)
    second.start(step=1)
    wait_for(lambda: {p["trainer"] for p in hub.pushes} == {"w0", "w1"} and len(hub.pushes) >= 6)
    acks = [first.stop(), second.stop()]
    assert hub.version == sum(a["iterations"] for a in acks), "every local step reaches the one drafter"
    assert sum(p["steps"] for p in hub.pushes) == hub.version
    versions = [p["version"] for p in hub.pushes]
    assert versions == sorted(set(versions)) and versions[-1] == hub.version
    # each trainer ends on parameters the hub produced, so both hold the same drafter afterwards
    first.load(*hub.pull())
    second.load(*hub.pull())
    for (name, a), b in zip(first.drafter.state_dict().items(), second.drafter.state_dict().values()):
        assert torch.equal(a, b), name


def test_one_trainer_syncing_deltas_trains_as_plain_local_adamw():
    """The hub's drafter after a run equals the same rows trained by AdamW in one process: syncing
    every few steps changes nothing for one trainer (up to float rounding of base + delta)."""
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 3e-3, seed=5)
    reference = EagleDrafter(drafter_config_from_target(model.config))
    reference.bind_policy(model)
    reference.load_state_dict(hub.params())
    trainer = trainer_for("w0", model, hub, seed=6, sync_every=3)
    trainer.start(step=1)
    wait_for(lambda: trainer.current.iterations >= 10)
    ack = trainer.stop()
    assert hub.version == ack["iterations"] and [p["steps"] for p in hub.pushes][:3] == [3, 3, 3]
    optimizer = make_optimizer(reference, 3e-3)
    reference.train()
    rows = [packed for epoch in range(ack["iterations"]) for packed in trainer.buffer.batches(epoch)]
    for packed in rows[: ack["iterations"]]:
        local_step(reference, optimizer, packed)
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(hub.params()[name], tensor, rtol=0, atol=1e-6, msg=name)
    trainer.load(*hub.pull())
    assert all(int(s["step"]) == ack["iterations"] for s in trainer.optimizer.state.values())


def test_push_delta_refuses_other_parameters_and_empty_deltas():
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3)
    delta = {n: torch.zeros_like(p) for n, p in hub.drafter.named_parameters()}
    with pytest.raises(ValueError, match="delta keys differ"):
        hub.push_delta("w0", {**delta, "extra.weight": torch.zeros(1)}, 0, 1, 1, 0.0)
    with pytest.raises(ValueError, match="steps=0"):
        hub.push_delta("w0", delta, 0, 0, 1, 0.0)
    assert hub.version == 0 and hub.pushes == []


def test_training_lowers_the_loss_on_the_buffer():
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 3e-3)
    trainer = trainer_for("w0", model, hub, seed=3)
    before = buffer_loss(trainer)
    trainer.start(step=1)
    wait_for(lambda: trainer.current.iterations >= 60, timeout=60)
    trainer.stop()
    assert buffer_loss(trainer) < 0.9 * before


@torch.no_grad()
def buffer_loss(trainer: SpotTrainer) -> float:
    losses = []
    for packed in trainer.buffer.batches(0):
        b = packed.batch
        pred = trainer.drafter(b.input_ids, b.features, b.position_ids, attention_mask=packed.attn_mask)
        d = trainer.drafter
        losses.append(float(drafter_loss(pred, d.logits(pred), b.target, d.logits(b.target), b.mask).total))
    return sum(losses) / len(losses)


def test_async_snapshot_returns_before_writing_and_loads_as_a_drafter(tmp_path):
    model = policy()
    config = drafter_config_from_target(model.config)
    drafter = EagleDrafter(config)
    ckpt = AsyncCheckpointer(tmp_path / "drafter", config, keep=2)
    for step in (1, 2, 3):
        with torch.no_grad():
            drafter.fc.weight.add_(1.0)
        ckpt.submit(step, drafter.state_dict())
    assert ckpt.wait(timeout=30)
    loaded = load_drafter(ckpt.latest(), model)
    assert ckpt.latest().name.startswith("step-00000003-")
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert "embed_tokens" not in " ".join(loaded.state_dict()), "only trainable drafter params are saved"
    assert len(list((tmp_path / "drafter").glob("step-*"))) <= 2
    ckpt.submit(3, drafter.state_dict())  # a second snapshot of the same step lands beside the first
    assert ckpt.wait(timeout=30)
    assert ckpt.latest().is_dir() and load_drafter(ckpt.latest(), model) is not None
    ckpt.close()


@LINUX_ONLY
def test_the_snapshot_writer_runs_in_the_idle_class(tmp_path, monkeypatch):
    config = drafter_config_from_target(policy().config)
    seen: list[tuple[int, int]] = []
    write = AsyncCheckpointer._write
    monkeypatch.setattr(AsyncCheckpointer, "_write", lambda self, *a: (seen.append(thread_priority()), write(self, *a)))
    caller = thread_priority()
    ckpt = AsyncCheckpointer(tmp_path / "drafter", config)
    ckpt.submit(1, EagleDrafter(config).state_dict())
    assert ckpt.wait(timeout=30)
    ckpt.close()
    assert seen == [(os.SCHED_IDLE, BACKGROUND_NICE)]
    assert thread_priority() == caller


def test_a_restarted_hub_refuses_the_drafters_calls_until_restored():
    """Ray re-runs the hub's constructor in a restarted process: a fresh drafter, which no trainer may sync with
    and no rollout draft with until the coordinator restores the one it last pulled (`tlt.runtime.hub_keeper`)."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from tlt.runtime.hub_keeper import hub_lost
    from tlt.spec.plan import LearnedDrafters
    from tlt.workers.services import HubRestarted, HubWorker

    model = policy()
    trained = HubWorker(model.config, 1e-3, seed=0, snapshot_dir=None)
    delta = {n: torch.full_like(p, 0.01) for n, p in trained.drafter.named_parameters()}
    version, params = trained.push_delta("w0", delta, 0, 3, 10, 0.5)
    assert not trained.ping()["awaiting"] and version == 3

    restarted = HubWorker(model.config, 1e-3, seed=0, snapshot_dir=None)
    restarted.awaiting = True  # as `was_current_actor_reconstructed` sets it in Ray's restarted process
    assert restarted.ping()["awaiting"]
    for call in (
        lambda: restarted.push_delta("w0", delta, 3, 1, 10, 0.5),
        restarted.pull,
        restarted.state,
        lambda: restarted.snapshot(1),
    ):
        with pytest.raises(HubRestarted) as refused:
            call()
        assert hub_lost(refused.value)
    restarted.restore(LearnedDrafters(eagle=True, block_size=0), version, params)
    got_version, got = restarted.pull()
    assert got_version == 3 and all(torch.equal(got[k], params[k]) for k in params)
    assert restarted.push_delta("w1", delta, 3, 2, 10, 0.5)[0] == 5
    assert not hub_lost(ValueError("a bad delta")) and hub_lost(ActorDiedError())
    # as the coordinator gets it from Ray: the refusal is the cause of a task error
    assert hub_lost(RayTaskError("pull", "traceback", HubRestarted("restarting")))
    assert not hub_lost(RayTaskError("pull", "traceback", ValueError("a bad delta")))
