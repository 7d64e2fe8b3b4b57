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
from tlt.rollout.decode_step import FinishWatcher, PlainStepper
from tlt.rollout.engine import Engine
from tlt.rollout.sequence import Sequence
from tlt.rollout.step_timing import STEP_SPLIT_ENV, StepSplit
from tlt.rollout.types import Completion
from tlt.runtime import rl_step
from tlt.runtime.devices import completion_to_cpu
from tlt.runtime.partial_work import (
    GroupWork,
    MemberWork,
    chosen_groups,
    continue_requests,
    cut_completion,
    group_ends,
    settled_cut,
    shard_parts,
    whole_completion,
)
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
        self,
        step: int,
        problem_ids: list[int],
        problems: list[Problem],
        submit: Submit,
        states: WorkerStates,
        work: list[GroupWork] | None = None,
        quotas: list[int] | None = None,
        speculate: bool = True,
    ) -> dict[str, Any]:
        """Generate the shard, handing each finished response to `submit` the moment it finishes (a Ray worker:
        a verifier's task, round robin; one process: the score itself); `states.running` follows the running
        batch. Returns "completions" (on the CPU, hidden states kept), "rewards" (what `submit` returned, in
        completion order), "generate_started", and the rollout's result fields: the engine trace,
        timestamps, speculative counts, arms and rates, draft-vocabulary coverage.

        A partial rollout (`work`: the groups, `problems` theirs, split into `len(quotas)` shards that end at
        `quotas[w]` groups each; `tlt.runtime.partial_work`): the unfinished members continue from their kept
        tokens and each shard's rows end once its cut is settled; completions are whole (kept + new tokens, as
        of the cut), those unfinished "abort" with reward None, "chosen" the positions of the groups to train
        and "groups" how many there were. `speculate` False decodes plainly (the drafter is flagged,
        `tlt.adaptive.drafter_health`)."""
        by_request: dict[str, Problem] = {}
        kept: dict[str, tuple[int, MemberWork]] = {}
        if work is None:
            requests = rl_step.make_requests(problems, problem_ids, self.tokenizer, self.spec.algorithm, step)
            members = (p for p in problems for _ in range(self.spec.algorithm.group_size))
        else:
            requests, kept = continue_requests(work, problems, self.tokenizer, self.spec.algorithm)
            members = (p for g, p in zip(work, problems) for m in g.members if not m.finished)
        for request, problem in zip(requests, members):
            by_request[request.request_id] = problem

        rewards: dict[str, Any] = {}
        first_done: list[float] = []

        def text_of(request_id: str, tokens: list[int]) -> str:
            prefix = list(kept[request_id][1].tokens) if request_id in kept else []
            return self.tokenizer.decode(prefix + tokens, skip_special_tokens=True)

        def send(seq: Sequence) -> None:
            request_id = seq.request.request_id
            text = text_of(request_id, seq.tokens)
            rewards[request_id] = submit(len(rewards), request_id, text, by_request[request_id])
            first_done.append(time.time())

        trace = rl_step.RolloutTrace()
        quotas = list(quotas or [])
        parts = shard_parts(len(work), quotas) if work is not None else []
        cuts: list[int | None] = [None] * len(parts)

        def halt(lengths: dict[str, int], done: set[str]) -> set[str]:
            """The running members of every shard whose cut is settled."""
            assert work is not None
            ended: set[str] = set()
            for w, part in enumerate(parts):
                groups = [work[i] for i in part]
                cuts[w] = cuts[w] if cuts[w] is not None else settled_cut(groups, lengths, done, quotas[w])
                if cuts[w] is not None:
                    ended.update(m.request_id for g in groups for m in g.members if not m.finished)
            return ended - done

        def on_step(metrics: Any) -> None:
            states.running = metrics.running
            trace(metrics)

        stepper = (
            rollout_stepper(
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
            if speculate
            else PlainStepper(self.engine.runner)
        )
        if isinstance(stepper, AdaptiveStepper) and self._bandit_state is not None:
            stepper.bandit.load_state_dict(self._bandit_state)
            self._bandit_state = None
        self.engine.stepper = FinishWatcher(stepper, send)
        generate_started = time.time()
        split = StepSplit() if os.environ.get(STEP_SPLIT_ENV) == "1" else None  # `tlt bench run --split`
        try:
            with split if split is not None else contextlib.nullcontext():
                partial_halt = {} if work is None else {"halt": halt}
                completions = self.engine.generate(requests, on_step=on_step, **partial_halt)
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
            if completion.request_id not in rewards and completion.finish_reason != "abort":
                text = text_of(completion.request_id, completion.token_ids)
                rewards[completion.request_id] = submit(
                    0, completion.request_id, text, by_request[completion.request_id]
                )
        partial: dict[str, Any] = {}
        if work is not None:
            completions, chosen = _as_of_cuts(completions, work, parts, quotas)
            for c in completions:
                if c.finish_reason == "abort":  # unfinished as of its shard's cut: scored when it finishes
                    rewards.pop(c.request_id, None)
            completions = [whole_completion(c, *kept[c.request_id]) if c.request_id in kept else c for c in completions]
            partial = {"chosen": chosen, "groups": len(work)}
        finished = time.time()
        return {
            "completions": completions,
            "rewards": [rewards.get(c.request_id) for c in completions],
            **partial,
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
            "sd_by_bucket": ({str(b): list(c) for b, c in sorted(adaptive.by_bucket.items())} if adaptive else {}),
            "sd_arms": summary["arms_chosen"],
            "sd_arm_rates": summary["arm_rates"],
            "draft_vocab_coverage": self.engine.draft_vocab_coverage,
            **({"step_split": split.table()} if split is not None else {}),
        }


def _as_of_cuts(
    completions: list[Completion], work: list[GroupWork], parts: list[list[int]], quotas: list[int]
) -> tuple[list[Completion], list[int]]:
    """Every shard's completions (new tokens) as of its cut, and the positions of the groups it trains."""
    lengths = {c.request_id: len(c.token_ids) for c in completions}
    done = {c.request_id for c in completions if c.finish_reason in ("stop", "length")}
    by_id = {c.request_id: i for i, c in enumerate(completions)}
    out, chosen = list(completions), []
    for part, quota in zip(parts, quotas):
        groups = [work[i] for i in part]
        cut = settled_cut(groups, lengths, done, quota)
        if cut is None:
            raise RuntimeError(f"a partial rollout ended before {quota} of its {len(groups)} groups were settled")
        picked = {part[i] for i in chosen_groups(group_ends(groups, lengths, done), cut, quota)}
        chosen.extend(sorted(picked))
        for i in part:
            if i not in picked:
                for m in work[i].members:
                    if m.request_id in by_id:
                        row = by_id[m.request_id]
                        out[row] = cut_completion(out[row], cut)
    return out, sorted(chosen)
