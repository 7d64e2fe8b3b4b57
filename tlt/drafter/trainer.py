"""The spot trainer: a preemptible drafter-training thread inside a rollout worker.

The coordinator starts it when the worker is IDLE (its shard is done) and its slot is enabled,
and stops it when the device is needed. `stop()` sets a flag the loop checks between optimizer
steps, joins the thread and returns an acknowledgement with the worker's own timestamps (when the
request arrived, when the loop had stopped), so stop latency is measured from both processes.

Each iteration: take the next packed row of the worker's buffer, forward the local drafter copy
(bound to the worker's policy embedding and head), compute the EAGLE loss, push the gradient to
the hub (`HubClient`) and load the parameters it returns. The trainer never steps an optimizer
itself: the hub owns the one optimizer of the one drafter.

The thread runs at the lowest CPU priority (`TRAINER_NICE`): it harvests idle capacity, so where it
shares host cores with a worker that still generates (CPU rollouts, or a GPU host's launch threads)
the scheduler gives the generating process the core first. Linux applies a nice value per thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from tlt.drafter.buffer import OnlineBuffer, PackedBatch
from tlt.drafter.objective import drafter_loss
from tlt.models.drafter import EagleDrafter

log = logging.getLogger(__name__)

# (trainer id, gradients, version they were computed on, tokens, loss) -> (new version, new params)
PushFn = Callable[[str, dict[str, torch.Tensor], int, int, float], tuple[int, dict[str, torch.Tensor]]]

# The trainer thread's nice value: the lowest priority, below every rollout and serving thread.
TRAINER_NICE = 19


def lower_thread_priority(nice: int = TRAINER_NICE) -> int | None:
    """Raise the calling thread's nice value to `nice` (never lowers it: that needs privileges).

    Returns the thread's nice value afterwards, or None where the OS has no per-thread priority
    (not Linux) or refuses; the trainer then runs at its inherited priority.
    """
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return None
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        if current < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None


def packed_gradients(drafter: EagleDrafter, packed: PackedBatch) -> tuple[dict[str, torch.Tensor], float]:
    """Gradients of the EAGLE loss on one packed row, by parameter name, and the loss value."""
    b = packed.batch
    drafter.zero_grad(set_to_none=True)
    pred = drafter(b.input_ids, b.features, b.position_ids, attention_mask=packed.attn_mask)  # [1, T, H]
    with torch.no_grad():
        target_logits = drafter.logits(b.target)  # [1, T, V]
    loss = drafter_loss(pred, drafter.logits(pred), b.target, target_logits, b.mask).total
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in drafter.named_parameters() if p.grad is not None}
    return grads, float(loss.detach())


@torch.no_grad()
def packed_agreement(drafter: EagleDrafter, packs: list[PackedBatch]) -> tuple[int, int]:
    """(positions where argmax head(drafter) == argmax head(f[t+1]), positions counted), response only."""
    agree = total = 0
    for packed in packs:
        b = packed.batch
        pred = drafter(b.input_ids, b.features, b.position_ids, attention_mask=packed.attn_mask)
        same = drafter.logits(pred).argmax(-1) == drafter.logits(b.target).argmax(-1)  # [1, T]
        agree += int((same & b.mask).sum())
        total += int(b.mask.sum())
    return agree, total


@dataclass
class TrainerRun:
    """What one start..stop of the trainer did; times are this process's `time.time()`."""

    step: int
    started_at: float
    stop_received_at: float | None = None
    stopped_at: float | None = None
    iterations: int = 0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    error: str | None = None
    nice: int | None = None  # the thread's nice value while it trained; None: priority not lowered

    def summary(self) -> dict[str, Any]:
        return {
            "step": self.step, "started_at": self.started_at, "stop_received_at": self.stop_received_at,
            "stopped_at": self.stopped_at, "iterations": self.iterations, "tokens": self.tokens,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "version_last": self.versions[-1] if self.versions else None, "error": self.error,
            "nice": self.nice,
        }


