"""The distributed RL loop on Ray: the coordinator (this process, policy rank 0) drives the rl_step.

One step:
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
4. rewards are gathered, GRPO updates the policy (here at one policy rank; above one on the policy group's
   ranks, `tlt.workers.sharded_policy`), metrics are recorded, the hub writes an
   asynchronous drafter snapshot, and every `checkpoint.intervalSteps` a whole-run checkpoint
   (policy, optimizer, drafter params + optimizer, the workers' drafter buffers, bandits, metrics)
   is written.

Failures (`tlt.runtime.failure_kinds`): a rollout worker lost in the middle of its shard costs the step
nothing but time: the shard goes to a free worker, a fresh worker starts in its place
(`tlt.runtime.rollout_dispatch`; events `shard_retry`, `worker_replaced`; the step's `recoveries`); a worker
or verifier lost at another point before the policy update is replaced and the step runs again
(`step_redone`, `tlt.runtime.step_recovery`). A lost drafter hub restarts alone and gets the drafter the
coordinator last pulled (`tlt.runtime.hub_keeper`; event `hub_restarted`): the step goes on. An error of the
configuration or the program (ValueError, a missing file or module) fails the run at once with its line
(event `failed`): every retry repeats it. Anything else (a RuntimeError, a hub that does not come back) fails
the step; all actors are torn down, the run reloads its newest whole-run checkpoint (or the initial policy)
and starts fresh actors; restarts beyond `runPolicy.backoffLimit` fail the run (`tlt.runtime.run_checkpoint`).
When this process (the coordinator's node) is lost, Ray takes its actors with it; rerunning the same
command (or the operator replacing the policy pod) recreates all workers and resumes from the checkpoint.
The checkpoint to resume from is read and verified before Ray starts (`checkpoint.onCorrupt`,
`tlt.runtime.checkpoint_recovery`). With a `GracefulStop`, a SIGTERM / SIGINT ends the run after the
step under way: its trainers stop, a checkpoint of that step is written, event `stop`.

Modes (`speculative.mode`; steppers: `tlt.adaptive.adaptive_stepper.rollout_stepper`): off and ngram keep no
drafter; static trains it only in the idle time of the first step, then freezes it; tlt in every step.

The coordinator's collaborators: `tlt.runtime.rollout_dispatch` (shards out, results back),
`tlt.runtime.spot_trainers` (slots, trainer start / stop, drafter metrics), `tlt.runtime.served_drafter`
(the drafters each step drafts with, from the hub) and `tlt.runtime.run_checkpoint` (checkpoint and restart).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch

from tlt.drafter.export import DRAFTER_SNAPSHOTS_DIR
from tlt.monitoring import METRICS_FILE, build_loggers
from tlt.monitoring.jsonl import rewrite_jsonl
from tlt.rl.reward_plugin import REWARD_ERRORS_FILE, load_reward, record_reward_errors
from tlt.runtime import rl_step
from tlt.runtime.checkpoint import Checkpoint
from tlt.runtime.checkpoint_recovery import resume_point
from tlt.runtime.events import append_event
from tlt.runtime.graceful_stop import GracefulStop, StoppedWhileStarting, start_ray
from tlt.runtime.heldout import eval_due, eval_interval, evaluate, heldout_problems, plain_generate
from tlt.runtime.hub_keeper import HubKeeper
from tlt.runtime.ray_cluster import ROLE_RESOURCES, Actors, connect, create_actors, placement
from tlt.runtime.resume_guard import check_drafter_fits, check_same_run
from tlt.runtime.rollout_dispatch import StepRollout
from tlt.runtime.run_checkpoint import (
    STEP_FAILURES,
    ActorStates,
    check_backoff,
    restart_event,
    restore_run,
    save_run,
)
from tlt.runtime.served_drafter import StepDrafters
from tlt.runtime.shard_metrics import shard_rollout_metrics
from tlt.runtime.spot_trainers import SlotSource, SpotTrainers, drafter_step_metrics
from tlt.runtime.step_recovery import StepRecovery
from tlt.runtime.worker_replacement import ask_each
from tlt.spec.plan import SpeculativePlan
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.datasets import load_problems
from tlt.tasks.warmstart import WarmstartConfig
from tlt.workers.policy import policy_path
from tlt.workers.rollout_drafter import NO_AGREEMENT
from tlt.workers.sharded_policy import ShardedPolicyRole, policy_role

log = logging.getLogger(__name__)

DRAFTER_DIR = DRAFTER_SNAPSHOTS_DIR
EventFn = Callable[[dict[str, Any]], None]


class RayTrainer:
    """The coordinator in this process, with the policy update at one policy rank (above one, on the policy
    group's rank actors); rollout workers, verifiers and the drafter hub as actors."""

    def __init__(
        self,
        run: TLTTrainingRun,
        out_dir: str | Path,
        *,
        warmstart: WarmstartConfig | None = None,
        address: str | None = None,
        num_cpus: int | None = None,
        on_event: EventFn | None = None,
        stop_trainers_at: str = "update",
        stop: GracefulStop | None = None,
    ) -> None:
        self.run = run
        self.spec = run.spec
        self.algo = run.spec.algorithm
        self.plan = SpeculativePlan.of(self.spec.speculative, self.spec.drafter)  # ValueError: no usable arm
        self.out_dir = Path(out_dir)
        self.trainers = SpotTrainers(
            SlotSource(self.spec.drafter.enabled_slots, self.out_dir),
            self.spec.drafter.max_trainers,
            stop_trainers_at,
            self._emit,
            self._emit_workers,
        )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_root = self.out_dir / self.spec.checkpoint.path
        self.on_event = on_event
        self.problems = load_problems(self.spec.dataset, "train")
        self.heldout = heldout_problems(self.spec)  # [] when the run evaluates nothing (`eval_interval`)
        self.eval_every = eval_interval(self.spec)
        # a clear error here, before any actor starts; held-out answers are scored here with it
        self.reward = None if self.spec.verifier.reward is None else load_reward(self.spec.verifier.reward)
        self.policy_path = policy_path(run, warmstart)
        self.warmstart = warmstart
        # the checkpoint to resume from, read, verified and checked against this run before Ray starts
        ckpt, damaged = resume_point(self.checkpoint_root, self.spec.checkpoint.on_corrupt)
        check_same_run(ckpt, self.checkpoint_root, self.spec.model_dump(mode="json", by_alias=True))
        try:  # a SIGTERM while Ray starts stops the run too (`start_ray`)
            self.resources = start_ray(lambda: connect(address, num_cpus), stop, ray.shutdown)
        except StoppedWhileStarting as exc:
            exc.step = ckpt.step if ckpt is not None else 0
            exc.checkpoint = str(self.checkpoint_root / f"step-{exc.step:08d}") if exc.step else None
            raise
        self.placement = placement(self.spec, self.resources)  # ValueError: a role asks for a missing GPU
        torch.set_num_threads(self.placement.driver_threads)
        self.actors: Actors | None = None
        self.hub: HubKeeper | None = None  # the coordinator's calls to the drafter hub, and its restart
        self.recovery = StepRecovery(self._emit)  # the step under way: run again after losing actors
        self.stopped: Path | None = None
        self.restarts = 0
        self._load_initial()
        self.learned = self.plan.learned(self.policy.config.num_hidden_layers)
        if self.plan.learns:  # what the hub will hold, before it loads anything
            check_drafter_fits(ckpt, self.checkpoint_root, self.policy.config, self.learned)
        self._resume(ckpt)
        for d in damaged:
            self._emit(
                "checkpoint_damaged", folder=d.folder, moved_to=d.moved_to, reason=d.reason, resumed_step=self.step
            )
        self.loggers = build_loggers(
            self.spec.monitoring,
            self.out_dir,
            run_name=run.metadata.name,
            config=self.spec.model_dump(mode="json", by_alias=True),
        )

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_FILE

    @property
    def policy(self) -> torch.nn.Module:
        return self.role.policy

    @property
    def tokenizer(self) -> Any:
        return self.role.tokenizer

    @property
    def served(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(version, parameters) of the drafter the rollouts draft with; None: the hub's newest."""
        return self.drafters.served

    def _load_initial(self) -> None:
        self.step = 0
        on_pods = self.resources.get(ROLE_RESOURCES["rollout"], 0) > 0
        self.role = policy_role(self.spec, self.policy_path, self.warmstart, self.placement, on_pods)
        if isinstance(self.role, ShardedPolicyRole):
            self._emit("policy_group", world=self.role.world, sharding=self.role.sharding, ranks=self.role.places)
        self.history: list[dict[str, Any]] = []
        self.actor_states = ActorStates()
        # (version, parameters) the rollouts draft with (`drafter.publish`); None: the hub's newest
        self.drafters = StepDrafters(self.spec.drafter.publish)

    def _emit(self, kind: str, **info: Any) -> None:
        event = append_event(self.out_dir, kind, self.step + 1, **info)
        if self.on_event is not None:
            self.on_event(event)

    def _emit_workers(self, skip: set[Any] | frozenset[Any] = frozenset()) -> None:
        """Record the rollout workers' states (but those of `skip`: replacements still starting)."""
        if self.on_event is not None and self.actors is not None:
            workers = [w for w in self.actors.rollout if w not in skip]
            self._emit("workers", workers=[s for s in ask_each(workers, "status", None) if s is not None])

    def _resume(self, ckpt: Checkpoint | None) -> None:
        if ckpt is not None:
            self.step, self.history, self.restarts, self.actor_states = restore_run(ckpt, self.role)
            self.drafters.served = self.actor_states.served()
            log.info("resumed from %s at step %d", self.checkpoint_root, self.step)
        rewrite_jsonl(self.metrics_path, self.history)

    def start_actors(self) -> Actors:
        snapshot_dir = str(self.out_dir / DRAFTER_DIR)
        self.actors = create_actors(self.spec, self.policy_path, self.policy.config, self.resources, snapshot_dir)
        self.actor_states.hand_out(self.actors, self.spec.speculative.drafter_path, self.policy.config)
        self.hub = HubKeeper(self.actors.hub, self._emit) if self.actors.hub is not None else None
        self._emit("actors", rollout=len(self.actors.rollout), verifiers=len(self.actors.verifiers))
        return self.actors

    def shutdown(self) -> None:
        self.drafters.forget()
        if isinstance(self.role, ShardedPolicyRole):
            self.role.kill()
        if self.actors is not None:
            self.actors.kill()
            self.actors = None
        self.hub = None

    def save(self) -> Path:
        """A whole-run checkpoint of the current step (the drafter comes from the hub, synchronously)."""
        if self.actors is not None:
            try:
                self.actor_states.gather(self.actors, self.plan.drafts, self.served)
            except STEP_FAILURES as exc:  # a worker lost since its step: its replacement's (fresh) state is kept
                recovered = self.hub is not None and self.hub.recover(exc)
                if not (recovered or self.recovery.replace_lost(self.actors, exc, {}, self.step, redo=False)):
                    raise
                self.actor_states.gather(self.actors, self.plan.drafts, self.served)
        return save_run(
            self.checkpoint_root,
            self.spec.checkpoint.keep,
            step=self.step,
            role=self.role,
            history=self.history,
            restarts=self.restarts,
            spec=self.spec.model_dump(mode="json", by_alias=True),
            states=self.actor_states,
        )

    def train_step(self) -> dict[str, Any]:
        """Run step `self.step + 1` on the actors; returns its metrics."""
        actors = self.actors or self.start_actors()
        self.recovery.updating = False
        step = self.step + 1
        started = time.time()
        ids = rl_step.select_prompts(len(self.problems), self.algo.prompts_per_step, self.algo.seed, step)
        weights = ray.put(self.role.rollout_weights())
        stamps = [started, time.time()]  # what the step does before dispatching (`rollout_overhead_parts`)
        carried = self.trainers.stop_running()
        stamps.append(time.time())
        drafter, candidate = self.drafters.refs(self.hub)
        dispatched = time.time()
        prepare = dict(
            zip(
                ("put_weights", "stop_trainers", "drafters"), (b - a for a, b in zip(stamps, [*stamps[1:], dispatched]))
            )
        )
        rollout = StepRollout(actors, step, ids, self.problems, (weights, drafter, candidate))
        self._emit("phase", phase="rollout", workers=rollout.dispatch())
        trains = self.plan.trains_drafter(step) and self.hub is not None
        collected = rollout.collect(self.trainers if trains else None, self._emit, self._emit_workers)
        results, started_trainers = collected.results, collected.started
        rollout_end = time.time()
        acks = collected.acks + self.trainers.after_rollout(carried, started_trainers)
        self._emit("phase", phase="update")
        completions = [c for r in results for c in r["completions"]]
        scored = ray.get([ref for r in results for ref in r["rewards"]])
        rewards = torch.tensor([value for value, _ in scored], dtype=torch.float32).view(len(ids), self.algo.group_size)
        reward_errors = [error for _, error in scored if error is not None]
        record_reward_errors(self.out_dir / REWARD_ERRORS_FILE, step, reward_errors)
        update_started = time.time()
        self.recovery.updating = True  # from here a failure cannot run the step again: the policy is changing
        update = self.role.update(completions, rewards)
        update_seconds = time.time() - update_started
        # The workers buffered their samples and scored the drafters while the policy updated; what of that
        # outlasts the update, the step waits for here
        agreements = ask_each(collected.workers, "agreement", NO_AGREEMENT)
        bookkeeping_wait = time.time() - update_started - update_seconds
        for result, agreement in zip(results, agreements):
            result.update(agreement)
        metrics = {
            "step": step,
            **shard_rollout_metrics(completions, rewards, results, started, rollout_end, prepare),
            **update,
            "update_seconds": update_seconds,
            "update_started_at": update_started,
            # the step's time between the rollout and the update (rewards, stopping trainers), and after the
            # update waiting for the workers' bookkeeping (`agreement`)
            "pre_update_seconds": update_started - rollout_end,
            "bookkeeping_wait_seconds": bookkeeping_wait,
            "rollout_dispatched_at": dispatched,
            **self._drafter_metrics(results, acks),
            "step_seconds": time.time() - started,
        }
        if self.spec.verifier.reward is not None:
            metrics["reward_errors"] = len(reward_errors)
        if self.hub is not None:
            self.hub.hub.snapshot.remote(step)  # not waited for: a hub lost meanwhile misses one snapshot
        metrics["worker_states"] = {
            r["worker"]: states
            for r, states in zip(results, ask_each(collected.workers, "take_states", None))
            if states is not None
        }
        hub_restarts = self.hub.take_recoveries() if self.hub is not None else []
        restarted = hub_restarts + self.trainers.take_recoveries()
        metrics["recoveries"] = self.recovery.redone + collected.recoveries + restarted
        if self.hub is not None and not self.trainers.running:  # nothing can push before the next step
            self.drafters.prefetch(self.hub)
        if self.heldout and eval_due(
            step, self.eval_every, self.algo.steps
        ):  # after the step's timing: not part of step_seconds
            self._emit("phase", phase="evaluation")
            metrics.update(evaluate(plain_generate(self.policy), self.heldout, self.tokenizer, self.spec, self.reward))
        self.step = step
        self.history.append(metrics)
        self.loggers.log_step(metrics)
        return metrics

    def _drafter_metrics(self, results: list[dict[str, Any]], acks: list[dict[str, Any]]) -> dict[str, Any]:
        if self.hub is None:
            return {}
        pushes = self.hub.call("take_pushes")
        return {**drafter_step_metrics(results, acks, pushes), **self.drafters.outcome(results)}

    def train(
        self, on_step: Callable[[dict[str, Any]], None] | None = None, stop: GracefulStop | None = None
    ) -> list[dict[str, Any]]:
        """Run the remaining steps with checkpoints and restarts; write the final policy and, with a drafter, the
        served one (`StepDrafters.write_served`). Returns all metrics. Once `stop` is requested: return after the
        step under way and its checkpoint, which `self.stopped` names (None: no step ran, nothing to save)."""
        interval = self.spec.checkpoint.interval_steps
        saved = self.checkpoint_root / f"step-{self.step:08d}" if self.step else None
        stop = stop or GracefulStop()  # not installed: never requested
        try:
            while self.step < self.algo.steps and not stop.requested:
                try:
                    metrics = self.train_step()
                except STEP_FAILURES as exc:
                    if stop.requested:  # stopping: its last checkpoint stands (pods may be leaving with it)
                        break
                    self.recovery.fail_if_permanent(exc, self.step + 1)
                    running = self.trainers.running
                    if not self.recovery.replace_lost(self.actors, exc, running, self.step + 1, redo=True):
                        self._restart(exc)
                    continue
                self.recovery.finished()
                if stop.requested:  # the checkpoint holds what the trainers learnt until now
                    self.trainers.stop_running()
                if self.step % interval == 0 or self.step == self.algo.steps or stop.requested:
                    saved = self.save()
                    self._emit("checkpoint", saved_step=self.step)
                if on_step is not None:
                    on_step(metrics)
            if self.step < self.algo.steps:  # stopped on a signal
                self.stopped = saved
                self._emit("stop", signal=stop.name, checkpoint=str(saved) if saved else None)
                return self.history
            self.trainers.stop_running()
            if self.hub is not None:
                # one after the other: the hub's calls run on several threads, in no fixed order
                self.hub.call("snapshot", self.step)
                self.hub.call("wait_snapshots", 60.0)
            self.drafters.write_served(
                self.out_dir,
                self.hub,
                self.actor_states.drafter,
                self.policy.config,
                self.step,
                self.learned.feature_layers,
            )
        finally:
            self.shutdown()
        self.role.save(self.out_dir)
        return self.history

    def _restart(self, exc: BaseException) -> None:
        """Tear the actors down and go on from the newest checkpoint; RunFailed past the backoff limit."""
        failed = self.step + 1
        restarts = self.restarts + 1
        self.shutdown()
        self.trainers.running = {}
        self._load_initial()
        self._resume(resume_point(self.checkpoint_root, self.spec.checkpoint.on_corrupt)[0])
        self.restarts = restarts
        event = restart_event(failed, self.step, restarts, self.spec.run_policy.backoff_limit, exc)
        self._emit("restart", **event)
        check_backoff(event, exc)
