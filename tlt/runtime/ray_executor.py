"""The Ray executor: the trainer's roles as Ray actors, the coordinator (this process) holding the policy role.

One step as the trainer (`tlt.runtime.trainer`) drives it here:
1. push the policy weights (one object in the store) and the hub's newest drafter to every
   rollout worker; each generates its shard of prompts x group size and streams every finished
   response to a verifier;
2. a worker that finishes its shard releases its KV cache and turns IDLE; if drafter training is
   on this step and its slot is enabled, its spot trainer starts (TRAINING): local AdamW steps on
   its copy, the parameter change synced with the one drafter hub every few steps;
3. every trainer is stopped and acknowledges (its timestamps and ours) when its device is
   needed: with `stop_trainers_at="update"` (one machine: rollout and update share the device)
   when every shard is done, before the policy update; with `"rollout"` (rollout pods with
   their own devices) before the next step's first rollout token, so trainers also harvest
   the update phase;
4. GRPO updates the policy (here at one policy rank; above one on the policy group's ranks,
   `tlt.workers.sharded_policy`), the workers' bookkeeping (buffers, drafter scoring) is waited for, the hub
   writes an asynchronous drafter snapshot; a whole-run checkpoint holds the policy, its optimizer, the
   hub's drafter and optimizer, and every worker's bandit and drafter buffer (`ActorStates`).

Failures (`tlt.runtime.failure_kinds`): a rollout worker lost in the middle of its shard costs the step
nothing but time: the shard goes to a free worker, a fresh worker starts in its place
(`tlt.runtime.rollout_dispatch`; events `shard_retry`, `worker_replaced`; the step's `recoveries`); a worker
or verifier lost at another point before the policy update is replaced and the step runs again
(`step_redone`, `tlt.runtime.step_recovery`). A lost drafter hub restarts alone and gets the drafter the
coordinator last pulled (`tlt.runtime.hub_keeper`; event `hub_restarted`): the step goes on. An error of the
configuration or the program (ValueError, a missing file or module) fails the run at once with its line
(event `failed`). Anything else fails the step, and the trainer restarts from the newest checkpoint with fresh
actors (`reset`). When this process is lost, Ray takes its actors with it; rerunning the same command (or the
operator replacing the policy pod) recreates all workers and resumes from the checkpoint.

Collaborators: `tlt.runtime.rollout_dispatch` (shards out, results back), `tlt.runtime.spot_trainers` (slots,
trainer start / stop, drafter metrics), `tlt.runtime.served_drafter` (the drafters each step drafts with, from
the hub) and `tlt.runtime.actor_states` (what the actors hold in a checkpoint).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray
import torch

from tlt.checkpoint.store import Checkpoint, add_drafter, drafter_of
from tlt.drafter.export import DRAFTER_SNAPSHOTS_DIR
from tlt.rollout.types import Completion
from tlt.runtime.actor_states import STEP_FAILURES, ActorStates
from tlt.runtime.executor import Generate, Rollout, RunContext
from tlt.runtime.graceful_stop import GracefulStop, start_ray
from tlt.runtime.heldout import plain_generate
from tlt.runtime.hub_keeper import HubKeeper
from tlt.runtime.partial_work import GroupWork
from tlt.runtime.ray_cluster import ROLE_RESOURCES, Actors, connect, create_actors, placement
from tlt.runtime.rollout_dispatch import Collected, StepRollout
from tlt.runtime.served_drafter import StepDrafters
from tlt.runtime.shard_metrics import drafter_step_metrics
from tlt.runtime.spot_trainers import SlotSource, SpotTrainers
from tlt.runtime.step_recovery import StepRecovery
from tlt.runtime.trainer import EventFn, Trainer
from tlt.runtime.worker_replacement import ask_each
from tlt.spec.plan import SpeculativePlan
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.problem import Problem
from tlt.tasks.warmstart import WarmstartConfig
from tlt.workers.policy import policy_path
from tlt.workers.rollout_drafter import NO_AGREEMENT
from tlt.workers.sharded_policy import ShardedPolicyRole, policy_role

DRAFTER_DIR = DRAFTER_SNAPSHOTS_DIR


def ray_trainer(
    run: TLTTrainingRun,
    out_dir: str | Path,
    *,
    warmstart: WarmstartConfig | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    on_event: EventFn | None = None,
    stop_trainers_at: str = "update",
    stop: GracefulStop | None = None,
) -> Trainer:
    """The trainer over Ray actors: a local cluster of `num_cpus` CPUs, or the cluster at `address`. `warmstart`
    picks the built-in task's policy when `model.path` is unset; `stop`: a SIGTERM while Ray starts stops the
    run too (`StoppedWhileStarting`). `stop_trainers_at`: see the module's step 3."""

    def start(context: RunContext) -> RayExecutor:
        return RayExecutor(context, warmstart, address, num_cpus, stop_trainers_at, stop)

    return Trainer(run, out_dir, start, on_event=on_event)


