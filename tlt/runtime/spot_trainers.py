"""The coordinator's side of the rollout workers' spot trainers: whose slot may train, starting and stopping
them, and what they did in a step.

Slots (`drafter.enabledSlots`): `all` / `none` are fixed. `auto` follows a slot list written by someone
else, read at each decision (a change takes effect at the next worker that turns idle):
- in a cluster, the operator's `.status.drafter.enabledSlots` (`tlt.runtime.k8s_slots`);
- on one machine, a JSON file `{"enabled": ["rollout-0", ...]}` at `$TLT_SLOTS_FILE`, else
  `<out>/slots.json`, written by hand or by a script.
While no list has been written, every slot is enabled.

Stopping: every trainer is stopped, and acknowledges (its timestamps and ours), when its device is needed:
with `stop_at="update"` (one machine: rollout and update share the device) when every shard is done, before
the policy update; with `"rollout"` (rollout pods with their own devices) before the next step's first
rollout token, so trainers also harvest the update phase (`running` carries them into the next step).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from tlt.runtime import k8s_slots

log = logging.getLogger(__name__)

SLOTS_FILE = "slots.json"
STOP_POINTS = ("update", "rollout")
Emit = Callable[..., None]  # emit(kind, **info): one run event


class SlotSource:
    """Whether a rollout worker's trainer slot is enabled (the slow timescale's answer)."""

    def __init__(self, mode: str, out_dir: Path) -> None:
        if mode not in ("auto", "all", "none"):
            raise ValueError(f"drafter.enabledSlots must be auto, all or none, got {mode!r}")
        self.mode = mode
        self.path = Path(os.environ.get("TLT_SLOTS_FILE", out_dir / SLOTS_FILE))

    def enabled(self, worker: str) -> bool:
        if self.mode != "auto":
            return self.mode == "all"
        from_operator = k8s_slots.enabled_workers()
        if from_operator is not None:
            return worker in from_operator
        if not self.path.exists():
            return True
        try:
            listed = json.loads(self.path.read_text()).get("enabled", [])
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            raise ValueError(f'{self.path}: expected {{"enabled": [worker names]}}: {exc}') from exc
        return worker in listed


class SpotTrainers:
    """The step's trainers (worker actor -> when its start was requested), started and stopped on the actors.

    emit(kind, **info) records a run event; emit_workers() the workers' states after a change."""

    def __init__(
        self, slots: SlotSource, max_trainers: int, stop_at: str, emit: Emit, emit_workers: Callable[[], None]
    ) -> None:
        if stop_at not in STOP_POINTS:
            raise ValueError(f"stop_trainers_at must be 'update' or 'rollout', got {stop_at!r}")
        self.slots = slots
        self.max_trainers = max_trainers
        self.stop_at = stop_at
        self.emit = emit
        self.emit_workers = emit_workers
        self.running: dict[Any, float] = {}  # trainers still running from the last step (stop_at="rollout")
        self.recoveries: list[dict[str, Any]] = []  # sidecar trainers restarted alone since `take_recoveries`

    def starts(self, worker: str, started: dict[Any, float], last: bool) -> bool:
        """Whether `worker`, whose shard just finished, starts a trainer (`started`: those started this step;
        `last`: no shard is still out, so nothing is idle until the update). Where trainers stop when the
        update starts, the last shard's worker starts none while another trainer of this step runs: it
        would be stopped at once, its start and stop round trips on the step's critical path for nothing."""
        if len(started) >= self.max_trainers or not self.slots.enabled(worker):
            return False
        return not (last and started and self.stop_at == "update")

    def start(self, worker: Any, name: str, step: int, started: dict[Any, float]) -> Any:
        """Ask `worker` (named `name`) to start training for `step`; returns the call's object ref."""
        requested = time.time()
        ref = worker.start_training.remote(step)
        started[worker] = requested
        self.emit("trainer", worker=name, action="start", requested_at=requested)
        return ref

    def stop(self, trainers: dict[Any, float]) -> list[dict[str, Any]]:
        """Stop every trainer in `trainers` and collect acknowledgements (both processes' timestamps)."""
        if not trainers:
            return []
        requested = time.time()
        acks = ray.get([w.stop_training.remote() for w in trainers])
        acked = time.time()
        for ack, started in zip(acks, trainers.values()):
            ack.update(requested_at=requested, acked_at=acked, start_requested_at=started)
            if ack.get("error"):
                log.warning("trainer on %s failed: %s", ack["worker"], ack["error"])
            if ack.get("trainer_lost"):  # its sidecar's process was lost and restarts alone (`ray_sidecar`)
                record = {"lost": f"{ack['worker']}'s drafter trainer", "reason": ack["trainer_lost"], "at": acked}
                self.recoveries.append({**record, "trainer_restarted": True})
                self.emit("trainer_restarted", worker=ack["worker"], reason=ack["trainer_lost"])
            self.emit(
                "trainer",
                worker=ack["worker"],
                action="stop",
                requested_at=requested,
                acked_at=acked,
                stopped_at=ack["stopped_at"],
            )
        self.emit_workers()
        return acks

    def take_recoveries(self) -> list[dict[str, Any]]:
        """The trainers restarted alone since the last call (records for the step's `recoveries`)."""
        out, self.recoveries = self.recoveries, []
        return out

    def stop_running(self) -> list[dict[str, Any]]:
        """Stop the trainers carried over from the last step (before a rollout, a checkpoint, the end)."""
        acks = self.stop(self.running)
        self.running = {}
        return acks

    def after_rollout(self, carried: list[dict[str, Any]], started: dict[Any, float]) -> list[dict[str, Any]]:
        """Every shard is back: stop this step's trainers now (`stop_at="update"`) or carry them into the next
        step. Returns the acknowledgements of the step: `carried` (the last step's) and those stopped now."""
        if self.stop_at == "update":
            return carried + self.stop(started)
        self.running = started
        return carried
