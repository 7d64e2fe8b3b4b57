"""The single-process RL loop: one policy, one rollout engine, whole-run checkpoints, automatic resume.

`LocalTrainer(run, out_dir).train()` runs `algorithm.steps` GRPO steps built from `tlt.runtime.rl_step`; the
rollout is a rollout worker's in this process (`tlt.runtime.local_worker`: the same generation, arms, bandit,
history and drafters as a Ray worker's), so every `speculative.mode` runs here. Output folder layout::

    <out>/metrics.jsonl     one JSON object per finished step, steps 1..s with no gaps or repeats
    <out>/checkpoints/      whole-run checkpoints (`checkpoint.path`; relative paths are under <out>)
    <out>/policy/           the final policy (a Hugging Face folder `tlt.models.loading` reads)

Device: the CPU, or `cuda` when `policy.resources.gpus >= 1` (`tlt.runtime.devices`); the engine's copy of
the policy runs on the same device.

The policy, its optimizer and update are the policy role's (`tlt.workers.policy.PolicyRole`, as in the Ray
loop); the engine runs a copy in `model.dtype`, refreshed in place after every update. The old log-probs
of the GRPO ratio are the policy's own, recomputed before the update; the engine's are kept only to report
their gap.

Resume: a checkpoint holds the policy weights, the optimizer state, the step, torch's RNG state,
the metrics so far and the spec that wrote it. A new trainer on the same output folder continues
from the newest checkpoint and rewrites metrics.jsonl to the checkpoint's steps, so a step that
ran after the last checkpoint is redone, bit for bit, and recorded once. A damaged newest checkpoint
is passed over for the newest intact one, or stops the run (`checkpoint.onCorrupt`,
`tlt.runtime.checkpoint_recovery`); a checkpoint of a different run (or drafter) raises `ResumeError`
(`tlt.runtime.resume_guard`). Neither is ever replaced by a fresh start.

Stop: with a `GracefulStop` (`tlt.runtime.graceful_stop`), a SIGTERM / SIGINT ends the loop after the
step under way, with a checkpoint of it (event `stop` in events.jsonl); no final policy is written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.monitoring import METRICS_FILE, build_loggers
from tlt.monitoring.jsonl import rewrite_jsonl
from tlt.rl.reward_plugin import REWARD_ERRORS_FILE, load_reward, record_reward_errors
from tlt.runtime import rl_step
from tlt.runtime.checkpoint import Checkpoint, save_checkpoint
from tlt.runtime.checkpoint_recovery import resume_point
from tlt.runtime.devices import policy_device
from tlt.runtime.events import append_event
from tlt.runtime.graceful_stop import GracefulStop
from tlt.runtime.heldout import eval_due, eval_interval, evaluate, heldout_problems
from tlt.runtime.local_worker import LocalWorker
from tlt.runtime.resume_guard import check_drafter_fits, check_same_run
from tlt.runtime.shard_metrics import shard_rollout_metrics
from tlt.spec.plan import SpeculativePlan
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.datasets import load_problems
from tlt.tasks.warmstart import WarmstartConfig
from tlt.workers.policy import PolicyRole

log = logging.getLogger(__name__)

StepCallback = Callable[[dict[str, Any]], None]
MSG_POLICY_GROUP = (
    "policy: {world} policy ranks (policy.replicas x max(1, resources.gpus)) run as processes of their own: run "
    "without --local, or set policy.sharding: none"
)


class LocalTrainer:
    """One process: policy update, rollout engine, checkpoints. Resumes from `out_dir` on construction."""

    def __init__(self, run: TLTTrainingRun, out_dir: str | Path, *, warmstart: WarmstartConfig | None = None):
        self.run = run
        self.spec = run.spec
        if self.spec.policy.world > 1:
            raise ValueError(MSG_POLICY_GROUP.format(world=self.spec.policy.world))
        self.algo = run.spec.algorithm
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_root = self.out_dir / self.spec.checkpoint.path
        # the checkpoint to resume from, read, verified and checked against this run before anything loads
        ckpt, damaged = resume_point(self.checkpoint_root, self.spec.checkpoint.on_corrupt)
        check_same_run(ckpt, self.checkpoint_root, self._spec_json())
        for d in damaged:  # a damaged checkpoint was passed over for `ckpt` (never None then)
            append_event(
                self.out_dir,
                "checkpoint_damaged",
                ckpt.step + 1,
                folder=d.folder,
                moved_to=d.moved_to,
                reason=d.reason,
                resumed_step=ckpt.step,
            )
        self.problems = load_problems(self.spec.dataset, "train")
        self.heldout = heldout_problems(self.spec)  # [] when the run evaluates nothing (`eval_interval`)
        self.eval_every = eval_interval(self.spec)
        self.reward = None if self.spec.verifier.reward is None else load_reward(self.spec.verifier.reward)
        # one process: the engine's copy of the policy computes where the policy does
        device = policy_device(self.spec.policy.resources.gpus, cuda_available=torch.cuda.is_available())
        self.role = PolicyRole(self.spec, warmstart, device)
        plan = SpeculativePlan.of(self.spec.speculative, self.spec.drafter)
        if plan.learns:  # what the hub will hold, before it loads anything
            learned = plan.learned(self.policy.config.num_hidden_layers)
            check_drafter_fits(ckpt, self.checkpoint_root, self.policy.config, learned)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.stopped: Path | None = None
        self._resume(ckpt)
        self.worker = LocalWorker(self.spec, self.policy, self.tokenizer, ckpt)
        self.loggers = build_loggers(
            self.spec.monitoring, self.out_dir, run_name=run.metadata.name, config=self._spec_json()
        )

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_FILE

    @property
    def engine(self) -> Any:
        """The rollout engine (the worker's; `tlt.rollout.engine.Engine`)."""
        return self.worker.engine

    @property
    def policy(self) -> PreTrainedModel:
        return self.role.policy

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.role.tokenizer

    def _spec_json(self) -> dict[str, Any]:
        return self.spec.model_dump(mode="json", by_alias=True)

    def _resume(self, ckpt: Checkpoint | None) -> None:
        if ckpt is not None:
            self.role.load(ckpt)
            self.step = ckpt.step
            self.history = list(ckpt.state["metrics"])
            log.info("resumed from %s at step %d", self.checkpoint_root, self.step)
        rewrite_jsonl(self.metrics_path, self.history)

    def save(self) -> Path:
        """A whole-run checkpoint of the current step."""
        ckpt = Checkpoint(
            step=self.step,
            tensors={},
            objects={},
            state={"step": self.step, "metrics": self.history, "spec": self._spec_json()},
        )
        self.role.add_to(ckpt)
        self.worker.add_to(ckpt)
        return save_checkpoint(self.checkpoint_root, ckpt, keep=self.spec.checkpoint.keep)

    def train_step(self) -> dict[str, Any]:
        """Run step `self.step + 1`: rollout (scored as responses finish), update, weights to the engine, the
        drafters' part. Returns its metrics (the Ray loop's keys for the same parts)."""
        step = self.step + 1
        started = time.time()
        ids = rl_step.select_prompts(len(self.problems), self.algo.prompts_per_step, self.algo.seed, step)
        problems = [self.problems[i] for i in ids]
        completions, scored, result = self.worker.rollout(step, ids, problems)
        rollout_end = time.time()
        rewards = torch.tensor([value for value, _ in scored], dtype=torch.float32).view(len(ids), self.algo.group_size)
        reward_errors = [error for _, error in scored if error is not None]
        record_reward_errors(self.out_dir / REWARD_ERRORS_FILE, step, reward_errors)
        update_started = time.time()
        update = self.role.update(completions, rewards)
        self.worker.load_weights(self.policy)
        update_seconds = time.time() - update_started
        metrics = {
            "step": step,
            **shard_rollout_metrics(completions, rewards, [result], started, rollout_end),
            **update,
            "update_seconds": update_seconds,
            **self.worker.after_update(completions, step),
            "step_seconds": time.time() - started,
        }
        if self.reward is not None:
            metrics["reward_errors"] = len(reward_errors)
        if self.heldout and eval_due(step, self.eval_every, self.algo.steps):  # after the step's timing
            metrics.update(evaluate(self.worker.engine.generate, self.heldout, self.tokenizer, self.spec, self.reward))
        self.step = step
        self.history.append(metrics)
        self.loggers.log_step(metrics)
        return metrics

    def train(self, on_step: StepCallback | None = None, stop: GracefulStop | None = None) -> list[dict[str, Any]]:
        """Run the remaining steps (checkpoint every `checkpoint.intervalSteps` and at the end);
        write the final policy to `<out>/policy`. Returns the metrics of every step of the run.
        Once `stop` is requested: return after the step under way and its checkpoint, which `self.stopped`
        names (None when no step ran since the start: nothing to save)."""
        interval = self.spec.checkpoint.interval_steps
        saved = self.checkpoint_root / f"step-{self.step:08d}" if self.step else None
        stop = stop or GracefulStop()  # not installed: never requested
        while self.step < self.algo.steps and not stop.requested:
            metrics = self.train_step()
            log.info(
                "step %d: reward %.3f, %.0f tok/s", self.step, metrics["reward_mean"], metrics["tokens_per_second"]
            )
            if self.step % interval == 0 or self.step == self.algo.steps or stop.requested:
                saved = self.save()
            if on_step is not None:
                on_step(metrics)
        if self.step < self.algo.steps:  # stopped on a signal
            self.stopped = saved
            append_event(
                self.out_dir, "stop", self.step + 1, signal=stop.name, checkpoint=str(saved) if saved else None
            )
            return self.history
        self.role.save(self.out_dir)
        return self.history
