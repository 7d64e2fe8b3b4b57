"""The spot trainer: a preemptible drafter-training thread inside a rollout worker.

The coordinator starts it when the worker is IDLE (its shard is done) and its slot is enabled,
and stops it when the device is needed. `stop()` sets a flag the loop checks between optimizer
steps, joins the thread and returns an acknowledgement with the worker's own timestamps (when the
request arrived, when the loop had stopped), so stop latency is measured from both processes.

Each iteration: take the next packed row of the worker's buffer, forward the local drafter copy
(bound to the worker's policy embedding and head), compute the EAGLE loss (a run with block arms: its
`DrafterSet`'s summed loss, `tlt.drafter.drafter_set`) and step the trainer's
own AdamW (grad clip 1.0, `tlt.drafter.objective.make_optimizer`). Every `sync_every` steps, and
when it stops, it pushes the change of its parameters since its last sync to the hub
(`DrafterHub.push_delta`) and continues from the parameters the hub returns (everyone's steps).
The AdamW moments live as long as the trainer (the whole run): they carry from one RL step to the
next and go into whole-run checkpoints with the buffer (`state_dict`).

The thread runs in the lowest CPU class there is (`lower_thread_priority`: Linux's SCHED_IDLE, else
nice 19): it harvests idle capacity, so where it shares host cores with a worker that still generates
(CPU rollouts, or a GPU host's launch threads) the generating process keeps its core
(`tlt.drafter.priority` says why SCHED_IDLE and not only a nice value).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from tlt.drafter.buffer import OnlineBuffer, PackedBatch
from tlt.drafter.drafter_set import DrafterSet, packed_block_agreement, packed_block_loss
from tlt.drafter.objective import MAX_GRAD_NORM, drafter_loss, make_optimizer
from tlt.drafter.priority import lower_thread_priority
from tlt.models.drafter import EagleDrafter

log = logging.getLogger(__name__)

# (trainer id, parameter delta, version it started from, optimizer steps, tokens, mean loss)
#   -> (new version, new params): `DrafterHub.push_delta`
PushFn = Callable[[str, dict[str, torch.Tensor], int, int, int, float], tuple[int, dict[str, torch.Tensor]]]

# Local optimizer steps between two syncs with the hub (one round trip each).
SYNC_EVERY = 16


def packed_loss(drafter: EagleDrafter | DrafterSet, packed: PackedBatch) -> torch.Tensor:
    """The EAGLE loss (a scalar with its graph) on one packed row (moved to the drafter's device); for a
    `DrafterSet` the sum of its members' losses (`tlt.drafter.drafter_set`)."""
    if isinstance(drafter, DrafterSet):
        loss = packed_block_loss(drafter.block, packed)
        return loss if drafter.eagle is None else loss + packed_loss(drafter.eagle, packed)
    b = packed.to(drafter.device).batch
    pred = drafter(b.input_ids, b.features, b.position_ids, segments=packed.segments)  # [1, T, H]
    with torch.no_grad():
        target_logits = drafter.logits(b.target)  # [1, T, V]
    return drafter_loss(pred, drafter.logits(pred), b.target, target_logits, b.mask).total


def packed_gradients(drafter: EagleDrafter | DrafterSet, packed: PackedBatch) -> tuple[dict[str, torch.Tensor], float]:
    """Gradients of the EAGLE loss on one packed row, by parameter name, and the loss value."""
    drafter.zero_grad(set_to_none=True)
    loss = packed_loss(drafter, packed)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in drafter.named_parameters() if p.grad is not None}
    return grads, float(loss.detach())


