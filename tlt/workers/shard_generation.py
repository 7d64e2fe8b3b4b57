"""A rollout worker's generation of its prompt shard on the project's engine.

Each rollout builds the requests of its shard (`tlt.runtime.rl_step.make_requests`: group_size samples of
each problem), a fresh stepper for `speculative.mode` (`rollout_stepper`) on the bandit the last rollout
left (so what it learned about the arms carries over from step to step, and across a checkpoint), and
streams every finished response to a verifier the moment it finishes (`FinishWatcher`). Kept across
rollouts: the rollout-history store, in which a prompt's earlier responses draft its next ones; a
finished wave is indexed after the rollout's results return (`take_waves`, `index_waves`), off the
rollout's critical path. `tlt bench run --split` times each decode step by part (`StepSplit`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from tlt.adaptive.adaptive_stepper import AdaptiveStepper, rollout_stepper
from tlt.adaptive.arms import new_history_store, uses_history
from tlt.adaptive.bandit import BucketedBandit
from tlt.models.block_drafter import BlockDrafter
from tlt.models.drafter import EagleDrafter
from tlt.rollout.decode_step import FinishWatcher
from tlt.rollout.engine import Engine
from tlt.rollout.sequence import Sequence
from tlt.rollout.step_timing import STEP_SPLIT_ENV, StepSplit
from tlt.runtime import rl_step
from tlt.runtime.devices import completion_to_cpu
from tlt.spec.run import RunSpec
from tlt.tasks.problem import Problem
from tlt.workers.rollout_state import WorkerStates

# submit(index, request_id, text, problem) -> a handle of its score: `index` counts the responses submitted so far
Submit = Callable[[int, str, str, Problem], Any]


def release_kv_cache(engine: Engine) -> None:
    """Give back the engine's KV memory between rollouts (it regrows on the next prefill)."""
    engine.runner.cache.release()


class ShardGenerator:
    """Generation on `engine` for worker `index` (its sampling seed), drafting with `drafter` (or none) and the
    block arms with `block`."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        spec: RunSpec,
        index: int,
        drafter: EagleDrafter | None,
        rows: int,
        context: int,
        block: BlockDrafter | None = None,
    ) -> None:
        self.engine = engine
        self.plain_stepper = engine.stepper
        self.tokenizer = tokenizer
        self.spec = spec
        self.index = index
        self.drafter = drafter
        self.block = block
        self.rows = rows
        self.context = context
        self.bandit: BucketedBandit | None = None
        self._bandit_state: dict[str, Any] | None = None  # from a checkpoint, loaded into the next stepper
        self.history = new_history_store(spec.speculative) if uses_history(spec.speculative) else None
        self.waves: list[list[Sequence]] = []
        if self.history is not None:
            engine.wave_observers.append(lambda sequences: self.waves.append(list(sequences)))

    def bandit_state(self) -> dict[str, Any] | None:
        """The bandit's state; None before the first speculative rollout (or the checkpoint's, not yet used)."""
        return self.bandit.state_dict() if self.bandit is not None else self._bandit_state

    def load_bandit(self, state: dict[str, Any] | None) -> None:
        """Resume the bandit from a checkpoint: it is loaded into the next rollout's stepper (whose arms must
        match; `BucketedBandit.load_state_dict` says so otherwise)."""
        self.bandit, self._bandit_state = None, state

    def take_waves(self) -> list[list[Sequence]]:
        """The waves finished since the last call, to index into the history store."""
        waves, self.waves = self.waves, []
        return waves

    def index_waves(self, waves: list[list[Sequence]]) -> None:
        assert self.history is not None
        for sequences in waves:
            self.history.observe(sequences)

    def generate(
        self, step: int, problem_ids: list[int], problems: list[Problem], submit: Submit, states: WorkerStates
    ) -> dict[str, Any]:
        """Generate the shard, handing each finished response to `submit` the moment it finishes (a Ray worker:
        a verifier's task, round robin; one process: the score itself); `states.running` follows the running
        batch. Returns "completions" (on the CPU, hidden states kept), "rewards" (what `submit` returned, in
        completion order), "generate_started", and the rollout's result fields: the engine trace,
        timestamps, speculative counts, arms and rates, draft-vocabulary coverage."""
        by_request: dict[str, Problem] = {}
        requests = rl_step.make_requests(problems, problem_ids, self.tokenizer, self.spec.algorithm, step)
        for request, problem in zip(requests, (p for p in problems for _ in range(self.spec.algorithm.group_size))):
            by_request[request.request_id] = problem

        rewards: dict[str, Any] = {}
        first_done: list[float] = []

        def send(seq: Sequence) -> None:
            text = self.tokenizer.decode(seq.tokens, skip_special_tokens=True)
            request_id = seq.request.request_id
            rewards[request_id] = submit(len(rewards), request_id, text, by_request[request_id])
            first_done.append(time.time())

        trace = rl_step.RolloutTrace()

        def on_step(metrics: Any) -> None:
            states.running = metrics.running
            trace(metrics)

        stepper = rollout_stepper(
            self.spec.speculative,
            self.engine.runner,
            self.drafter,
            rows=self.rows,
            context=self.context,
            bandit=self.bandit,
            seed=self.spec.algorithm.seed + self.index,
            history=self.history,
            block=self.block,
        )
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
            states.running = 0
        adaptive = stepper if isinstance(stepper, AdaptiveStepper) else None
        summary = adaptive.summary() if adaptive is not None else {"arms_chosen": {}, "arm_rates": {}}
        if adaptive is not None:
            self.bandit = adaptive.bandit
        streamed = len(rewards)
        for completion in completions:
            if completion.request_id not in rewards:
                text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
                rewards[completion.request_id] = submit(
                    0, completion.request_id, text, by_request[completion.request_id]
                )
        finished = time.time()
        return {
            "completions": completions,
            "rewards": [rewards[c.request_id] for c in completions],
            "generate_started": generate_started,
            "streamed": streamed,
            "trace": trace.steps,
            "finished_at": finished,
            "generate_seconds": finished - generate_started,
            "first_response_at": first_done[0] if first_done else finished,
            "sd_row_steps": adaptive.stats.row_steps if adaptive else 0,
            "sd_accepted": adaptive.stats.accepted if adaptive else 0,
            "sd_by_position": (
                {str(e): list(c) for e, c in sorted(adaptive.stats.by_position.items())} if adaptive else {}
            ),
            "sd_arms": summary["arms_chosen"],
            "sd_arm_rates": summary["arm_rates"],
            "draft_vocab_coverage": self.engine.draft_vocab_coverage,
            **({"step_split": split.table()} if split is not None else {}),
        }