class RayExecutor:
    """Rollout workers, verifiers and the drafter hub as Ray actors (started at the first step); the policy
    update here at one policy rank, above one on the policy group's rank actors."""

    step_failures = STEP_FAILURES

    def __init__(
        self,
        context: RunContext,
        warmstart: WarmstartConfig | None,
        address: str | None,
        num_cpus: int | None,
        stop_trainers_at: str,
        stop: GracefulStop | None,
    ) -> None:
        self.spec = context.run.spec
        self.plan = SpeculativePlan.of(self.spec.speculative, self.spec.drafter)
        self.out_dir = context.out_dir
        self._emit = context.emit
        self.watched = context.watched
        self.trainers = SpotTrainers(
            SlotSource(self.spec.drafter.enabled_slots, self.out_dir),
            self.spec.drafter.max_trainers,
            stop_trainers_at,
            self._emit,
            self._emit_workers,
        )
        self.policy_path = policy_path(context.run, warmstart)
        self.warmstart = warmstart
        self.resources = start_ray(lambda: connect(address, num_cpus), stop, ray.shutdown)
        self.placement = placement(self.spec, self.resources)  # ValueError: a role asks for a missing GPU
        torch.set_num_threads(self.placement.driver_threads)
        self.actors: Actors | None = None
        self.hub: HubKeeper | None = None  # the coordinator's calls to the drafter hub, and its restart
        self.recovery = StepRecovery(self._emit)  # the step under way: run again after losing actors
        self._collected: Collected | None = None
        self._fresh()

    @property
    def served(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(version, parameters) of the drafter the rollouts draft with; None: the hub's newest."""
        return self.drafters.served

    def _fresh(self) -> None:
        on_pods = self.resources.get(ROLE_RESOURCES["rollout"], 0) > 0
        self.role = policy_role(self.spec, self.policy_path, self.warmstart, self.placement, on_pods)
        if isinstance(self.role, ShardedPolicyRole):
            self._emit("policy_group", world=self.role.world, sharding=self.role.sharding, ranks=self.role.places)
        self.learned = self.plan.learned(self.role.policy.config.num_hidden_layers)
        self.actor_states = ActorStates()
        # (version, parameters) the rollouts draft with (`drafter.publish`); None: the hub's newest
        self.drafters = StepDrafters(self.spec.drafter.publish)

    def _emit_workers(self, skip: set[Any] | frozenset[Any] = frozenset()) -> None:
        """Record the rollout workers' states (but those of `skip`: replacements still starting)."""
        if self.watched and self.actors is not None:
            workers = [w for w in self.actors.rollout if w not in skip]
            self._emit("workers", workers=[s for s in ask_each(workers, "status", None) if s is not None])

    def restore(self, ckpt: Checkpoint | None) -> None:
        if ckpt is None:
            return
        self.role.load(ckpt)
        drafter, trainers = drafter_of(ckpt)
        self.actor_states = ActorStates(drafter=drafter, bandits=ckpt.state.get("bandits"), trainers=trainers)
        self.drafters.served = self.actor_states.served()

    def start_actors(self) -> Actors:
        snapshot_dir = str(self.out_dir / DRAFTER_DIR)
        self.actors = create_actors(self.spec, self.policy_path, self.role.policy.config, self.resources, snapshot_dir)
        self.actor_states.hand_out(self.actors, self.spec.speculative.drafter_path, self.role.policy.config)
        self.hub = HubKeeper(self.actors.hub, self._emit) if self.actors.hub is not None else None
        self._emit("actors", rollout=len(self.actors.rollout), verifiers=len(self.actors.verifiers))
        return self.actors

    def rollout(
        self, step: int, ids: list[int], dataset: list[Problem], work: list[GroupWork] | None = None
    ) -> Rollout:
        actors = self.actors or self.start_actors()
        self.recovery.updating = False
        started = time.time()
        weights = ray.put(self.role.rollout_weights())
        stamps = [started, time.time()]  # what the step does before dispatching (`rollout_overhead_parts`)
        carried = self.trainers.stop_running()
        stamps.append(time.time())
        drafter, candidate = self.drafters.refs(self.hub)
        dispatched = time.time()
        parts = ("put_weights", "stop_trainers", "drafters")
        prepare = dict(zip(parts, (b - a for a, b in zip(stamps, [*stamps[1:], dispatched]))))
        prompts = self.spec.algorithm.prompts_per_step
        step_rollout = StepRollout(actors, step, ids, dataset, (weights, drafter, candidate), work, prompts)
        self._emit("phase", phase="rollout", workers=step_rollout.dispatch())
        trains = self.plan.trains_drafter(step) and self.hub is not None
        collected = step_rollout.collect(self.trainers if trains else None, self._emit, self._emit_workers)
        ended = time.time()
        collected.acks += self.trainers.after_rollout(carried, collected.started)
        self._collected = collected
        results = collected.results
        refs = [ref for r in results for ref in r["rewards"]]
        values = iter(ray.get([ref for ref in refs if ref is not None]))  # None: a partial response still running
        scored = [None if ref is None else next(values) for ref in refs]
        completions = [c for r in results for c in r["completions"]]
        return Rollout(completions, scored, results, dispatched, ended, prepare)

    def update(self, completions: list[Completion], rewards: torch.Tensor) -> dict[str, Any]:
        self.recovery.updating = True  # from here a failure cannot run the step again: the policy is changing
        return self.role.update(completions, rewards)

    def after_update(self, step: int, rollout: Rollout) -> dict[str, Any]:
        # The workers buffered their samples and scored the drafters while the policy updated; what of that
        # outlasts the update, the step waits for here
        assert self._collected is not None
        waited = time.time()
        agreements = ask_each(self._collected.workers, "agreement", NO_AGREEMENT)
        out: dict[str, Any] = {"bookkeeping_wait_seconds": time.time() - waited}
        for result, agreement in zip(rollout.results, agreements):
            result.update(agreement)
        if self.hub is not None:
            pushes = self.hub.call("take_pushes")
            out.update(drafter_step_metrics(rollout.results, self._collected.acks, pushes))
            out.update(self.drafters.outcome(rollout.results))
        return out

    def end_step(self, step: int) -> dict[str, Any]:
        assert self._collected is not None
        collected, self._collected = self._collected, None
        if self.hub is not None:
            self.hub.hub.snapshot.remote(step)  # not waited for: a hub lost meanwhile misses one snapshot
        states = ask_each(collected.workers, "take_states", None)
        hub_restarts = self.hub.take_recoveries() if self.hub is not None else []
        restarted = hub_restarts + self.trainers.take_recoveries()
        out = {
            "worker_states": {r["worker"]: s for r, s in zip(collected.results, states) if s is not None},
            "recoveries": self.recovery.redone + collected.recoveries + restarted,
        }
        if self.hub is not None and not self.trainers.running:  # nothing can push before the next step
            self.drafters.prefetch(self.hub)
        self.recovery.finished()
        return out

    def generate(self) -> Generate:
        return plain_generate(self.role.policy)

    def add_to(self, ckpt: Checkpoint) -> None:
        """The policy role's part, and what the actors hold (read from them, synchronously)."""
        if self.actors is not None:
            try:
                self.actor_states.gather(self.actors, self.plan.drafts, self.served)
            except STEP_FAILURES as exc:  # a worker lost since its step: its replacement's (fresh) state is kept
                recovered = self.hub is not None and self.hub.recover(exc)
                if not (recovered or self.recovery.replace_lost(self.actors, exc, {}, ckpt.step, redo=False)):
                    raise
                self.actor_states.gather(self.actors, self.plan.drafts, self.served)
        self.role.add_to(ckpt)
        if self.actor_states.bandits is not None:
            ckpt.state["bandits"] = self.actor_states.bandits
        add_drafter(ckpt, self.actor_states.drafter, self.actor_states.trainers)

    def recover(self, exc: BaseException, step: int) -> bool:
        self.recovery.fail_if_permanent(exc, step)
        self._collected = None
        return self.recovery.replace_lost(self.actors, exc, self.trainers.running, step, redo=True)

    def stopping(self) -> None:
        self.trainers.stop_running()

    def finish(self, out_dir: Path, step: int) -> None:
        self.trainers.stop_running()
        if self.hub is not None:
            # one after the other: the hub's calls run on several threads, in no fixed order
            self.hub.call("snapshot", step)
            self.hub.call("wait_snapshots", 60.0)
        config = self.role.policy.config
        feature_layers = self.learned.feature_layers
        self.drafters.write_served(out_dir, self.hub, self.actor_states.drafter, config, step, feature_layers)

    def reset(self) -> None:
        self.shutdown()
        self.trainers.running = {}
        self._collected = None
        self._fresh()

    def shutdown(self) -> None:
        self.drafters.forget()
        if isinstance(self.role, ShardedPolicyRole):
            self.role.kill()
        if self.actors is not None:
            self.actors.kill()
            self.actors = None
        self.hub = None
