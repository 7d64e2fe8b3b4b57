"""The run's worker roles, as plain classes that `tlt.runtime.ray_cluster` turns into Ray actors.

- `RolloutWorker`: its own engine copy of the policy, its prompt shard each step, its online
  buffer and a co-located spot trainer (a thread in the same process, sharing the device once
  the engine has released its KV cache). Responses go to the verifiers the moment they finish.
  Reports GENERATING / IDLE / TRAINING with timestamps to the coordinator, and in a cluster also on
  its pod for the operator (`tlt.runtime.k8s_slots`). With `drafter.placement: sidecar` the buffer
  and the trainer live in the pod's sidecar container instead (`tlt.runtime.ray_sidecar`): the
  worker hands each step's rollouts (hidden states included, straight to the sidecar, never through
  the coordinator) and forwards the coordinator's start / stop, so it stays the one reporter of
  its state and the one writer of its pod's state annotation.
The run's shared services (the verifiers, the drafter hub) are in `tlt.runtime.ray_services`.

Rollout uses the step building blocks of `tlt.runtime.rl_step` (requests, rollout trace).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from tlt.adaptive.arms import drafter_graphs, new_history_store, uses_history
from tlt.adaptive.bandit import BucketedBandit
from tlt.adaptive.adaptive_stepper import AdaptiveStepper, rollout_stepper
from tlt.spec.run import RunSpec
from tlt.drafter.buffer import OnlineBuffer
from tlt.drafter.intake import buffer_and_agreement, policy_head
from tlt.drafter.trainer import SpotTrainer
from tlt.models.draft_vocab import DraftVocabTracker
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.loading import load_policy
from tlt.rollout.compiled import resolve_compile
from tlt.rollout.engine import Engine
from tlt.rollout.sequence import Sequence
from tlt.rollout.step_timing import STEP_SPLIT_ENV, StepSplit
from tlt.rollout.decode_step import FinishWatcher
from tlt.rollout.warmup import warm_up
from tlt.runtime import k8s_slots, rl_step
from tlt.runtime.after_rollout import AfterRollout
from tlt.runtime.devices import actor_device, completion_to_cpu, to_cpu, tree_to_cpu
from tlt.runtime.heap import freeze_actor_heap
from tlt.runtime.optional_ray import ray
from tlt.runtime.ray_services import hub_push, no_hub
from tlt.tasks.problem import Problem

log = logging.getLogger(__name__)

GENERATING, IDLE, TRAINING = "GENERATING", "IDLE", "TRAINING"
DRAFTER_MODES = ("static", "tlt")


def release_kv_cache(engine: Engine) -> None:
    """Give back the engine's KV memory between rollouts (it regrows on the next prefill)."""
    engine.runner.cache.release()


