"""A rollout worker's drafter: the copy it drafts with, and what trains it.

In modes static / tlt the worker holds an EAGLE drafter bound to its policy copy (the policy's frozen
embedding and head), optionally over a reduced draft vocabulary re-picked every rollout. Each rollout
loads the step's served drafter into it. What trains it depends on `drafter.placement`:
- `in-container`: an online buffer and a spot trainer, a thread in the worker's process that shares the
  device once the engine has released its KV cache, syncing its parameter change with the hub;
- `sidecar`: the buffer and the trainer live in the pod's sidecar container (`tlt.runtime.ray_sidecar`);
  the worker hands each step's rollouts (hidden states included, straight to the sidecar, never through
  the coordinator) and forwards the coordinator's start / stop, so it stays the one reporter of its state.
Modes off and ngram keep no drafter: every method here is then a no-op or says what is missing.
A run with block arms holds its EAGLE and block drafters as one `DrafterSet` (`tlt.drafter.drafter_set`):
one copy to load, train, sync with the hub and checkpoint; `eagle` and `block` are what the arms draft with.
Its trainer lives in the container only (`drafter.placement: sidecar` is refused for block arms).
"""

from __future__ import annotations

import copy
import logging
import time
from concurrent.futures import Future
from typing import Any

import torch

from tlt.drafter.buffer import OnlineBuffer
from tlt.drafter.drafter_set import DrafterSet, new_drafter_set
from tlt.drafter.hub import DrafterHub
from tlt.drafter.intake import buffer_and_agreement, policy_head
from tlt.drafter.trainer import SpotTrainer
from tlt.models.block_drafter import BlockDrafter
from tlt.models.draft_vocab import DraftVocabTracker
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.runtime.devices import to_cpu, tree_to_cpu
from tlt.runtime.optional_ray import ray
from tlt.spec.plan import learned_drafters, learns_drafters
from tlt.spec.run import RunSpec
from tlt.workers.services import hub_push, no_hub

log = logging.getLogger(__name__)

Drafter = tuple[int, dict[str, torch.Tensor]]  # (version, parameters)
NO_AGREEMENT = {"agree": 0, "agree_total": 0}


