"""The RL loop: one trainer runs every step of a run over an executor (`tlt.runtime.executor`).

One step (`Trainer.train_step`): select prompts (`rl_step.select_prompts`, a pure function of seed and step)
-> the executor's rollout, each response scored as it finishes -> rewards [P, G] -> the policy update and
the weights out to the engines -> the drafters' part (buffers, publish scoring, training where the run trains
them) -> the step's metrics -> held-out evaluation when due (after the step's timing). `Trainer.train` runs the
remaining steps with a whole-run checkpoint every `checkpoint.intervalSteps` and at the end, then writes the
final policy (a Hugging Face folder) and the served drafter. Output folder::

    <out>/metrics.jsonl     one JSON object per finished step, steps 1..s with no gaps or repeats
    <out>/events.jsonl      the run's events (`tlt.runtime.events`)
    <out>/checkpoints/      whole-run checkpoints (`checkpoint.path`; relative paths are under <out>)
    <out>/policy/           the final policy; <out>/drafter/ and <out>/drafter-served/ with a learned drafter

Resume: the checkpoint to resume from is read, verified and checked against this run before the executor
starts anything (`tlt.checkpoint.recovery`, `tlt.checkpoint.resume_guard`); a damaged newest checkpoint is
passed over (`checkpoint.onCorrupt`, event `checkpoint_damaged`). metrics.jsonl is rewritten to the checkpoint's
steps, so a step that ran after the last checkpoint is redone, bit for bit, and recorded once.

Failures: a step failure the executor knows (`Executor.step_failures`) is fixed in place where it can be
(`Executor.recover`), else the executor is torn down and the run goes on from its newest checkpoint (event
`restart`); restarts beyond `runPolicy.backoffLimit` fail the run (`RunFailed`). Stop: with a `GracefulStop`, a
SIGTERM / SIGINT ends the loop after the step under way, with a checkpoint of it (event `stop`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tlt.checkpoint.recovery import resume_point
from tlt.checkpoint.resume_guard import check_drafter_fits, check_same_run
from tlt.checkpoint.store import Checkpoint, save_checkpoint
from tlt.monitoring import METRICS_FILE, build_loggers
from tlt.monitoring.jsonl import rewrite_jsonl
from tlt.rl.reward_plugin import REWARD_ERRORS_FILE, load_reward, record_reward_errors
from tlt.runtime import rl_step
from tlt.runtime.events import append_event
from tlt.runtime.executor import Executor, RunContext
from tlt.runtime.graceful_stop import GracefulStop, StoppedWhileStarting
from tlt.runtime.heldout import eval_due, eval_interval, evaluate, heldout_problems
from tlt.runtime.partial_rollouts import PARTIAL_STATE, PartialRollouts
from tlt.runtime.restarts import check_backoff, restart_event
from tlt.runtime.shard_metrics import shard_rollout_metrics
from tlt.spec.plan import SpeculativePlan
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.datasets import load_problems

log = logging.getLogger(__name__)

EventFn = Callable[[dict[str, Any]], None]
StepCallback = Callable[[dict[str, Any]], None]
StartExecutor = Callable[[RunContext], Executor]


class Trainer:
    """The run's loop over the executor `start(context)` returns; resumes from `out_dir` on construction.
    `on_event` is called with every event as it is written (a live display)."""

    def __init__(
        self, run: TLTTrainingRun, out_dir: str | Path, start: StartExecutor, *, on_event: EventFn | None = None
    ) -> None:
        self.run = run
        self.spec = run.spec
        self.algo = run.spec.algorithm
        self.plan = SpeculativePlan.of(self.spec.speculative, self.spec.drafter)  # ValueError: no usable arm
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_root = self.out_dir / self.spec.checkpoint.path
        self.on_event = on_event
        self.step, self.restarts = 0, 0
        self.history: list[dict[str, Any]] = []
        self.stopped: Path | None = None
        self.problems = load_problems(self.spec.dataset, "train")
        self.partial: PartialRollouts | None = None  # the responses in flight between steps (partial rollouts)
        self.heldout = heldout_problems(self.spec)  # [] when the run evaluates nothing (`eval_interval`)
        self.eval_every = eval_interval(self.spec)
        # a clear error here, before anything starts; held-out answers are scored here with it
        self.reward = None if self.spec.verifier.reward is None else load_reward(self.spec.verifier.reward)
        ckpt, damaged = resume_point(self.checkpoint_root, self.spec.checkpoint.on_corrupt)
        check_same_run(ckpt, self.checkpoint_root, self._spec_json())
        try:
            self.executor = start(RunContext(run, self.out_dir, self._emit, watched=on_event is not None))
        except StoppedWhileStarting as exc:  # a SIGTERM while the executor started: the run's last checkpoint
            exc.step = ckpt.step if ckpt is not None else 0
            exc.checkpoint = str(self.checkpoint_root / f"step-{exc.step:08d}") if exc.step else None
            raise
        try:
            if self.plan.learns:  # what the hub will hold, before it loads anything
                learned = self.plan.learned(self.policy.config.num_hidden_layers)
                check_drafter_fits(ckpt, self.checkpoint_root, self.policy.config, learned)
            self._resume(ckpt)
        except BaseException:
            self.executor.shutdown()
            raise
        for d in damaged:  # a damaged checkpoint was passed over for `ckpt` (never None then)
            self._emit(
                "checkpoint_damaged", folder=d.folder, moved_to=d.moved_to, reason=d.reason, resumed_step=self.step
            )
        self.loggers = build_loggers(
            self.spec.monitoring, self.out_dir, run_name=run.metadata.name, config=self._spec_json()
        )

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_FILE

    @property
    def policy(self) -> torch.nn.Module:
        """The policy's full weights (on one rank: the trained module; in a group: the coordinator's mirror)."""
        return self.executor.role.policy

    @property
    def tokenizer(self) -> Any:
        return self.executor.role.tokenizer

    def _spec_json(self) -> dict[str, Any]:
        return self.spec.model_dump(mode="json", by_alias=True)

    def _emit(self, kind: str, **info: Any) -> None:
        event = append_event(self.out_dir, kind, self.step + 1, **info)
        if self.on_event is not None:
            self.on_event(event)

    def _resume(self, ckpt: Checkpoint | None) -> None:
        """Continue from `ckpt` (None: from the initial policy, step 0)."""
        self.step, self.history = 0, []
        if self.algo.rollout.partial:
            self.partial = PartialRollouts(self.algo, len(self.problems))
            if ckpt is not None:
                self.partial.load_state_dict(ckpt.objects[PARTIAL_STATE])
        if ckpt is not None:
            self.step, self.history = ckpt.step, list(ckpt.state["metrics"])
            self.restarts = int(ckpt.state.get("restarts", 0))
        self.executor.restore(ckpt)
        if ckpt is not None:
            log.info("resumed from %s at step %d", self.checkpoint_root, self.step)
        rewrite_jsonl(self.metrics_path, self.history)

    def save(self) -> Path:
        """A whole-run checkpoint of the current step."""
        state = {"step": self.step, "metrics": self.history, "restarts": self.restarts, "spec": self._spec_json()}
        ckpt = Checkpoint(step=self.step, tensors={}, objects={}, state=state)
        if self.partial is not None:
            ckpt.objects[PARTIAL_STATE] = self.partial.state_dict()
        self.executor.add_to(ckpt)
        return save_checkpoint(self.checkpoint_root, ckpt, keep=self.spec.checkpoint.keep)

    def train_step(self) -> dict[str, Any]:
        """Run step `self.step + 1`; returns its metrics."""
        step = self.step + 1
        started = time.time()
        if self.partial is None:
            ids = rl_step.select_prompts(len(self.problems), self.algo.prompts_per_step, self.algo.seed, step)
            rollout = self.executor.rollout(step, ids, self.problems)
            completions = rollout.completions
            rewards = torch.tensor([value for value, _ in rollout.scored], dtype=torch.float32)
            rewards = rewards.view(len(ids), self.algo.group_size)
            reward_errors = [error for _, error in rollout.scored if error is not None]
            partial: dict[str, Any] = {}
        else:  # the kept groups continued, new ones started; the first P complete groups are trained
            work = self.partial.plan(step)
            rollout = self.executor.rollout(step, [g.problem for g in work], self.problems, work=work)
            trained = self.partial.absorb(step, rollout.completions, rollout.scored, rollout.results)
            completions, rewards, partial = trained.completions, trained.rewards, trained.metrics
            reward_errors = [s[1] for s in rollout.scored if s is not None and s[1] is not None]
        self._emit("phase", phase="update")
        record_reward_errors(self.out_dir / REWARD_ERRORS_FILE, step, reward_errors)
        update_started = time.time()
        update = self.executor.update(completions, rewards)
        update_seconds = time.time() - update_started
        metrics = {
            "step": step,
            **shard_rollout_metrics(completions, rewards, rollout.results, started, rollout.ended_at, rollout.prepare),
            "rollout_mode": self.algo.rollout.mode,
            "off_policy_fraction": 0.0,
            **partial,
            **update,
            "update_seconds": update_seconds,
            "update_started_at": update_started,
            # the step's time between the rollout and the update (rewards, stopping trainers)
            "pre_update_seconds": update_started - rollout.ended_at,
            "rollout_dispatched_at": rollout.dispatched_at,
            **self.executor.after_update(step, rollout),
            "step_seconds": time.time() - started,
        }
        if self.partial is not None:  # the step's speed counts what it sampled, not what it trained
            seconds = metrics["rollout_seconds"]
            metrics["tokens_per_second"] = metrics["generated_tokens"] / seconds if seconds > 0 else 0.0
        if self.reward is not None:
            metrics["reward_errors"] = len(reward_errors)
        metrics.update(self.executor.end_step(step))
        if self.heldout and eval_due(step, self.eval_every, self.algo.steps):  # after the step's timing
            self._emit("phase", phase="evaluation")
            metrics.update(evaluate(self.executor.generate(), self.heldout, self.tokenizer, self.spec, self.reward))
        self.step = step
        self.history.append(metrics)
        self.loggers.log_step(metrics)
        return metrics

    def train(self, on_step: StepCallback | None = None, stop: GracefulStop | None = None) -> list[dict[str, Any]]:
        """Run the remaining steps with checkpoints and restarts; write the final policy and, with a learned
        drafter, the served one. Returns the metrics of every step of the run. Once `stop` is requested: return
        after the step under way and its checkpoint, which `self.stopped` names (None: no step ran since the
        start, nothing to save); no final policy is written then."""
        interval = self.spec.checkpoint.interval_steps
        saved = self.checkpoint_root / f"step-{self.step:08d}" if self.step else None
        stop = stop or GracefulStop()  # not installed: never requested
        try:
            while self.step < self.algo.steps and not stop.requested:
                try:
                    metrics = self.train_step()
                except self.executor.step_failures as exc:
                    if stop.requested:  # stopping: its last checkpoint stands (pods may be leaving with it)
                        break
                    if not self.executor.recover(exc, self.step + 1):
                        self._restart(exc)
                    continue
                log.info(
                    "step %d: reward %.3f, %.0f tok/s", self.step, metrics["reward_mean"], metrics["tokens_per_second"]
                )
                if stop.requested:  # the checkpoint holds what was trained in the background until now
                    self.executor.stopping()
                if self.step % interval == 0 or self.step == self.algo.steps or stop.requested:
                    saved = self.save()
                    self._emit("checkpoint", saved_step=self.step)
                if on_step is not None:
                    on_step(metrics)
            if self.step < self.algo.steps:  # stopped on a signal
                self.stopped = saved
                self._emit("stop", signal=stop.name, checkpoint=str(saved) if saved else None)
                return self.history
            self.executor.finish(self.out_dir, self.step)
        finally:
            self.executor.shutdown()
        self.executor.role.save(self.out_dir)
        return self.history

    def _restart(self, exc: BaseException) -> None:
        """Tear the executor down and go on from the newest checkpoint; RunFailed past the backoff limit."""
        failed = self.step + 1
        restarts = self.restarts + 1
        self.executor.reset()
        self._resume(resume_point(self.checkpoint_root, self.spec.checkpoint.on_corrupt)[0])
        self.restarts = restarts
        event = restart_event(failed, self.step, restarts, self.spec.run_policy.backoff_limit, exc)
        self._emit("restart", **event)
        check_backoff(event, exc)
