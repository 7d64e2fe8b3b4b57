"""The in-process executor: every role of a run in this process, no Ray (`tlt train --local`).

The policy role (`tlt.workers.policy.PolicyRole`) updates the policy; one rollout worker
(`tlt.workers.local_rollout.LocalWorker`: the same generation, arms, bandit, history and drafters as a Ray
worker's, an in-process drafter hub and verifier) rolls out on a copy of it in `model.dtype`, refreshed in place
after every update. So every `speculative.mode`, arm and drafter runs here as on Ray, with the same metric keys,
events and checkpoint layout (`tlt.runtime.trainer`). What needs processes of its own by nature is refused in one
line: a policy group (`MSG_POLICY_GROUP`) and `drafter.placement: sidecar` (`local_worker.MSG_SIDECAR`).

Device: the CPU, or `cuda` when `policy.resources.gpus >= 1` (`tlt.runtime.devices`); the engine's copy of the
policy runs on the same device. Nothing here fails a step in a way a retry fixes (`step_failures` is empty): an
error ends the run, which resumes from its newest checkpoint when run again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from tlt.checkpoint.store import Checkpoint
from tlt.drafter.export import DRAFTER_SNAPSHOTS_DIR, write_served_drafter
from tlt.drafter.publish import step_drafters
from tlt.rollout.types import Completion
from tlt.runtime.devices import policy_device
from tlt.runtime.executor import Generate, Rollout, RunContext
from tlt.runtime.partial_work import GroupWork
from tlt.runtime.trainer import EventFn, Trainer
from tlt.spec.plan import SpeculativePlan
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.problem import Problem
from tlt.tasks.warmstart import WarmstartConfig
from tlt.workers.local_rollout import LocalWorker
from tlt.workers.policy import PolicyRole

MSG_POLICY_GROUP = (
    "policy: {world} policy ranks (policy.replicas x max(1, resources.gpus)) run as processes of their own: run "
    "without --local, or set policy.sharding: none"
)


def local_trainer(
    run: TLTTrainingRun,
    out_dir: str | Path,
    *,
    warmstart: WarmstartConfig | None = None,
    on_event: EventFn | None = None,
) -> Trainer:
    """The trainer in this process. `warmstart` picks the built-in task's policy when `model.path` is unset.
    A policy group is refused before anything is read or written."""
    if run.spec.policy.world > 1:
        raise ValueError(MSG_POLICY_GROUP.format(world=run.spec.policy.world))
    return Trainer(run, out_dir, lambda context: LocalExecutor(context, warmstart), on_event=on_event)


class LocalExecutor:
    """The policy role and one rollout worker over a copy of the policy (built by `restore`)."""

    step_failures: tuple[type[BaseException], ...] = ()

    def __init__(self, context: RunContext, warmstart: WarmstartConfig | None) -> None:
        self.spec = context.run.spec
        self.out_dir = context.out_dir
        self._emit = context.emit
        self.warmstart = warmstart
        self.plan = SpeculativePlan.of(self.spec.speculative, self.spec.drafter)
        # one process: the engine's copy of the policy computes where the policy does
        self.device = policy_device(self.spec.policy.resources.gpus, cuda_available=torch.cuda.is_available())
        self.role = PolicyRole(self.spec, warmstart, self.device)
        self.worker: LocalWorker | None = None

    @property
    def engine(self) -> Any:
        """The rollout engine (the worker's; `tlt.rollout.engine.Engine`)."""
        assert self.worker is not None
        return self.worker.engine

    def restore(self, ckpt: Checkpoint | None) -> None:
        if ckpt is not None:
            self.role.load(ckpt)
        policy, tokenizer = self.role.policy, self.role.tokenizer
        self.worker = LocalWorker(self.spec, policy, tokenizer, ckpt, self.out_dir / DRAFTER_SNAPSHOTS_DIR)

    def rollout(
        self, step: int, ids: list[int], dataset: list[Problem], work: list[GroupWork] | None = None
    ) -> Rollout:
        assert self.worker is not None
        self._emit("phase", phase="rollout", workers=1)
        dispatched = time.time()
        completions, scored, result = self.worker.rollout(step, ids, [dataset[i] for i in ids], work)
        return Rollout(completions, scored, [result], dispatched, time.time())

    def update(self, completions: list[Completion], rewards: torch.Tensor) -> dict[str, Any]:
        assert self.worker is not None
        update = self.role.update(completions, rewards)
        self.worker.load_weights(self.role.policy)
        return update

    def after_update(self, step: int, rollout: Rollout) -> dict[str, Any]:
        assert self.worker is not None
        started = time.time()
        finished = [c for c in rollout.completions if c.finish_reason != "abort"]  # a partial rollout's others go on
        out = self.worker.after_update(finished, step)
        return {"bookkeeping_wait_seconds": time.time() - started, **out}

    def end_step(self, step: int) -> dict[str, Any]:
        assert self.worker is not None
        self.worker.snapshot(step)
        return {"worker_states": {self.worker.name: self.worker.states.take()}, "recoveries": []}

    def generate(self) -> Generate:
        assert self.worker is not None
        return self.worker.engine.generate

    def add_to(self, ckpt: Checkpoint) -> None:
        assert self.worker is not None
        self.role.add_to(ckpt)
        self.worker.add_to(ckpt)

    def recover(self, exc: BaseException, step: int) -> bool:
        return False

    def stopping(self) -> None:
        """Nothing trains in the background here."""

    def finish(self, out_dir: Path, step: int) -> None:
        assert self.worker is not None
        hub = self.worker.hub
        if hub is None:
            return
        hub.snapshot(step)
        hub.wait_snapshots(60.0)
        publish, config = self.spec.drafter.publish, self.role.policy.config
        drafter = step_drafters(publish, self.worker.served, hub.pull())[0]  # what the next step would draft with
        layers = self.plan.learned(config.num_hidden_layers).feature_layers
        write_served_drafter(out_dir, drafter, config, publish=publish, step=step, feature_layers=layers)

    def reset(self) -> None:
        self.role = PolicyRole(self.spec, self.warmstart, self.device)
        self.worker = None

    def shutdown(self) -> None:
        """Nothing runs outside this process."""
