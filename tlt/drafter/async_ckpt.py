"""Asynchronous drafter snapshots: trainable parameters only, written by a background thread.

`submit(step, state)` copies the tensors (the only work on the caller's thread) and returns; a
writer thread saves them in the `save_drafter` layout (`model.safetensors` + `config.json`, what
`tlt.models.drafter.load_drafter` reads) under `<root>/step-NNNNNNNN-SSSS` (step, then a sequence
number, so a second snapshot of one step never replaces a folder in use), written to a temporary
folder and renamed, then points `<root>/LATEST` at it; older folders are pruned only after that.
If snapshots arrive faster than they are written, only the newest waiting one is kept (a snapshot
is superseded, never queued up). The writer runs at the spot trainers' lowest CPU priority.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from tlt.drafter.priority import lower_thread_priority
from tlt.models.drafter import CONFIG_FILE, WEIGHTS_FILE

log = logging.getLogger(__name__)

LATEST = "LATEST"


class AsyncCheckpointer:
    """Writes drafter snapshots under `root` on a daemon thread; keeps the newest `keep`."""

    def __init__(self, root: str | Path, config: LlamaConfig, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.config = config
        self.keep = keep
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._sequence = 0
        self.written: list[dict[str, float]] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="drafter-ckpt", daemon=True)
        self._thread.start()

    def submit(self, step: int, state: dict[str, torch.Tensor]) -> float:
        """Hand over a snapshot of `state` for `step`; returns the seconds the caller spent (the copy)."""
        started = time.perf_counter()
        copy = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
        with self._cond:
            if self._closed:
                raise RuntimeError("AsyncCheckpointer is closed")
            self._pending = (step, copy)
            self._cond.notify()
        return time.perf_counter() - started

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted snapshot is on disk; False on timeout. Re-raises a writer error."""
        with self._cond:
            done = self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)
        if self.error is not None:
            raise RuntimeError(f"drafter snapshot failed: {self.error}") from self.error
        return done

    def close(self) -> None:
        self.wait()
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def latest(self) -> Path | None:
        pointer = self.root / LATEST
        return self.root / pointer.read_text().strip() if pointer.exists() else None

    def _loop(self) -> None:
        lower_thread_priority()  # background work: the rollouts keep their cores (tlt.drafter.priority)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                step, state = self._pending
                self._pending, self._busy = None, True
            try:
                started = time.perf_counter()
                self._write(step, state)
                self.written.append({"step": step, "seconds": time.perf_counter() - started})
            except OSError as exc:  # surfaced by wait(); the run's whole-run checkpoints still hold the drafter
                log.error("drafter snapshot of step %d failed: %s", step, exc)
                self.error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, step: int, state: dict[str, torch.Tensor]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._sequence += 1
        name = f"step-{step:08d}-{self._sequence:04d}"
        tmp = self.root / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "step": str(step)})
        (tmp / CONFIG_FILE).write_text(json.dumps(self.config.to_dict(), indent=2, sort_keys=True))
        final = self.root / name
        os.replace(tmp, final)
        pointer = self.root / f".tmp-{LATEST}-{os.getpid()}"
        pointer.write_text(name)
        os.replace(pointer, self.root / LATEST)
        for old in sorted(p for p in self.root.glob("step-*") if p.is_dir())[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        log.debug("drafter snapshot of step %d written to %s", step, final)
