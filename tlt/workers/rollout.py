"""The run's rollout worker, as a plain class that `tlt.runtime.ray_cluster` turns into a Ray actor.

`RolloutWorker`: its own engine copy of the policy and its prompt shard each step; responses go to the
verifiers the moment they finish. It is made of three parts, each in its own module:
- generation (`tlt.workers.shard_generation`): requests, the stepper of the run's `speculative.mode`
  on the bandit it keeps across rollouts, the rollout-history store;
- its drafter (`tlt.workers.rollout_drafter`): the copy it drafts with, its online buffer and co-located
  spot trainer (a thread in the same process, sharing the device once the engine has released its KV
  cache), or with `drafter.placement: sidecar` the pod's sidecar trainer;
- its state (`tlt.workers.rollout_state`): GENERATING / IDLE / TRAINING with timestamps, for the
  coordinator and, in a cluster, on its pod for the operator.
A rollout's bookkeeping (buffering its samples, scoring the drafters, indexing its responses for history
drafts) waits until the coordinator holds its results (`settle`, `tlt.workers.after_rollout`).
The run's shared services (the verifiers, the drafter hub) are in `tlt.workers.services`; the worker
of `rollout.engine: vllm` is `tlt.workers.vllm_rollout`.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch

from tlt.adaptive.arms import block_graphs, drafter_graphs
from tlt.models.loading import load_policy
from tlt.rollout.compiled import resolve_compile
from tlt.rollout.engine import Engine
from tlt.rollout.warmup import warm_up, warm_up_blocks
from tlt.runtime.devices import actor_device
from tlt.runtime.heap import freeze_actor_heap
from tlt.runtime.optional_ray import ray
from tlt.runtime.partial_work import GroupWork
from tlt.spec.run import RunSpec
from tlt.tasks.problem import Problem
from tlt.workers.after_rollout import AfterRollout
from tlt.workers.drafter_watch import DrafterWatch
from tlt.workers.rollout_drafter import NO_AGREEMENT, Drafter, WorkerDrafter
from tlt.workers.rollout_state import GENERATING, IDLE, TRAINING, WorkerStates, node_id, worker_identity
from tlt.workers.shard_generation import ShardGenerator, release_kv_cache


class RolloutWorker:
    """One rollout engine, its drafter and its spot trainer; methods run on the actor's threads."""

    generator: ShardGenerator | None = None  # the vLLM worker generates without one

    def __init__(
        self,
        index: int,
        spec: RunSpec,
        policy_path: str,
        rows: int,
        verifiers: list[Any],
        hub: Any | None,
        threads: int = 1,
        device: torch.device | None = None,
        sidecar: Any | None = None,
    ) -> None:
        torch.set_num_threads(threads)
        model, self.tokenizer = load_policy(policy_path, spec.model.dtype)
        # `device` (outside Ray: `tlt bench worker`), else the GPU Ray gave this actor (`rollout.resources.gpus`),
        # else the CPU (also outside Ray: tests, tools)
        gpu_ids = ray.get_gpu_ids() if ray is not None and ray.is_initialized() else []
        model.to(device if device is not None else actor_device(gpu_ids))
        self._setup(index, spec, model, rows, verifiers)
        drafter, block = self.drafting.eagle, self.drafting.block
        self.engine = Engine(
            model,
            max_batch_size=self.rows,
            max_context=self.context,
            return_hidden=self.drafting.drafter is not None,
            compile=resolve_compile(spec.rollout.compile, model),
            feature_layers=self.drafting.learned.feature_layers,  # what its block drafter reads
        )
        self.engine.draft_vocab = self.drafting.draft_vocab
        self.generator = ShardGenerator(
            self.engine, self.tokenizer, spec, index, drafter, self.rows, self.context, block=block
        )
        # compile now, not in step 0's rollout: the graphs this run's arms and sampling can reach
        sampled = spec.algorithm.temperature > 0
        self.warmup_seconds = warm_up(self.engine, drafter, **drafter_graphs(spec.speculative, sampled=sampled))
        self.warmup_seconds += warm_up_blocks(self.engine, block, **block_graphs(spec.speculative, sampled=sampled))
        self._ready(hub, sidecar)

    def _setup(self, index: int, spec: RunSpec, model: Any, rows: int, verifiers: list[Any]) -> None:
        """What every rollout worker has, whatever its engine: identity, state reports, the drafter bound
        to `model` (modes static / tlt), the after-rollout thread."""
        self.index = index
        self.name = worker_identity(index)
        self.spec = spec
        self.verifiers = verifiers
        self.model = model
        self.context = min(spec.model.max_context, model.config.max_position_embeddings)
        self.rows = max(rows, 1)
        self.states = WorkerStates()
        self.after = AfterRollout()
        self.drafting = WorkerDrafter(self.name, spec, model)
        self.watch = DrafterWatch(spec.drafter.health)
        self._kept_bandit: dict[str, Any] | None = None  # a checkpoint's bandit, kept where nothing uses it

    def _ready(self, hub: Any | None, sidecar: Any | None) -> None:
        """The end of every rollout worker's start, whatever its engine: its trainer set up with the hub, a
        replacement's sidecar attached before any call can ask for a rollout, and last the heap frozen (a full
        collection now, not in a rollout: `tlt.runtime.heap`)."""
        self.drafting.setup_trainer(hub)
        if sidecar is not None:
            self.drafting.attach_sidecar(sidecar)
        self.heap = freeze_actor_heap(self.name)

    def attach_sidecar(self, sidecar: Any) -> str:
        """Use `sidecar` (a `SidecarTrainer` actor on this pod's drafter-trainer node) as this worker's
        trainer (`drafter.placement: sidecar`); returns this worker's Ray node id."""
        self.drafting.attach_sidecar(sidecar)
        return node_id()

    def status(self) -> dict[str, Any]:
        state, since = self.states.current()
        return {
            "worker": self.name,
            "state": state,
            "since": since,
            "running": self.states.running,
            "trainer_iterations": self.drafting.iterations(state == TRAINING),
            "warmup_seconds": getattr(self, "warmup_seconds", 0.0),
            "heap": getattr(self, "heap", None),
            "device": str(self.model.device),
            "pid": os.getpid(),
        }

    def _submit(self, index: int, request_id: str, text: str, problem: Problem) -> Any:
        """A verifier's scoring task of one response (round robin over the verifiers by `index`)."""
        verifier = self.verifiers[index % len(self.verifiers)]
        return verifier.score.remote(text, problem.answer, problem.prompt, dict(problem.record), request_id)

    def set_verifiers(self, verifiers: list[Any]) -> None:
        """Stream responses to `verifiers` from now on (the run replaced a lost one)."""
        self.verifiers = verifiers

    def take_states(self) -> list[tuple[str, float]]:
        """State transitions since the last call (the current state stays as the first entry)."""
        return self.states.take()

    def rollout(
        self,
        step: int,
        problem_ids: list[int],
        problems: list[Problem],
        weights: dict[str, torch.Tensor],
        drafter: Drafter | None,
        candidate: Drafter | None = None,
        work: list[GroupWork] | None = None,
        quotas: list[int] | None = None,
    ) -> dict[str, Any]:
        """Generate this shard (group_size samples of each problem) and stream each finished response to
        a verifier; a partial rollout's shard (`work`) ends at `quotas` = [its share] of the step's groups,
        unfinished responses coming back "abort" with reward None (`ShardGenerator.generate`). Returns
        completions (without hidden states), reward refs in completion order, the engine trace and the set-up's
        parts; the drafter's top-1 agreement on these fresh rollouts comes from `agreement`, and with a
        `candidate` (the hub's newer parameters, `drafter.publish: validated`) its agreement on the same
        rollouts too, and the trainer continues from the candidate."""
        assert self.generator is not None
        self.drafting.check_ready(step)
        stamps = [time.time()]  # the set-up before generating, part by part (`setup_seconds`)
        self.agreement()  # the previous rollout's bookkeeping is done before its drafter changes
        stamps.append(time.time())
        self.wait_history_indexed()
        stamps.append(time.time())
        self.states.set(GENERATING)
        started = time.time()
        self.engine.load_weights(weights)
        stamps.append(time.time())
        self.drafting.load(drafter)
        self.watch.serve(drafter)
        stamps.append(time.time())
        speculate = self.watch.drafts()
        out = self.generator.generate(
            step, problem_ids, problems, self._submit, self.states, work, quotas, speculate=speculate
        )
        if self.drafting.drafter is not None:
            out["sd_health"] = self.watch.judge(step, out["sd_row_steps"], out["sd_accepted"], drafted=speculate)
        completions, generate_started = out.pop("completions"), out.pop("generate_started")
        release_kv_cache(self.engine)
        finished = [c for c in completions if c.finish_reason != "abort"]  # the others go on in a later step
        self._leave_settle(finished, step, drafter, candidate)
        self.states.set(IDLE)
        return {
            "worker": self.name,
            "completions": [replace(c, hidden=None) for c in completions],
            "started_at": started,
            "called_at": stamps[0],
            "setup_seconds": dict(
                zip(
                    ("settle_wait", "history_wait", "load_weights", "load_drafter", "stepper"),
                    (b - a for a, b in zip(stamps, [*stamps[1:], generate_started])),
                )
            ),
            **out,
        }

    def wait_history_indexed(self) -> None:
        """Wait for the last rollout's responses to enter the history store (before it drafts again)."""
        self.after.indexed()

    def agreement(self) -> dict[str, Any]:
        """The last rollout's drafter top-1 agreement on its fresh samples ("agree", "agree_total"; with a
        candidate, its "candidate_*" too), once its bookkeeping has finished (it runs after the rollout's
        results returned: buffering the samples and scoring drafters is not the rollout's critical path)."""
        out = self.after.result()
        return out if out is not None else dict(NO_AGREEMENT)

    def _leave_settle(
        self, completions: list[Any], step: int, drafter: Drafter | None, candidate: Drafter | None
    ) -> None:
        """Leave the rollout's bookkeeping and history indexing to `settle` (`tlt.workers.after_rollout`)."""
        generator = self.generator
        waves = generator.take_waves() if generator is not None else []
        self.after.leave(
            lambda: self._settle(completions, step, drafter, candidate),
            (lambda: generator.index_waves(waves)) if generator is not None and waves else None,
        )

    def settle(self) -> None:
        """Start the last rollout's bookkeeping (index its responses into the history store, buffer the
        samples, score the drafters) if it has not started; returns at once in the container (a sidecar
        takes the samples before this returns). Idempotent: the coordinator calls it once it holds the
        results, and everything that needs the bookkeeping done calls it first."""
        self.after.start()

    def _settle(self, completions: list[Any], step: int, drafter: Drafter | None, candidate: Drafter | None) -> Future:
        """Buffer the samples and score the drafters: in the background in the container; a sidecar does it
        before this returns (its trainer takes the samples; its calls have no order among themselves)."""
        if self.drafting.sidecar is not None:
            done: Future = Future()
            done.set_result(self._agreement_and_buffer(completions, step, drafter, candidate))
            return done
        return self.after.submit(self._agreement_and_buffer, completions, step, drafter, candidate)

    def _agreement_and_buffer(
        self, completions: list[Any], step: int, drafter: Drafter | None, candidate: Drafter | None
    ) -> dict[str, Any]:
        return self.drafting.take_rollouts(self.model, completions, step, drafter, candidate)

    def bandit_state(self) -> dict[str, Any] | None:
        """The bandit's state (what it learned about the arms), for whole-run checkpoints; None before
        the first speculative rollout."""
        return self.generator.bandit_state() if self.generator is not None else self._kept_bandit

    def load_bandit(self, state: dict[str, Any] | None) -> None:
        """Resume the bandit from a checkpoint: it is loaded into the next rollout's stepper (whose
        arms must match; `BucketedBandit.load_state_dict` says so otherwise)."""
        if self.generator is not None:
            self.generator.load_bandit(state)
        else:
            self._kept_bandit = state

    def trainer_state(self) -> dict[str, Any] | None:
        """The drafter buffer and shuffle epoch of this worker's trainer (`SpotTrainer.state_dict`), in
        the container or the sidecar, and its draft vocabulary's counts, for whole-run checkpoints; None
        without a learned drafter."""
        self.agreement()  # the last rollout's samples are in the buffer
        return self.drafting.state()

    def load_trainer_state(self, state: dict[str, Any] | None) -> None:
        """Resume the trainer's buffer (and the draft vocabulary's counts) from a checkpoint (before this
        worker's first rollout)."""
        self.drafting.load_state(state)

    def start_training(self, step: int) -> float:
        self.settle()  # the trainer starts once the rollout's samples are buffered
        started = self.drafting.start(step, after=self.after.settling)
        self.states.set(TRAINING)
        return started

    def stop_training(self) -> dict[str, Any]:
        """Stop the trainer (if running) and acknowledge with the trainer process's timestamps."""
        ack = {"worker": self.name, **self.drafting.stop()}
        if ack["was_training"]:
            self.states.set(IDLE)
        if self.drafting.sidecar is not None:
            ack["worker_node"] = node_id()
        return ack