class WorkerDrafter:
    """The drafter of worker `name` for `model` (its policy copy), its trainer or sidecar, its draft vocabulary."""

    def __init__(self, name: str, spec: RunSpec, model: Any) -> None:
        self.name = name
        self.spec = spec
        self.drafter: EagleDrafter | DrafterSet | None = None
        self.buffer: OnlineBuffer | None = None
        self.trainer: SpotTrainer | None = None
        self.sidecar: Any | None = None
        self.sidecar_lost: str | None = None  # why the sidecar's process was lost since the last stop's ack
        self.learned = learned_drafters(spec.speculative, model.config.num_hidden_layers)
        if self.learned.block_size:
            if spec.drafter.placement == "sidecar":
                raise ValueError(
                    "speculative.arms of kind block train in the rollout container: set drafter.placement "
                    "'in-container', or drop the block arms"
                )
            self.drafter = new_drafter_set(model, self.learned)
        elif learns_drafters(spec.speculative):
            self.drafter = EagleDrafter(drafter_config_from_target(model.config)).to(model.device, torch.float32).eval()
            self.drafter.bind_policy(model)
        # the reduced draft vocabulary (before the drafter's graphs compile), re-picked every rollout
        size = spec.speculative.draft_vocab if self.drafter is not None else 0
        self.draft_vocab = (
            DraftVocabTracker(self.drafter.set_draft_vocab(size), model.get_output_embeddings()) if size else None
        )

    @property
    def eagle(self) -> EagleDrafter | None:
        """The EAGLE drafter the chain, tree and mixed arms draft with (None without one)."""
        return self.drafter.eagle if isinstance(self.drafter, DrafterSet) else self.drafter

    @property
    def block(self) -> BlockDrafter | None:
        """The block drafter the block arms draft with (None without block arms)."""
        return self.drafter.block if isinstance(self.drafter, DrafterSet) else None

    def setup_trainer(self, hub: Any | None) -> None:
        """The co-located spot trainer and its buffer (`drafter.placement: in-container`); with block arms the
        hub is told first to hold the run's drafter set (`DrafterHub.use_drafters`). `hub`: the hub actor, or
        in one process the `DrafterHub` itself."""
        local = isinstance(hub, DrafterHub)
        if hub is not None and isinstance(self.drafter, DrafterSet):
            if local:
                hub.use_drafters(self.learned)
            else:
                ray.get(hub.use_drafters.remote(self.learned))
        if self.drafter is not None and self.spec.drafter.placement == "in-container":
            self.buffer = OnlineBuffer(
                self.spec.drafter.buffer_steps, self.spec.drafter.batch_tokens, seed=self.spec.algorithm.seed
            )
            push = hub.push_delta if local else hub_push(hub) if hub is not None else no_hub
            self.trainer = SpotTrainer(
                self.name, self.drafter, self.buffer, push, learning_rate=self.spec.drafter.learning_rate
            )

    def attach_sidecar(self, sidecar: Any) -> None:
        """Train with `sidecar` (a `SidecarTrainer` actor; `drafter.placement: sidecar`). A replacement worker's
        sidecar may still train for its lost predecessor: that training is stopped (its steps reach the hub)."""
        if self.drafter is None or self.trainer is not None:
            raise RuntimeError(
                f"{self.name}: a sidecar trainer needs speculative.mode static or tlt and drafter.placement 'sidecar'"
            )
        self.sidecar = sidecar
        self._ask_sidecar("stop_training", lost=None)

    def check_ready(self, step: int) -> None:
        """Raise unless a rollout of `step` may start: no trainer still running, a sidecar where one belongs."""
        if self.trainer is not None and self.trainer.active:
            raise RuntimeError(f"{self.name}: rollout of step {step} asked while its trainer still runs")
        if self.drafter is not None and self.trainer is None and self.sidecar is None:
            raise RuntimeError(f"{self.name}: drafter.placement is 'sidecar' but no sidecar trainer is attached")

    def load(self, drafter: Drafter | None) -> None:
        """Draft with `drafter` (the step's served one); the trainer continues from it."""
        if drafter is not None and self.trainer is not None:
            self.trainer.load(*drafter)
        elif drafter is not None and self.drafter is not None:
            self.drafter.load_state_dict(drafter[1])

    def iterations(self, training: bool) -> int:
        """The running trainer's iterations this step (`training`: the worker reports TRAINING)."""
        if self.sidecar is not None:
            return self._ask_sidecar("iterations", lost=0) if training else 0
        run = self.trainer.current if self.trainer is not None else None
        return run.iterations if run is not None else 0

    def take_rollouts(
        self, model: Any, completions: list[Any], step: int, drafter: Drafter | None, candidate: Drafter | None
    ) -> dict[str, Any]:
        """Buffer `step`'s completions (with hidden states) and score the drafter (and a `candidate`, which the
        trainer then holds) on them: the top-1 agreement ("agree", "agree_total", "candidate_*"). `model`: the
        policy copy, whose head a sidecar needs."""
        if self.sidecar is not None:
            head = to_cpu(policy_head(model))
            return self._ask_sidecar("take_rollouts", step, completions, head, drafter, candidate, lost=NO_AGREEMENT)
        if self.trainer is None or self.buffer is None:
            return dict(NO_AGREEMENT)
        return buffer_and_agreement(
            self.buffer, self.trainer, completions, step, self.spec.drafter.batch_tokens, candidate
        )

    def state(self) -> dict[str, Any] | None:
        """The trainer's buffer and shuffle epoch (`SpotTrainer.state_dict`), in the container or the sidecar,
        and the draft vocabulary's counts; None without a learned drafter."""
        if self.sidecar is not None:
            state = self._ask_sidecar("trainer_state", lost=None)
        else:
            state = tree_to_cpu(self.trainer.state_dict()) if self.trainer is not None else None
        if state is not None and self.draft_vocab is not None:  # the draft vocabulary's token counts too
            state["draft_vocab_counts"] = self.draft_vocab.counts.clone()
        return state

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Resume the trainer's buffer (and the draft vocabulary's counts) from a checkpoint."""
        if state is None:
            return
        state = dict(state)
        counts = state.pop("draft_vocab_counts", None)
        if counts is not None and self.draft_vocab is not None:
            self.draft_vocab.load_counts(counts)
        if self.sidecar is not None:
            self._ask_sidecar("load_trainer_state", state, lost=None)
        elif self.trainer is not None:
            self.trainer.load_state_dict(state)
        else:
            raise RuntimeError(
                f"{self.name}: the checkpoint holds a drafter buffer but speculative.mode "
                f"{self.spec.speculative.mode!r} keeps none"
            )

    def start(self, step: int, after: Future | None) -> float:
        """Start training for `step` once `after` (the rollout's samples entering the buffer) is done."""
        if self.sidecar is not None:
            return self._ask_sidecar("start_training", step, lost=time.time())
        if self.trainer is not None:
            return self.trainer.start(step, after=after)
        raise RuntimeError(f"{self.name}: speculative.mode {self.spec.speculative.mode!r} has no drafter to train")

    def stop(self) -> dict[str, Any]:
        """Stop the trainer (if running); the acknowledgement with the trainer process's timestamps and
        "was_training" (whether a trainer was stopped)."""
        if self.sidecar is not None:
            now = time.time()
            ack = dict(self._ask_sidecar("stop_training", lost={"stop_received_at": now, "stopped_at": now}))
            ack.setdefault("was_training", False)
            if self.sidecar_lost is not None:
                ack["trainer_lost"], self.sidecar_lost = self.sidecar_lost, None
            return ack
        if self.trainer is None or not self.trainer.active:
            now = time.time()
            return {"was_training": False, "stop_received_at": now, "stopped_at": now}
        return {"was_training": True, **self.trainer.stop()}

    def _ask_sidecar(self, method: str, *args: Any, lost: Any) -> Any:
        """`method(*args)` of the sidecar trainer; `lost` (copied) when its process is lost: Ray restarts it
        (`ray_sidecar.SIDECAR_RESTARTS`) with an empty buffer, and the rollout goes on without its trainer
        until then (the next stop's ack says so: "trainer_lost")."""
        from tlt.runtime.failure_kinds import LOST, classify, failure_line  # Ray's errors: only a sidecar's calls

        try:
            return ray.get(getattr(self.sidecar, method).remote(*args))
        except Exception as exc:
            if classify(exc) != LOST:
                raise
            self.sidecar_lost = failure_line(exc)
            log.warning("%s: its sidecar trainer was lost (%s); Ray restarts it", self.name, self.sidecar_lost)
            return copy.copy(lost)