class SpotTrainer:
    """One worker's trainer thread over its buffer and its local drafter copy."""

    def __init__(self, trainer_id: str, drafter: EagleDrafter, buffer: OnlineBuffer, push: PushFn) -> None:
        self.trainer_id = trainer_id
        self.drafter = drafter
        self.buffer = buffer
        self.push = push
        self.version = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: TrainerRun | None = None
        self._epoch = 0
        self._training = False  # past the start's `after` gate: taking gradients

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def load(self, version: int, params: dict[str, torch.Tensor]) -> None:
        """Take the hub's parameters (only while stopped, or while a started thread still waits for `after`)."""
        if self._training:
            raise RuntimeError(f"trainer {self.trainer_id}: cannot load parameters while training")
        self._load(version, params)

    def _load(self, version: int, params: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in self.drafter.state_dict().items():
                tensor.copy_(params[name])
        self.version = version

    def state_dict(self) -> dict[str, Any]:
        """The buffer (`OnlineBuffer.state_dict`) and the shuffle epoch, for whole-run checkpoints.
        Safe while training: the loop only reads the buffer, and samples enter only while stopped."""
        return {"buffer": self.buffer.state_dict(), "epoch": self._epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` (only while stopped)."""
        if self.active:
            raise RuntimeError(f"trainer {self.trainer_id}: cannot restore its buffer while training")
        self.buffer.load_state_dict(state["buffer"])
        self._epoch = int(state["epoch"])

    def start(self, step: int, after: Future | None = None) -> float:
        """Start training in the background; returns the start time. No-op error if already running.

        after: work that must finish first (the step's samples entering the buffer, the candidate's
        scoring and load); the thread waits for it, or for a stop, before its first gradient. A stop
        never waits for it: it keeps running on its own thread."""
        if self.active:
            raise RuntimeError(f"trainer {self.trainer_id} is already training")
        self._stop.clear()
        self.current = TrainerRun(step=step, started_at=time.time())
        self._thread = threading.Thread(target=self._loop, args=(self.current, after), name=f"spot-{self.trainer_id}",
                                        daemon=True)
        self._thread.start()
        return self.current.started_at

    def stop(self) -> dict[str, Any]:
        """Stop and acknowledge: returns the run's summary with stop_received_at and stopped_at."""
        received = time.time()
        run = self.current
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if run is None:
            return {"step": None, "stop_received_at": received, "stopped_at": time.time(), "iterations": 0,
                    "tokens": 0}
        run.stop_received_at = received
        run.stopped_at = time.time()
        self.current = None
        return run.summary()

    def _loop(self, run: TrainerRun, after: Future | None = None) -> None:
        while after is not None and not after.done():
            if self._stop.wait(0.01):
                run.started_at = time.time()  # stopped before it trained: nothing harvested
                return
        if after is not None and after.exception() is not None:
            run.error = f"{type(after.exception()).__name__}: {after.exception()}"
            return
        run.started_at = time.time()
        self._training = True
        run.nice = lower_thread_priority()
        self.drafter.train()
        try:
            while not self._stop.is_set():
                batches = self.buffer.batches(self._epoch)
                self._epoch += 1
                if not batches:
                    self._stop.wait(0.05)
                    continue
                for packed in batches:
                    if self._stop.is_set():
                        break
                    grads, loss = packed_gradients(self.drafter, packed)
                    version, params = self.push(self.trainer_id, grads, self.version, packed.num_trained, loss)
                    self._load(version, params)
                    run.iterations += 1
                    run.tokens += packed.num_trained
                    run.losses.append(loss)
                    run.versions.append(version)
        except Exception as exc:  # reported in the stop acknowledgement; the rollout must not die with it
            log.exception("trainer %s failed", self.trainer_id)
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.drafter.eval()
            self.drafter.zero_grad(set_to_none=True)
            self._training = False
