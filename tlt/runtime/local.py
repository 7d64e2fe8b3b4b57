"""The single-process RL loop: one policy, one rollout engine, whole-run checkpoints, automatic resume.

`LocalTrainer(run, out_dir).train()` runs `algorithm.steps` GRPO steps built from
`tlt.runtime.rl_step`. Output folder layout::

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

import copy
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.models.loading import resolve_dtype
from tlt.monitoring import METRICS_FILE, build_loggers
from tlt.monitoring.jsonl import rewrite_jsonl
from tlt.rl.reward_plugin import REWARD_ERRORS_FILE, RewardError, load_reward, record_reward_errors
from tlt.rollout.compiled import resolve_compile
from tlt.rollout.decode_step import PlainStepper, Stepper
from tlt.rollout.drafting import NgramDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.runner import ModelRunner
from tlt.rollout.speculative import AcceptanceStats, SpeculativeStepper
from tlt.runtime import rl_step
from tlt.runtime.checkpoint import Checkpoint, save_checkpoint
from tlt.runtime.checkpoint_recovery import resume_point
from tlt.runtime.devices import policy_device
from tlt.runtime.events import append_event
from tlt.runtime.graceful_stop import GracefulStop
from tlt.runtime.heldout import eval_due, eval_interval, evaluate, heldout_problems
from tlt.runtime.local_drafter import local_block_drafter, local_learned
from tlt.runtime.resume_guard import check_drafter_fits, check_same_run
from tlt.spec.plan import (
    EAGLE_ARM_KINDS,
    learned_block_size,
    learned_drafters,
    learns_drafters,
    model_free_only,
    speculates,
)
from tlt.spec.run import RunSpec, SpeculativeSpec, TLTTrainingRun
from tlt.tasks.datasets import load_problems
from tlt.tasks.warmstart import WarmstartConfig
from tlt.workers.policy import PolicyRole

log = logging.getLogger(__name__)

StepCallback = Callable[[dict[str, Any]], None]
MSG_NGRAM_ARM = "speculative.mode 'ngram' needs an arm of kind 'ngram' in speculative.arms"


def local_speculative(spec: SpeculativeSpec) -> tuple[SpeculativeSpec, str | None]:
    """`speculative` as this loop can run it, and the one line that says what changed (None: nothing did).

    static / tlt with a block arm run here with the block drafter (`tlt.runtime.local_drafter`); their EAGLE
    arms (chain, tree, mixed) are dropped, since this loop does not run the EAGLE drafter. Without a block
    arm they run as ngram (model-free drafts) when `speculative.arms` has an ngram arm, else as off. Either
    way the rollouts are sampled from the same distribution (speculative decoding is lossless); only their
    speed differs. ngram without an ngram arm raises ValueError (nothing to map it to that the file asked for).
    """
    has_ngram = any(arm.kind == "ngram" for arm in spec.arms)
    if model_free_only(spec) and not has_ngram:
        raise ValueError(MSG_NGRAM_ARM)
    if not learns_drafters(spec):
        return spec, None
    if any(arm.kind == "block" for arm in spec.arms):
        kept = [arm for arm in spec.arms if arm.kind not in EAGLE_ARM_KINDS]
        if len(kept) == len(spec.arms):
            return spec, None
        dropped = sorted({arm.kind for arm in spec.arms if arm.kind in EAGLE_ARM_KINDS})
        note = (
            f"speculative.arms of kind {', '.join(dropped)} need the EAGLE drafter, which --local does not run: "
            f"running speculative.mode {spec.mode!r} with the other arms (the block drafter trains here; run "
            "without --local for every arm)"
        )
        return spec.model_copy(update={"arms": kept}), note
    mode = "ngram" if has_ngram else "off"
    note = (
        f"speculative.mode {spec.mode!r} needs the learned drafter, which --local does not run: running "
        f"speculative.mode {mode!r} instead (same rollout distribution, SD is lossless; run without --local "
        f"for {spec.mode!r})"
    )
    return spec.model_copy(update={"mode": mode}), note


def build_stepper(spec: SpeculativeSpec, runner: ModelRunner) -> tuple[Stepper, SpeculativeStepper | None]:
    """The engine's stepper for `speculative.mode`, and its speculative part (None when off).

    off: plain decoding. ngram: the first `ngram` arm of `speculative.arms` drafts (model-free)
    whenever at most `speculative.threshold` rows are running. static / tlt with block arms: plain here, each
    rollout's stepper is the block drafter's (`tlt.runtime.local_drafter`); without, they need the EAGLE
    drafter, which this loop does not run: they are refused (`tlt train --local` maps them: `local_speculative`).
    """
    plain = PlainStepper(runner)
    if not speculates(spec) or learned_block_size(spec):  # block arms: `LocalBlockDrafter.stepper`
        return plain, None
    if not model_free_only(spec):
        raise ValueError(
            f"speculative.mode {spec.mode!r} needs the learned drafter, which the single-process loop (--local) "
            "does not run; use speculative.mode off or ngram here, or run without --local"
        )
    arm = next((a for a in spec.arms if a.kind == "ngram"), None)
    if arm is None:
        raise ValueError(MSG_NGRAM_ARM)
    speculative = SpeculativeStepper(runner, NgramDrafter(arm.depth, spec.ngram_min, spec.ngram_max))
    return rl_step.ThresholdStepper(plain, speculative, spec.threshold, spec.buckets), speculative


def build_engine(policy: PreTrainedModel, spec: RunSpec) -> tuple[Engine, SpeculativeStepper | None]:
    """A rollout engine over a copy of `policy` in `model.dtype`, one wave of P * G rows, with the
    stepper `build_stepper` picks; also returns that stepper's speculative part (None when off)."""
    model = copy.deepcopy(policy).to(resolve_dtype(spec.model.dtype)).eval()
    context = min(spec.model.max_context, model.config.max_position_embeddings)
    rows = spec.algorithm.prompts_per_step * spec.algorithm.group_size
    learned = learned_drafters(spec.speculative, model.config.num_hidden_layers)
    engine = Engine(
        model,
        max_batch_size=rows,
        max_context=context,
        return_hidden=learned.block_size > 0,
        feature_layers=learned.feature_layers,
        compile=resolve_compile(spec.rollout.compile, model),
    )
    engine.stepper, speculative = build_stepper(spec.speculative, engine.runner)
    return engine, speculative


