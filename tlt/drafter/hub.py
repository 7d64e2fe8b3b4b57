"""The drafter hub: ONE drafter's trainable parameters, shared by every active trainer.

Data parallelism by parameter server, in two forms:
- `push_delta` (what the spot trainers use): a trainer takes several optimizer steps with its own
  AdamW on its own copy (its worker's buffer is its data shard), then pushes the change of its
  parameters since it last synced, `delta`; the hub adds it and returns the sum of everything
  pushed. One round trip per `SYNC_EVERY` steps instead of one per step: on shared cores each
  round trip costs the rollout still decoding (docs/measurements-history.md). Each trainer's AdamW
  moments live with the trainer for the whole run (and go into whole-run checkpoints with its online
  buffer).
- `push` (a gradient): the hub steps its own AdamW (grad clip 1.0, AdamW 0.9/0.95, wd 0.01:
  `tlt.drafter.objective.make_optimizer`); used where one process emulates trainers (the online
  drafter bench).
Either way N active trainers make N trainers' worth of steps on one drafter; a trainer that is
stopped simply stops pushing, so preemption never stalls the others (an all-reduce group would
have to be rebuilt every time a trainer leaves). The hub never binds an embedding or head: it
only holds the drafter's own parameters. `version` counts optimizer steps applied.

A run with block arms holds a `DrafterSet` here instead (`tlt.drafter.drafter_set`: its EAGLE and block
drafters as one module, one parameter dict): the hub is built from the policy's config alone, so each
rollout worker tells it which drafters the run learns as it starts (`use_drafters`, the same answer from
every worker; refused once parameters have changed). Snapshots then write each member as its own
`save_drafter` folder: the EAGLE drafter's under the snapshot folder as before, the block drafter's under
its `block/`.

The hub runs as a Ray actor (`tlt.runtime.ray_actors`); this class has no Ray in it.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig

from tlt.drafter.async_ckpt import AsyncCheckpointer
from tlt.drafter.drafter_set import BLOCK_SNAPSHOTS, DrafterSet, member_params, unbound_drafter_set
from tlt.drafter.objective import MAX_GRAD_NORM, make_optimizer
from tlt.models.drafter import EagleDrafter
from tlt.spec.plan import LearnedDrafters

log = logging.getLogger(__name__)


class DrafterHub:
    """Parameters (float32) + AdamW of one EagleDrafter (or `DrafterSet`); `version` counts applied steps."""

    def __init__(
        self,
        config: LlamaConfig,
        learning_rate: float,
        *,
        seed: int = 0,
        snapshot_dir: str | Path | None = None,
    ) -> None:
        torch.manual_seed(seed)
        self.config, self.learning_rate, self.seed = config, learning_rate, seed
        self.drafter: EagleDrafter | DrafterSet = EagleDrafter(config).float()
        self.learned = LearnedDrafters(eagle=True, block_size=0)
        self.optimizer = make_optimizer(self.drafter, learning_rate)
        self.version = 0
        self.pushes: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.snapshot_dir = None if snapshot_dir is None else Path(snapshot_dir)
        self.checkpointer = AsyncCheckpointer(snapshot_dir, config) if snapshot_dir is not None else None
        self.block_checkpointer: AsyncCheckpointer | None = None

    def use_drafters(self, learned: LearnedDrafters) -> None:
        """Hold the drafters of `learned` (`tlt.drafter.drafter_set.learned_drafters` of the run's spec): the
        EAGLE drafter alone, or a `DrafterSet` when the run has block arms. Idempotent; once the parameters
        have changed (version > 0) a different answer raises ValueError."""
        with self._lock:
            if learned == self.learned:
                return
            if self.version:
                raise ValueError(
                    f"the drafter hub holds {self.learned} at version {self.version}; cannot switch to {learned}"
                )
            if not learned.block_size:
                raise ValueError("DrafterHub.use_drafters: without block arms the hub keeps its EAGLE drafter")
            torch.manual_seed(self.seed)
            self.drafter = unbound_drafter_set(self.config, learned).float()
            self.optimizer = make_optimizer(self.drafter, self.learning_rate)
            self.learned = learned
            if self.snapshot_dir is not None:
                self.block_checkpointer = AsyncCheckpointer(
                    self.snapshot_dir / BLOCK_SNAPSHOTS, self.drafter.block.config
                )
                if self.drafter.eagle is None and self.checkpointer is not None:  # no EAGLE drafter to snapshot
                    self.checkpointer.close()
                    self.checkpointer = None

    def params(self) -> dict[str, torch.Tensor]:
        """The current trainable parameters (copies)."""
        with self._lock:
            return {k: v.detach().clone() for k, v in self.drafter.state_dict().items()}

    def pull(self) -> tuple[int, dict[str, torch.Tensor]]:
        with self._lock:
            return self.version, {k: v.detach().clone() for k, v in self.drafter.state_dict().items()}

    def push(
        self, trainer: str, grads: dict[str, torch.Tensor], based_on: int, tokens: int, loss: float
    ) -> tuple[int, dict[str, torch.Tensor]]:
        """Apply one trainer's gradient; return (new version, new parameters).

        grads: parameter name -> gradient, same names and shapes as the drafter's parameters.
        based_on: the version the gradient was computed against (its staleness is recorded).
        """
        named = dict(self.drafter.named_parameters())
        if set(grads) != set(named):
            raise ValueError(
                f"trainer {trainer!r}: gradient keys differ from the drafter's parameters "
                f"(missing {sorted(set(named) - set(grads))[:3]}, unexpected {sorted(set(grads) - set(named))[:3]})"
            )
        with self._lock:
            for name, param in named.items():
                param.grad = grads[name].to(param.dtype)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), MAX_GRAD_NORM))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.pushes.append(
                {
                    "time": time.time(),
                    "trainer": trainer,
                    "version": self.version + 1,
                    "staleness": self.version - based_on,
                    "tokens": tokens,
                    "loss": loss,
                    "grad_norm": grad_norm,
                    "steps": 1,
                }
            )
            self.version += 1
            return self.version, {k: v.detach().clone() for k, v in self.drafter.state_dict().items()}

    def push_delta(
        self, trainer: str, delta: dict[str, torch.Tensor], based_on: int, steps: int, tokens: int, loss: float
    ) -> tuple[int, dict[str, torch.Tensor]]:
        """Add one trainer's parameter change (`steps` local optimizer steps, `tokens` trained, mean
        `loss`); return (new version, new parameters).

        delta: parameter name -> (its parameters now - the parameters of version `based_on`), same
        names and shapes as the drafter's parameters.
        """
        named = dict(self.drafter.named_parameters())
        if set(delta) != set(named):
            raise ValueError(
                f"trainer {trainer!r}: delta keys differ from the drafter's parameters "
                f"(missing {sorted(set(named) - set(delta))[:3]}, unexpected {sorted(set(delta) - set(named))[:3]})"
            )
        if steps < 1:
            raise ValueError(f"trainer {trainer!r}: a delta covers >= 1 optimizer step, got steps={steps}")
        with self._lock, torch.no_grad():
            for name, param in named.items():
                param.add_(delta[name].to(param.dtype))
            self.pushes.append(
                {
                    "time": time.time(),
                    "trainer": trainer,
                    "version": self.version + steps,
                    "staleness": self.version - based_on,
                    "tokens": tokens,
                    "loss": loss,
                    "steps": steps,
                }
            )
            self.version += steps
            return self.version, {k: v.detach().clone() for k, v in self.drafter.state_dict().items()}

    def take_pushes(self) -> list[dict[str, Any]]:
        """The push records since the last call (trainer, version, staleness, tokens, loss, time)."""
        with self._lock:
            out, self.pushes = self.pushes, []
            return out

    def snapshot(self, step: int) -> float:
        """Queue an asynchronous snapshot of the parameters; returns the seconds it held the caller."""
        if self.snapshot_dir is None:
            raise RuntimeError("DrafterHub was created without snapshot_dir; no snapshots to write")
        with self._lock:
            members = member_params(self.drafter.state_dict())
            held = 0.0
            for name, checkpointer in (("eagle", self.checkpointer), ("block", self.block_checkpointer)):
                if checkpointer is not None and name in members:
                    held += checkpointer.submit(step, members[name])
            return held

    def wait_snapshots(self, timeout: float | None = None) -> bool:
        return all(c.wait(timeout) for c in (self.checkpointer, self.block_checkpointer) if c is not None)

    def state(self) -> dict[str, Any]:
        """Everything a whole-run checkpoint needs to resume the hub exactly: parameters, AdamW
        moments and version, copied under the lock (trainers may go on pushing while it is written)."""
        with self._lock:
            return {
                "params": {k: v.detach().clone() for k, v in self.drafter.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "version": self.version,
            }

    def load_params(self, params: dict[str, torch.Tensor]) -> None:
        """Start from given drafter parameters (e.g. `speculative.drafterPath`: `tlt.drafter.warmstart`) with a
        fresh optimizer. A hub holding a `DrafterSet` takes each member the parameters hold (a plain EAGLE
        drafter's: its EAGLE member); the others start fresh."""
        with self._lock:
            if not isinstance(self.drafter, DrafterSet):
                self.drafter.load_state_dict(params)
                return
            for name, part in member_params(params).items():
                member = getattr(self.drafter, name)
                if member is None:
                    raise ValueError(
                        "speculative.drafterPath holds an EAGLE drafter, and this run's arms use the block drafter "
                        "only: add a chain, tree or mixed arm, or drop speculative.drafterPath"
                    )
                member.load_state_dict(part)

    def drafters(self) -> LearnedDrafters:
        """The drafters the hub holds (`use_drafters`)."""
        return self.learned

    def load_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.drafter.load_state_dict(state["params"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = int(state["version"])
        log.info("drafter hub restored at version %d", self.version)