def local_step(drafter: EagleDrafter | DrafterSet, optimizer: torch.optim.Optimizer, packed: PackedBatch) -> float:
    """One optimizer step on one packed row (grad clip `MAX_GRAD_NORM`); returns the loss value."""
    optimizer.zero_grad(set_to_none=True)
    loss = packed_loss(drafter, packed)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(drafter.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


@torch.no_grad()
def packed_agreement(drafter: EagleDrafter | DrafterSet, packs: list[PackedBatch]) -> tuple[int, int]:
    """(positions where argmax head(drafter) == argmax head(f[t+1]), positions counted), response only; for a
    `DrafterSet` the EAGLE member's counts plus the block member's (every block offset)."""
    if isinstance(drafter, DrafterSet):
        counts = [packed_block_agreement(drafter.block, packs)]
        counts += [packed_agreement(drafter.eagle, packs)] if drafter.eagle is not None else []
        return sum(a for a, _ in counts), sum(t for _, t in counts)
    agree = total = 0
    for packed in packs:
        b = packed.to(drafter.device).batch
        pred = drafter(b.input_ids, b.features, b.position_ids, segments=packed.segments)
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
    priority: str | None = None  # what the thread trained at (`lower_thread_priority`); None: not lowered

    def summary(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "started_at": self.started_at,
            "stop_received_at": self.stop_received_at,
            "stopped_at": self.stopped_at,
            "iterations": self.iterations,
            "tokens": self.tokens,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "version_last": self.versions[-1] if self.versions else None,
            "error": self.error,
            "priority": self.priority,
        }


class SpotTrainer:
    """One worker's trainer thread over its buffer, its local drafter copy and its own AdamW."""

    def __init__(
        self,
        trainer_id: str,
        drafter: EagleDrafter | DrafterSet,
        buffer: OnlineBuffer,
        push: PushFn,
        *,
        learning_rate: float,
        sync_every: int = SYNC_EVERY,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.trainer_id = trainer_id
        self.drafter = drafter
        self.buffer = buffer
        self.push = push
        self.sync_every = sync_every
        self.optimizer = make_optimizer(drafter, learning_rate)
        self._optimizer_lock = threading.Lock()  # a checkpoint may copy the moments while the loop steps
        self.version = 0
        self._base: dict[str, torch.Tensor] = self._params()  # the parameters of `version`
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

    def _params(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.drafter.named_parameters()}

    def _load(self, version: int, params: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in self.drafter.state_dict().items():
                tensor.copy_(params[name])
        self.version = version
        self._base = self._params()

    def _sync(self, run: TrainerRun, steps: int, tokens: int, loss_sum: float) -> None:
        """Push the change since the last sync (`steps` local steps) and continue from the hub's sum."""
        with torch.no_grad():
            delta = {n: p.detach() - self._base[n] for n, p in self.drafter.named_parameters()}
        version, params = self.push(self.trainer_id, delta, self.version, steps, tokens, loss_sum / steps)
        self._load(version, params)
        run.versions.append(version)

    def state_dict(self) -> dict[str, Any]:
        """The buffer (`OnlineBuffer.state_dict`), the shuffle epoch and the AdamW state, for whole-run
        checkpoints. Safe while training: the loop only reads the buffer, samples enter only while
        stopped, and the optimizer state is copied between two of its steps."""
        with self._optimizer_lock:
            optimizer = copy.deepcopy(self.optimizer.state_dict())
        return {"buffer": self.buffer.state_dict(), "epoch": self._epoch, "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` (only while stopped). A state written before trainers kept their own
        optimizer has no "optimizer": the moments then start fresh."""
        if self.active:
            raise RuntimeError(f"trainer {self.trainer_id}: cannot restore its buffer while training")
        self.buffer.load_state_dict(state["buffer"])
        self._epoch = int(state["epoch"])
        if state.get("optimizer") is not None:
            with self._optimizer_lock:
                self.optimizer.load_state_dict(state["optimizer"])

    def start(self, step: int, after: Future | None = None) -> float:
        """Start training in the background; returns the start time. No-op error if already running.

        after: work that must finish first (the step's samples entering the buffer, the candidate's
        scoring and load); the thread waits for it, or for a stop, before its first gradient. A stop
        never waits for it: it keeps running on its own thread."""
        if self.active:
            raise RuntimeError(f"trainer {self.trainer_id} is already training")
        self._stop.clear()
        self.current = TrainerRun(step=step, started_at=time.time())
        self._thread = threading.Thread(
            target=self._loop, args=(self.current, after), name=f"spot-{self.trainer_id}", daemon=True
        )
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
            return {"step": None, "stop_received_at": received, "stopped_at": time.time(), "iterations": 0, "tokens": 0}
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
        run.priority = lower_thread_priority()
        self._train(run, epochs=None)

    def train_epochs(self, step: int, epochs: int = 1) -> dict[str, Any]:
        """Train on the caller's thread: `epochs` passes over the buffer (every packed row once each), synced
        with the hub every `sync_every` steps and at the end; returns the run's summary (`TrainerRun`). For a
        process with no idle device time to harvest (the in-process executor): a fixed amount of work, so a
        resumed run repeats it exactly."""
        if self.active:
            raise RuntimeError(f"trainer {self.trainer_id} is already training")
        run = TrainerRun(step=step, started_at=time.time())
        self._stop.clear()
        self._training = True
        self._train(run, epochs=epochs)
        run.stop_received_at = run.stopped_at = time.time()
        return run.summary()

    def _train(self, run: TrainerRun, epochs: int | None) -> None:
        """The optimizer steps over the buffer's epochs until stopped (`epochs` None) or `epochs` passes."""
        self.drafter.train()
        steps = tokens = 0  # since the last sync
        loss_sum = 0.0
        passes = 0
        try:
            while not self._stop.is_set() and (epochs is None or passes < epochs):
                batches = self.buffer.batches(self._epoch)
                self._epoch += 1
                passes += 1
                if not batches and epochs is None:
                    self._stop.wait(0.05)
                    continue
                for packed in batches:
                    if self._stop.is_set():
                        break
                    with self._optimizer_lock:
                        loss = local_step(self.drafter, self.optimizer, packed)
                    steps, tokens, loss_sum = steps + 1, tokens + packed.num_trained, loss_sum + loss
                    run.iterations += 1
                    run.tokens += packed.num_trained
                    run.losses.append(loss)
                    if steps == self.sync_every:
                        self._sync(run, steps, tokens, loss_sum)
                        steps = tokens = 0
                        loss_sum = 0.0
            if steps:  # stopping: the last steps reach the hub before the stop is acknowledged
                self._sync(run, steps, tokens, loss_sum)
        except Exception as exc:  # reported in the stop acknowledgement; the rollout must not die with it
            log.exception("trainer %s failed", self.trainer_id)
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.drafter.eval()
            self.drafter.zero_grad(set_to_none=True)
            self._training = False