class RolloutWorker:
    """One rollout engine, its buffer and its spot trainer; methods run on the actor's threads."""

    def __init__(self, index: int, spec: RunSpec, policy_path: str, rows: int, verifiers: list[Any],
                 hub: Any | None, threads: int = 1, device: torch.device | None = None) -> None:
        torch.set_num_threads(threads)
        model, self.tokenizer = load_policy(policy_path, spec.model.dtype)
        # `device` (outside Ray: `tlt bench worker`), else the GPU Ray gave this actor (`rollout.resources.gpus`),
        # else the CPU (also outside Ray: tests, tools)
        gpu_ids = ray.get_gpu_ids() if ray is not None and ray.is_initialized() else []
        model.to(device if device is not None else actor_device(gpu_ids))
        self._setup(index, spec, model, rows, verifiers)
        self.engine = Engine(model, max_batch_size=self.rows, max_context=self.context,
                             return_hidden=self.uses_drafter, compile=resolve_compile(spec.rollout.compile, model))
        self.engine.draft_vocab = self.draft_vocab
        self.plain_stepper = self.engine.stepper
        self.history = new_history_store(spec.speculative) if uses_history(spec.speculative) else None
        if self.history is not None:
            self.engine.wave_observers.append(lambda sequences: self._waves.append(list(sequences)))
        # compile now, not in step 0's rollout: the graphs this run's arms and sampling can reach
        self.warmup_seconds = warm_up(self.engine, self.drafter,
                                      **drafter_graphs(spec.speculative, sampled=spec.algorithm.temperature > 0))
        self._setup_trainer(hub)
        self.heap = freeze_actor_heap(self.name)  # last: a full collection now, not in a rollout (`tlt.runtime.heap`)

    def _setup(self, index: int, spec: RunSpec, model: Any, rows: int, verifiers: list[Any]) -> None:
        """What every rollout worker has, whatever its engine: identity, state reports, the drafter bound
        to `model` (modes static / tlt), the settle thread."""
        self.index = index
        self.name = worker_identity(index)
        self.spec = spec
        self.verifiers = verifiers
        self.model = model
        self.context = min(spec.model.max_context, model.config.max_position_embeddings)
        self.uses_drafter = spec.speculative.mode in DRAFTER_MODES
        self.rows = max(rows, 1)
        self._lock = threading.Lock()
        self._reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-report")
        # A rollout's drafter bookkeeping (buffer, agreement) and history indexing: started once the
        # coordinator holds its results (`settle`), off the rollout's critical path
        self.after = AfterRollout()
        self.states: list[tuple[str, float]] = [(IDLE, time.time())]
        self.running = 0
        self.drafter: EagleDrafter | None = None
        self.trainer: SpotTrainer | None = None
        self.sidecar: Any | None = None
        self.bandit: BucketedBandit | None = None
        self._bandit_state: dict[str, Any] | None = None  # from a checkpoint, loaded into the next stepper
        if self.uses_drafter:
            self.drafter = EagleDrafter(drafter_config_from_target(model.config)).to(model.device, torch.float32).eval()
            self.drafter.bind_policy(model)
        # the reduced draft vocabulary (before the drafter's graphs compile), re-picked every rollout
        size = spec.speculative.draft_vocab if self.drafter is not None else 0
        self.draft_vocab = (DraftVocabTracker(self.drafter.set_draft_vocab(size), model.get_output_embeddings())
                            if size else None)
        # Kept across steps: a prompt's earlier responses draft its next ones. A finished wave is indexed
        # after the rollout's results return (~0.1 s for 32 rows here: not the rollout's critical path).
        self.history = None
        self._waves: list[list[Sequence]] = []

    def _setup_trainer(self, hub: Any | None) -> None:
        """The co-located spot trainer and its buffer (`drafter.placement: in-container`)."""
        if self.uses_drafter and self.spec.drafter.placement == "in-container":
            self.buffer = OnlineBuffer(self.spec.drafter.buffer_steps, self.spec.drafter.batch_tokens,
                                       seed=self.spec.algorithm.seed)
            push = hub_push(hub) if hub is not None else no_hub
            self.trainer = SpotTrainer(self.name, self.drafter, self.buffer, push,
                                       learning_rate=self.spec.drafter.learning_rate)

    def attach_sidecar(self, sidecar: Any) -> str:
        """Use `sidecar` (a `SidecarTrainer` actor on this pod's drafter-trainer node) as this worker's
        trainer (`drafter.placement: sidecar`); returns this worker's Ray node id."""
        if self.drafter is None or self.trainer is not None:
            raise RuntimeError(f"{self.name}: a sidecar trainer needs speculative.mode static or tlt and "
                               "drafter.placement 'sidecar'")
        self.sidecar = sidecar
        return node_id()

    def _set_state(self, state: str) -> None:
        now = time.time()
        with self._lock:
            self.states.append((state, now))
        self._reporter.submit(_report_to_pod, state, now)  # one thread: the pod sees states in order

    def status(self) -> dict[str, Any]:
        with self._lock:
            state, since = self.states[-1]
        if self.sidecar is not None:
            iterations = ray.get(self.sidecar.iterations.remote()) if state == TRAINING else 0
        else:
            run = self.trainer.current if self.trainer is not None else None
            iterations = run.iterations if run is not None else 0
        return {"worker": self.name, "state": state, "since": since, "running": self.running,
                "trainer_iterations": iterations, "warmup_seconds": getattr(self, "warmup_seconds", 0.0),
                "heap": getattr(self, "heap", None), "device": str(self.model.device)}

    def take_states(self) -> list[tuple[str, float]]:
        """State transitions since the last call (the current state stays as the first entry)."""
        with self._lock:
            out, self.states = self.states, self.states[-1:]
            return out

    def rollout(self, step: int, problem_ids: list[int], problems: list[Problem], weights: dict[str, torch.Tensor],
                drafter: tuple[int, dict[str, torch.Tensor]] | None,
                candidate: tuple[int, dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:
        """Generate this shard (group_size samples of each problem) and stream each finished response to
        a verifier. Returns completions (without hidden states), reward refs in completion order, the
        engine trace, and the drafter's top-1 agreement on these fresh rollouts; with a `candidate`
        (the hub's newer parameters, `drafter.publish: validated`), its agreement on the same rollouts
        too, and the trainer continues from the candidate."""
        if self.trainer is not None and self.trainer.active:
            raise RuntimeError(f"{self.name}: rollout of step {step} asked while its trainer still runs")
        if self.drafter is not None and self.trainer is None and self.sidecar is None:
            raise RuntimeError(f"{self.name}: drafter.placement is 'sidecar' but no sidecar trainer is attached")
        stamps = [time.time()]  # the set-up before generating, part by part (`setup_seconds`)
        self.agreement()  # the previous rollout's bookkeeping is done before its drafter changes
        stamps.append(time.time())
        self.wait_history_indexed()
        stamps.append(time.time())
        self._set_state(GENERATING)
        started = time.time()
        self.engine.load_weights(weights)
        stamps.append(time.time())
        if drafter is not None and self.trainer is not None:
            self.trainer.load(*drafter)
        elif drafter is not None and self.drafter is not None:
            self.drafter.load_state_dict(drafter[1])
        stamps.append(time.time())
        by_request: dict[str, Problem] = {}
        requests = rl_step.make_requests(problems, problem_ids, self.tokenizer, self.spec.algorithm, step)
        for request, problem in zip(requests, (p for p in problems for _ in range(self.spec.algorithm.group_size))):
            by_request[request.request_id] = problem

        def verify(verifier: Any, request_id: str, text: str) -> Any:
            problem = by_request[request_id]
            return verifier.score.remote(text, problem.answer, problem.prompt, dict(problem.record), request_id)
        rewards: dict[str, Any] = {}
        first_done: list[float] = []

        def send(seq: Sequence) -> None:
            text = self.tokenizer.decode(seq.tokens, skip_special_tokens=True)
            verifier = self.verifiers[len(rewards) % len(self.verifiers)]
            rewards[seq.request.request_id] = verify(verifier, seq.request.request_id, text)
            first_done.append(time.time())

        trace = rl_step.RolloutTrace()

        def on_step(metrics: Any) -> None:
            self.running = metrics.running
            trace(metrics)

        stepper = rollout_stepper(self.spec.speculative, self.engine.runner, self.drafter, rows=self.rows,
                                  context=self.context, bandit=self.bandit, seed=self.spec.algorithm.seed + self.index,
                                  history=self.history)
        if isinstance(stepper, AdaptiveStepper) and self._bandit_state is not None:
            stepper.bandit.load_state_dict(self._bandit_state)
            self._bandit_state = None
        self.engine.stepper = FinishWatcher(stepper, send)
        generate_started = time.time()
        split = StepSplit() if os.environ.get(STEP_SPLIT_ENV) == "1" else None  # `tlt bench run --split`
        try:
            with split if split is not None else contextlib.nullcontext():
                completions = self.engine.generate(requests, on_step=on_step)
            completions = [completion_to_cpu(c) for c in completions]  # for the buffer, a sidecar, the coordinator
        finally:
            self.engine.stepper = self.plain_stepper
            self.running = 0
        adaptive = stepper if isinstance(stepper, AdaptiveStepper) else None
        summary = adaptive.summary() if adaptive is not None else {"arms_chosen": {}, "arm_rates": {}}
        if adaptive is not None:
            self.bandit = adaptive.bandit
        streamed = len(rewards)
        for completion in completions:
            if completion.request_id not in rewards:
                rewards[completion.request_id] = verify(
                    self.verifiers[0], completion.request_id,
                    self.tokenizer.decode(completion.token_ids, skip_special_tokens=True))
        finished = time.time()
        generate_seconds = finished - generate_started
        release_kv_cache(self.engine)
        self._leave_settle(completions, step, drafter, candidate)
        self._set_state(IDLE)
        return {"worker": self.name, "completions": [replace(c, hidden=None) for c in completions],
                "rewards": [rewards[c.request_id] for c in completions], "streamed": streamed,
                "trace": trace.steps, "started_at": started, "finished_at": finished,
                "generate_seconds": generate_seconds, "called_at": stamps[0],
                "setup_seconds": dict(zip(("settle_wait", "history_wait", "load_weights", "load_drafter", "stepper"),
                                          (b - a for a, b in zip(stamps, [*stamps[1:], generate_started])))),
                "first_response_at": first_done[0] if first_done else finished,
                "sd_row_steps": adaptive.stats.row_steps if adaptive else 0,
                "sd_accepted": adaptive.stats.accepted if adaptive else 0,
                "sd_by_position": ({str(e): list(c) for e, c in sorted(adaptive.stats.by_position.items())}
                                   if adaptive else {}),
                "sd_arms": summary["arms_chosen"],
                "sd_arm_rates": summary["arm_rates"], "draft_vocab_coverage": self.engine.draft_vocab_coverage,
                **({"step_split": split.table()} if split is not None else {})}

    def _index_waves(self, waves: list[list[Sequence]]) -> None:
        assert self.history is not None
        for sequences in waves:
            self.history.observe(sequences)

    def wait_history_indexed(self) -> None:
        """Wait for the last rollout's responses to enter the history store (before it drafts again)."""
        self.after.indexed()

    def agreement(self) -> dict[str, Any]:
        """The last rollout's drafter top-1 agreement on its fresh samples ("agree", "agree_total"; with a
        candidate, its "candidate_*" too), once its bookkeeping has finished (it runs after the rollout's
        results returned: buffering the samples and scoring drafters is not the rollout's critical path)."""
        out = self.after.result()
        return out if out is not None else {"agree": 0, "agree_total": 0}

    def _leave_settle(self, completions: list[Any], step: int, drafter: tuple[int, dict[str, torch.Tensor]] | None,
                      candidate: tuple[int, dict[str, torch.Tensor]] | None) -> None:
        """Leave the rollout's bookkeeping and history indexing to `settle` (`tlt.runtime.after_rollout`)."""
        waves, self._waves = self._waves, []
        self.after.leave(lambda: self._settle(completions, step, drafter, candidate),
                         (lambda: self._index_waves(waves)) if waves else None)

    def settle(self) -> None:
        """Start the last rollout's bookkeeping (index its responses into the history store, buffer the
        samples, score the drafters) if it has not started; returns at once in the container (a sidecar
        takes the samples before this returns). Idempotent: the coordinator calls it once it holds the
        results, and everything that needs the bookkeeping done calls it first."""
        self.after.start()

    def _settle(self, completions: list[Any], step: int, drafter: tuple[int, dict[str, torch.Tensor]] | None,
                candidate: tuple[int, dict[str, torch.Tensor]] | None) -> Future:
        """Buffer the samples and score the drafters: in the background in the container; a sidecar does it
        before this returns (its trainer takes the samples; its calls have no order among themselves)."""
        if self.sidecar is not None:
            done: Future = Future()
            done.set_result(self._agreement_and_buffer(completions, step, drafter, candidate))
            return done
        return self.after.submit(self._agreement_and_buffer, completions, step, drafter, candidate)

    def _agreement_and_buffer(self, completions: list[Any], step: int,
                              drafter: tuple[int, dict[str, torch.Tensor]] | None,
                              candidate: tuple[int, dict[str, torch.Tensor]] | None) -> dict[str, Any]:
        if self.sidecar is not None:
            head = to_cpu(policy_head(self.model))
            return ray.get(self.sidecar.take_rollouts.remote(step, completions, head, drafter, candidate))
        if self.trainer is None:
            return {"agree": 0, "agree_total": 0}
        return buffer_and_agreement(self.buffer, self.trainer, completions, step, self.spec.drafter.batch_tokens,
                                    candidate)

    def bandit_state(self) -> dict[str, Any] | None:
        """The bandit's state (what it learned about the arms), for whole-run checkpoints; None before
        the first speculative rollout."""
        return self.bandit.state_dict() if self.bandit is not None else self._bandit_state

    def load_bandit(self, state: dict[str, Any] | None) -> None:
        """Resume the bandit from a checkpoint: it is loaded into the next rollout's stepper (whose
        arms must match; `BucketedBandit.load_state_dict` says so otherwise)."""
        self.bandit, self._bandit_state = None, state

    def trainer_state(self) -> dict[str, Any] | None:
        """The drafter buffer and shuffle epoch of this worker's trainer (`SpotTrainer.state_dict`), in
        the container or the sidecar, and its draft vocabulary's counts, for whole-run checkpoints; None
        without a learned drafter."""
        self.agreement()  # the last rollout's samples are in the buffer
        if self.sidecar is not None:
            state = ray.get(self.sidecar.trainer_state.remote())
        else:
            state = tree_to_cpu(self.trainer.state_dict()) if self.trainer is not None else None
        if state is not None and self.draft_vocab is not None:  # the draft vocabulary's token counts too
            state["draft_vocab_counts"] = self.draft_vocab.counts.clone()
        return state

    def load_trainer_state(self, state: dict[str, Any] | None) -> None:
        """Resume the trainer's buffer (and the draft vocabulary's counts) from a checkpoint (before this
        worker's first rollout)."""
        if state is None:
            return
        state = dict(state)
        counts = state.pop("draft_vocab_counts", None)
        if counts is not None and self.draft_vocab is not None:
            self.draft_vocab.load_counts(counts)
        if self.sidecar is not None:
            ray.get(self.sidecar.load_trainer_state.remote(state))
        elif self.trainer is not None:
            self.trainer.load_state_dict(state)
        else:
            raise RuntimeError(f"{self.name}: the checkpoint holds a drafter buffer but speculative.mode "
                               f"{self.spec.speculative.mode!r} keeps none")

    def start_training(self, step: int) -> float:
        self.settle()  # the trainer starts once the rollout's samples are buffered
        if self.sidecar is not None:
            started = ray.get(self.sidecar.start_training.remote(step))
        elif self.trainer is not None:
            started = self.trainer.start(step, after=self.after.settling)
        else:
            raise RuntimeError(f"{self.name}: speculative.mode {self.spec.speculative.mode!r} has no drafter to train")
        self._set_state(TRAINING)
        return started

    def stop_training(self) -> dict[str, Any]:
        """Stop the trainer (if running) and acknowledge with the trainer process's timestamps."""
        if self.sidecar is not None:
            ack = ray.get(self.sidecar.stop_training.remote())
            if ack["was_training"]:
                self._set_state(IDLE)
            return {"worker": self.name, **ack, "worker_node": node_id()}
        if self.trainer is None or not self.trainer.active:
            now = time.time()
            return {"worker": self.name, "was_training": False, "stop_received_at": now, "stopped_at": now}
        ack = self.trainer.stop()
        self._set_state(IDLE)
        return {"worker": self.name, "was_training": True, **ack}


def node_id() -> str:
    """This process's Ray node id."""
    return str(ray.get_runtime_context().get_node_id())


def worker_identity(index: int) -> str:
    """`rollout-<rank>` of the rollout pod this actor runs on (the operator's slot names), else `rollout-<index>`."""
    pod = os.environ.get("TLT_POD_NAME")
    if os.environ.get("TLT_ROLE") == "rollout" and pod:
        return k8s_slots.worker_name(pod)
    return f"rollout-{index}"


def _report_to_pod(state: str, since: float) -> None:
    """Publish the state on this pod for the operator (a no-op outside a cluster); never fails the worker."""
    try:
        k8s_slots.report_state(state, datetime.datetime.fromtimestamp(since, datetime.UTC))
    except k8s_slots.SlotApiError as exc:
        log.warning("could not report worker state %s to the pod: %s", state, exc)
