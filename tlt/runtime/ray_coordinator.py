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
4. rewards are gathered, GRPO updates the policy here, metrics are recorded, the hub writes an
   asynchronous drafter snapshot, and every `checkpoint.intervalSteps` a whole-run checkpoint
   (policy, optimizer, drafter params + optimizer, the workers' drafter buffers, bandits, metrics)
   is written.

Failures: an actor that dies (or a task that raises) fails the step; all actors are torn down,
the run reloads its newest whole-run checkpoint (or the initial policy when there is none) and
starts fresh actors; restarts beyond `runPolicy.backoffLimit` fail the run. When this process
(the coordinator's node) is lost, Ray takes its actors with it; rerunning the same command (or
the operator replacing the policy pod) recreates all workers and resumes from the checkpoint.
The checkpoint to resume from is read and verified before Ray starts (`checkpoint.onCorrupt`,
`tlt.runtime.checkpoint_recovery`). With a `GracefulStop`, a SIGTERM / SIGINT ends the run after the
step under way: its trainers stop, a checkpoint of that step is written, event `stop`.

Modes (`speculative.mode`; steppers from `tlt.adaptive.adaptive_stepper.rollout_stepper`): off and ngram keep no drafter; static
trains the drafter only in the idle time of the run's first step, then freezes it; tlt trains it every step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError

from tlt.spec.run import TLTTrainingRun
from tlt.drafter.export import DRAFTER_SNAPSHOTS_DIR
from tlt.models.drafter import load_drafter
from tlt.models.loading import resolve_dtype, save_policy
from tlt.monitoring import build_loggers
from tlt.rl.reward_plugin import REWARD_ERRORS_FILE, load_reward, record_reward_errors
from tlt.runtime import rl_step
from tlt.runtime.checkpoint import Checkpoint, add_drafter, drafter_of, save_checkpoint
from tlt.runtime.checkpoint_recovery import resume_point
from tlt.runtime.devices import to_cpu
from tlt.runtime.drafter_metrics import drafter_step_metrics
from tlt.runtime.events import append_event
from tlt.runtime.graceful_stop import GracefulStop
from tlt.runtime.local import (METRICS_FILE, POLICY_DIR, build_optimizer, build_policy, check_same_run, policy_path,
                               write_jsonl)
from tlt.runtime.ray_cluster import Actors, connect, create_actors, placement
from tlt.runtime.ray_slots import SlotSource
from tlt.runtime.shard_metrics import shard_rollout_metrics
from tlt.runtime.served_drafter import StepDrafters
from tlt.tasks.datasets import load_problems
from tlt.tasks.warmstart import WarmstartConfig

log = logging.getLogger(__name__)

STEP_FAILURES = (RayActorError, RayTaskError, ObjectLostError, WorkerCrashedError)
DRAFTER_DIR = DRAFTER_SNAPSHOTS_DIR
EventFn = Callable[[dict[str, Any]], None]


class RunFailed(RuntimeError):
    """The run failed more often than `runPolicy.backoffLimit` allows."""


class RayTrainer:
    """Coordinator + policy update in this process; rollout workers, verifiers and the drafter hub as actors."""

    def __init__(self, run: TLTTrainingRun, out_dir: str | Path, *, warmstart: WarmstartConfig | None = None,
                 address: str | None = None, num_cpus: int | None = None, on_event: EventFn | None = None,
                 stop_trainers_at: str = "update", stop: GracefulStop | None = None) -> None:
        if stop_trainers_at not in ("update", "rollout"):
            raise ValueError(f"stop_trainers_at must be 'update' or 'rollout', got {stop_trainers_at!r}")
        self.stop_trainers_at = stop_trainers_at
        self._running_trainers: dict[Any, float] = {}
        self.run = run
        self.spec = run.spec
        self.algo = run.spec.algorithm
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_root = self.out_dir / self.spec.checkpoint.path
        self.on_event = on_event
        self.problems = load_problems(self.spec.dataset, "train")
        if self.spec.verifier.reward is not None:  # a clear error here, before any actor starts
            load_reward(self.spec.verifier.reward)
        self.policy_path = policy_path(run, warmstart)
        self.warmstart = warmstart
        # the checkpoint to resume from, read, verified and checked against this run before Ray starts
        ckpt, damaged = resume_point(self.checkpoint_root, self.spec.checkpoint.on_corrupt)
        check_same_run(ckpt, self.checkpoint_root, self.spec.model_dump(mode="json", by_alias=True))
        self.resources = connect(address, num_cpus)
        if stop is not None:
            stop.install()  # again: ray.init put its own SIGTERM handler on this process
        self.placement = placement(self.spec, self.resources)  # ValueError: a role asks for a missing GPU
        torch.set_num_threads(self.placement.driver_threads)
        self.slots = SlotSource(self.spec.drafter.enabled_slots, self.out_dir)
        self.actors: Actors | None = None
        self.stopped: Path | None = None
        self.restarts = 0
        self._load_initial()
        self._resume(ckpt)
        for d in damaged:
            self._emit("checkpoint_damaged", folder=d.folder, moved_to=d.moved_to, reason=d.reason,
                       resumed_step=self.step)
        self.loggers = build_loggers(self.spec.monitoring, self.out_dir, run_name=run.metadata.name,
                                     config=self.spec.model_dump(mode="json", by_alias=True))

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_FILE

    def _load_initial(self) -> None:
        self.policy, self.tokenizer = build_policy(self.spec, self.warmstart, self.placement.gpus.policy_device)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.compute_dtype = resolve_dtype(self.spec.model.dtype)
        self.optimizer = build_optimizer(self.policy, self.spec)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.drafter_state: dict[str, Any] | None = None
        # (version, parameters) the rollouts draft with (`drafter.publish`); None: the hub's newest
        self.drafters = StepDrafters(self.spec.drafter.publish)
        self.bandit_states: list[dict[str, Any] | None] | None = None
        self.trainer_states: list[dict[str, Any] | None] | None = None

    def _emit(self, kind: str, **info: Any) -> None:
        event = append_event(self.out_dir, kind, self.step + 1, **info)
        if self.on_event is not None:
            self.on_event(event)

    def _resume(self, ckpt: Checkpoint | None) -> None:
        if ckpt is not None:
            self.policy.load_state_dict(ckpt.tensors["policy"])
            self.optimizer.load_state_dict(ckpt.objects["optimizer"])
            torch.set_rng_state(ckpt.tensors["rng"]["torch"])
            self.step = ckpt.step
            self.history = list(ckpt.state["metrics"])
            self.restarts = int(ckpt.state.get("restarts", 0))
            self.bandit_states = ckpt.state.get("bandits")
            self.drafter_state, self.trainer_states = drafter_of(ckpt)
            served = (self.drafter_state or {}).get("served")
            self.drafters.served = (int(served["version"]), served["params"]) if served else None
            log.info("resumed from %s at step %d", self.checkpoint_root, self.step)
        write_jsonl(self.metrics_path, self.history)

    def start_actors(self) -> Actors:
        snapshot_dir = str(self.out_dir / DRAFTER_DIR)
        self.actors = create_actors(self.spec, self.policy_path, self.policy.config, self.resources, snapshot_dir)
        if self.actors.hub is not None and self.drafter_state is not None:
            ray.get(self.actors.hub.load_state.remote(self.drafter_state))
        elif self.actors.hub is not None and self.spec.speculative.drafter_path is not None:
            initial = load_drafter(self.spec.speculative.drafter_path, self.policy.config)
            ray.get(self.actors.hub.load_params.remote(initial.float().state_dict()))
        self._load_per_worker("load_bandit", self.bandit_states, "bandits start afresh")
        self._load_per_worker("load_trainer_state", self.trainer_states, "drafter buffers start empty")
        self._emit("actors", rollout=len(self.actors.rollout), verifiers=len(self.actors.verifiers))
        return self.actors

    def _load_per_worker(self, method: str, states: list[Any] | None, otherwise: str) -> None:
        """Hand each rollout worker its own checkpointed state (`method` of the worker, in worker order)."""
        if states is None or self.actors is None:
            return
        workers = self.actors.rollout
        if len(states) != len(workers):
            log.warning("the checkpoint holds %d rollout workers' states for %s, the run has %d workers: %s",
                        len(states), method, len(workers), otherwise)
            return
        ray.get([getattr(w, method).remote(state) for w, state in zip(workers, states)])

    @property
    def served(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(version, parameters) of the drafter the rollouts draft with; None: the hub's newest."""
        return self.drafters.served

    def shutdown(self) -> None:
        self.drafters.forget()
        if self.actors is not None:
            self.actors.kill()
            self.actors = None

    def save(self) -> Path:
        """A whole-run checkpoint of the current step (the drafter comes from the hub, synchronously)."""
        tensors = {"policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()},
                   "rng": {"torch": torch.get_rng_state()}}
        objects: dict[str, Any] = {"optimizer": self.optimizer.state_dict()}
        state: dict[str, Any] = {"step": self.step, "metrics": self.history, "restarts": self.restarts,
                                 "spec": self.spec.model_dump(mode="json", by_alias=True)}
        if self.actors is not None and self.spec.speculative.mode != "off":
            self.bandit_states = ray.get([w.bandit_state.remote() for w in self.actors.rollout])
        if self.bandit_states is not None:
            state["bandits"] = self.bandit_states
        if self.actors is not None and self.actors.hub is not None:
            self.drafter_state = ray.get(self.actors.hub.state.remote())
            if self.served is not None:
                self.drafter_state["served"] = {"version": self.served[0], "params": self.served[1]}
            self.trainer_states = ray.get([w.trainer_state.remote() for w in self.actors.rollout])
        ckpt = Checkpoint(step=self.step, tensors=tensors, objects=objects, state=state)
        add_drafter(ckpt, self.drafter_state, self.trainer_states)
        return save_checkpoint(self.checkpoint_root, ckpt, keep=self.spec.checkpoint.keep)

    def train_step(self) -> dict[str, Any]:
        """Run step `self.step + 1` on the actors; returns its metrics."""
        actors = self.actors or self.start_actors()
        step = self.step + 1
        started = time.time()
        ids = rl_step.select_prompts(len(self.problems), self.algo.prompts_per_step, self.algo.seed, step)
        engine_dtype = resolve_dtype(self.spec.model.dtype)
        weights = ray.put(to_cpu(self.policy.state_dict(), engine_dtype))
        stamps = [started, time.time()]  # what the step does before dispatching (`rollout_overhead_parts`)
        carried = self._stop_trainers(self._running_trainers)
        self._running_trainers = {}
        stamps.append(time.time())
        drafter, candidate = self.drafters.refs(actors.hub)
        dispatched = time.time()
        prepare = dict(zip(("put_weights", "stop_trainers", "drafters"),
                           (b - a for a, b in zip(stamps, [*stamps[1:], dispatched]))))
        futures = {}
        for worker, shard in zip(actors.rollout, rl_step.shards(ids, len(actors.rollout))):
            if shard:
                futures[worker.rollout.remote(step, shard, [self.problems[i] for i in shard], weights, drafter,
                                              candidate)] = worker
        self._emit("phase", phase="rollout", workers=len(futures))
        results, trainers = self._collect_rollouts(futures, step)
        rollout_end = time.time()
        if self.stop_trainers_at == "update":
            acks = carried + self._stop_trainers(trainers)
        else:
            acks, self._running_trainers = carried, trainers
        self._emit("phase", phase="update")
        completions = [c for r in results for c in r["completions"]]
        scored = ray.get([ref for r in results for ref in r["rewards"]])
        rewards = torch.tensor([value for value, _ in scored], dtype=torch.float32).view(len(ids), self.algo.group_size)
        reward_errors = [error for _, error in scored if error is not None]
        record_reward_errors(self.out_dir / REWARD_ERRORS_FILE, step, reward_errors)
        update_started = time.time()
        update = rl_step.learn(self.policy, self.optimizer, completions, rewards, self.algo, pad_id=self.pad_id,
                             compute_dtype=self.compute_dtype)
        update_seconds = time.time() - update_started
        # The workers buffered their samples and scored the drafters while the policy updated.
        for result, agreement in zip(results, ray.get([futures[ref].agreement.remote() for ref in futures])):
            result.update(agreement)
        metrics = {"step": step, **shard_rollout_metrics(completions, rewards, results, started, rollout_end, prepare),
                   **update, "update_seconds": update_seconds, "update_started_at": update_started,
                   "rollout_dispatched_at": dispatched, **self._drafter_metrics(results, acks),
                   "step_seconds": time.time() - started}
        if self.spec.verifier.reward is not None:
            metrics["reward_errors"] = len(reward_errors)
        if actors.hub is not None:
            actors.hub.snapshot.remote(step)
        metrics["worker_states"] = {name: states for name, states in zip(
            [r["worker"] for r in results], ray.get([w.take_states.remote() for w in futures.values()]))}
        if actors.hub is not None and not self._running_trainers:  # nothing can push before the next step
            self.drafters.prefetch(actors.hub)
        self.step = step
        self.history.append(metrics)
        self.loggers.log_step(metrics)
        return metrics

    def _collect_rollouts(self, futures: dict[Any, Any], step: int) -> tuple[list[dict[str, Any]], dict[Any, float]]:
        """Wait for every shard; start each finished worker's trainer when allowed. Results in shard order.

        A trainer start is not waited for while other shards are still out (the next result is collected at
        once); every start has completed (its errors raised) before this returns, so no later stop can
        overtake it on the worker's concurrent actor. Where trainers stop when the update starts, the last
        shard's worker starts none while another trainer of this step runs: it would be stopped at once,
        its start and stop round trips on the step's critical path for no training (`_starts_trainer`)."""
        order = list(futures)
        done: dict[Any, dict[str, Any]] = {}
        trainers: dict[Any, float] = {}
        starts = []
        train = rl_step.trains_drafter(self.spec, step) and self.actors is not None and self.actors.hub is not None
        pending = list(order)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in ready:
                result = ray.get(ref)
                done[ref] = result
                worker = futures[ref]
                if train and self._starts_trainer(result["worker"], trainers, last=not pending):
                    requested = time.time()
                    starts.append(worker.start_training.remote(step))  # settles first: see below
                    trainers[worker] = requested
                    self._emit("trainer", worker=result["worker"], action="start", requested_at=requested)
                else:
                    # the worker indexes its responses for history drafts, buffers its samples and scores the
                    # drafters now that its results are here (started before returning them, that work slowed
                    # the return); errors surface in `agreement`
                    worker.settle.remote()
            self._emit_workers()
        ray.get(starts)
        return [done[ref] for ref in order], trainers

    def _starts_trainer(self, worker: str, trainers: dict[Any, float], last: bool) -> bool:
        """Whether `worker`, whose shard just finished, starts a trainer (`trainers`: those started this step;
        `last`: no shard is still out, so nothing is idle until the update)."""
        if len(trainers) >= self.spec.drafter.max_trainers or not self.slots.enabled(worker):
            return False
        return not (last and trainers and self.stop_trainers_at == "update")

    def _emit_workers(self) -> None:
        if self.on_event is not None and self.actors is not None:
            self._emit("workers", workers=ray.get([w.status.remote() for w in self.actors.rollout]))

    def _stop_trainers(self, trainers: dict[Any, float]) -> list[dict[str, Any]]:
        """Stop every trainer of this step and collect acknowledgements (both processes' timestamps)."""
        if not trainers:
            return []
        requested = time.time()
        refs = [w.stop_training.remote() for w in trainers]
        acks = ray.get(refs)
        acked = time.time()
        for ack, started in zip(acks, trainers.values()):
            ack.update(requested_at=requested, acked_at=acked, start_requested_at=started)
            if ack.get("error"):
                log.warning("trainer on %s failed: %s", ack["worker"], ack["error"])
            self._emit("trainer", worker=ack["worker"], action="stop", requested_at=requested, acked_at=acked,
                       stopped_at=ack["stopped_at"])
        self._emit_workers()
        return acks

    def _drafter_metrics(self, results: list[dict[str, Any]], acks: list[dict[str, Any]]) -> dict[str, Any]:
        if self.actors is None or self.actors.hub is None:
            return {}
        pushes = ray.get(self.actors.hub.take_pushes.remote())
        return {**drafter_step_metrics(results, acks, pushes), **self.drafters.outcome(results)}

    def train(self, on_step: Callable[[dict[str, Any]], None] | None = None,
              stop: GracefulStop | None = None) -> list[dict[str, Any]]:
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
                    self._restart(exc)
                    continue
                if stop.requested:  # the checkpoint holds what the trainers learnt until now
                    self._stop_trainers(self._running_trainers)
                    self._running_trainers = {}
                if self.step % interval == 0 or self.step == self.algo.steps or stop.requested:
                    saved = self.save()
                    self._emit("checkpoint", saved_step=self.step)
                if on_step is not None:
                    on_step(metrics)
            if self.step < self.algo.steps:  # stopped on a signal
                self.stopped = saved
                self._emit("stop", signal=stop.name, checkpoint=str(saved) if saved else None)
                return self.history
            self._stop_trainers(self._running_trainers)
            self._running_trainers = {}
            if self.actors is not None and self.actors.hub is not None:
                # submitted before waiting: the hub's calls run on several threads, in no fixed order
                ray.get(self.actors.hub.snapshot.remote(self.step))
                ray.get(self.actors.hub.wait_snapshots.remote(60.0))
            self.drafters.write_served(self.out_dir, self.actors.hub if self.actors else None, self.drafter_state,
                                       self.policy.config, self.step)
        finally:
            self.shutdown()
        save_policy(self.policy, self.tokenizer, self.out_dir / POLICY_DIR)
        return self.history

    def _restart(self, exc: BaseException) -> None:
        failed = self.step + 1
        self.restarts += 1
        limit = self.spec.run_policy.backoff_limit
        self.shutdown()
        self._running_trainers = {}
        self._load_initial()
        restarts = self.restarts
        self._resume(resume_point(self.checkpoint_root, self.spec.checkpoint.on_corrupt)[0])
        self.restarts = restarts
        self._emit("restart", failed_step=failed, resumed_step=self.step, restarts=self.restarts, limit=limit,
                   error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", detail=str(exc))
        log.warning("step %d failed (%s); restart %d of %d from checkpoint step %d\n%s", failed, type(exc).__name__,
                    self.restarts, limit, self.step, exc)
        if self.restarts > limit:
            raise RunFailed(f"step {failed} failed and {self.restarts} restarts exceed runPolicy.backoffLimit={limit}; "
                            f"last error: {exc}") from exc