class LocalTrainer:
    """One process: policy update, rollout engine, checkpoints. Resumes from `out_dir` on construction."""

    def __init__(self, run: TLTTrainingRun, out_dir: str | Path, *, warmstart: WarmstartConfig | None = None):
        self.run = run
        self.spec = run.spec
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
        if learned_block_size(self.spec.speculative):  # what the block drafter's hub will hold
            learned = local_learned(self.spec, self.policy.config.num_hidden_layers)
            check_drafter_fits(ckpt, self.checkpoint_root, self.policy.config, learned)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.stopped: Path | None = None
        self._resume(ckpt)
        self.engine, self.speculative = build_engine(self.policy, self.spec)
        self.block = local_block_drafter(self.spec, self.engine, ckpt)
        self.loggers = build_loggers(
            self.spec.monitoring, self.out_dir, run_name=run.metadata.name, config=self._spec_json()
        )

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_FILE

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
            self.role.load(ckpt.tensors, ckpt.objects)
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
        self.role.add_to(ckpt.tensors, ckpt.objects)
        if self.block is not None:
            self.block.add_to(ckpt)
        return save_checkpoint(self.checkpoint_root, ckpt, keep=self.spec.checkpoint.keep)

    def train_step(self) -> dict[str, Any]:
        """Run step `self.step + 1`: rollout, score, recompute log-probs, update, sync. Returns its metrics."""
        step = self.step + 1
        started = time.perf_counter()
        ids = rl_step.select_prompts(len(self.problems), self.algo.prompts_per_step, self.algo.seed, step)
        problems = [self.problems[i] for i in ids]
        trace = rl_step.RolloutTrace()
        if self.speculative is not None:
            self.speculative.stats = AcceptanceStats()
        if self.block is not None:
            self.engine.stepper = self.block.stepper(self.engine.max_batch_size, self.engine.max_context)
        completions = rl_step.rollout(
            self.engine, problems, self.tokenizer, self.algo, step=step, problem_ids=ids, trace=trace
        )
        rollout_seconds = time.perf_counter() - started
        reward_errors: list[RewardError] = []
        rewards = rl_step.score_completions(
            completions,
            problems,
            self.tokenizer,
            self.spec.dataset.answer_format,
            reward=self.reward,
            errors=reward_errors,
        )
        record_reward_errors(self.out_dir / REWARD_ERRORS_FILE, step, reward_errors)
        update_started = time.perf_counter()
        update = self.role.update(completions, rewards)
        rl_step.sync_weights(self.policy, self.engine)
        drafter = self.block.after_update(completions, step) if self.block is not None else {}
        metrics = {
            "step": step,
            **rl_step.rollout_metrics(completions, rewards, trace, rollout_seconds),
            **update,
            "update_seconds": time.perf_counter() - update_started,
            "step_seconds": time.perf_counter() - started,
        }
        metrics.update(drafter)
        if self.reward is not None:
            metrics["reward_errors"] = len(reward_errors)
        if self.speculative is not None:
            metrics["accept_length"] = self.speculative.stats.accept_length
            metrics["sd_steps"] = self.speculative.stats.steps
        if self.heldout and eval_due(
            step, self.eval_every, self.algo.steps
        ):  # after the step's timing: not part of step_seconds
            metrics.update(evaluate(self.engine.generate, self.heldout, self.tokenizer, self.spec, self.reward))
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
