"""The rollout worker of `rollout.engine: vllm`: the same actor methods as `RolloutWorker` (rollout,
status, take_states, the trainer's start / stop and state), with vLLM generating.

- vLLM (`tlt.rollout.vllm.vllm_engine.VllmEngine`) loads the policy folder once; every step the policy's
  new weights, and in modes static / tlt the hub's drafter, go into it in place (no restart, no disk).
- Speculative decoding is vLLM's EAGLE with the run's drafter, drafting by running-batch size from vLLM's
  dynamic table: TLT's threshold and buckets, each bucket's depth chosen by a bandit between rollouts and
  written into vLLM's scheduler in place (`tlt.workers.vllm_speculation`); threshold 0 starts vLLM without
  EAGLE (the drafter trains, never drafts). A drafter that collapses after a sync is flagged and vLLM drafts
  nothing until a newer one arrives (`tlt.workers.drafter_watch`).
- vLLM keeps its hidden states, so the drafter's training data comes from a forward of this worker's
  own copy of the policy over each finished rollout (prompt + response, the same final-norm features
  the TLT engine returns), in the settle thread after the rollout's results returned.
- Responses go to the verifiers the engine step they finish (vLLM's engine is stepped here); the rollout's
  trace is empty: no per-step records (tail seconds, seconds by running batch) in this engine's format.
- vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) on the actor's threads.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from tlt.drafter.export import export_eagle
from tlt.models.drafter import save_drafter, target_features
from tlt.models.loading import load_policy
from tlt.rollout.types import Completion
from tlt.rollout.vllm.spec_map import eagle_draft_tokens, kv_cache_bytes, vllm_drafts
from tlt.rollout.vllm.vllm_engine import drafting_counts
from tlt.runtime import rl_step
from tlt.spec.run import RunSpec
from tlt.tasks.problem import Problem
from tlt.workers.rollout import RolloutWorker
from tlt.workers.rollout_drafter import NO_AGREEMENT
from tlt.workers.rollout_state import GENERATING, IDLE
from tlt.workers.vllm_speculation import VllmSpeculation

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}


class VllmRolloutWorker(RolloutWorker):
    """vLLM generating, this project's drafter buffer and spot trainer beside it."""

    def __init__(
        self,
        index: int,
        spec: RunSpec,
        policy_path: str,
        rows: int,
        verifiers: list[Any],
        hub: Any | None,
        threads: int = 1,
        sidecar: Any | None = None,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine on this actor's threads
        torch.set_num_threads(threads)  # before vLLM starts: its CPU worker forbids changing it afterwards
        from tlt.rollout.vllm.vllm_engine import EagleSetup, VllmEngine

        model, self.tokenizer = load_policy(policy_path, spec.model.dtype)
        self._setup(index, spec, model, rows, verifiers)
        started = time.time()
        self._scratch = tempfile.TemporaryDirectory(prefix=f"tlt-vllm-{self.name}-")
        eagle = None
        self.draft_tokens = 0
        self.speculation: VllmSpeculation | None = None
        drafter = self.drafting.drafter
        if drafter is not None and vllm_drafts(spec.speculative):
            # vLLM reads its drafter's shape from a folder at start; the weights come from the hub every step
            self.draft_tokens = eagle_draft_tokens(spec.speculative)
            self.speculation = VllmSpeculation(
                spec.speculative, spec.drafter.health, self.rows, seed=spec.algorithm.seed + index
            )
            scratch = Path(self._scratch.name)
            save_drafter(drafter, scratch / "drafter")
            export_eagle(scratch / "drafter", model.config, scratch / "eagle")
            table = tuple(self.speculation.start_table())
            eagle = EagleSetup(str(scratch / "eagle"), self.draft_tokens, table=table)
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        layers = config.num_hidden_layers + (1 if eagle is not None else 0)
        kv = kv_cache_bytes(
            self.rows,
            self.context,
            layers=layers,
            kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            dtype_bytes=DTYPE_BYTES[spec.model.dtype],
        )
        self.vllm = VllmEngine(
            policy_path,
            dtype=spec.model.dtype,
            max_context=self.context,
            max_batch_size=self.rows,
            eagle=eagle,
            seed=spec.algorithm.seed + index,
            memory_fraction=0.1,
            kv_cache_bytes=2 * kv,
        )
        self.warmup_seconds = time.time() - started
        self._ready(hub, sidecar)

    def rollout(
        self,
        step: int,
        problem_ids: list[int],
        problems: list[Problem],
        weights: dict[str, torch.Tensor],
        drafter: tuple[int, dict[str, torch.Tensor]] | None,
        candidate: tuple[int, dict[str, torch.Tensor]] | None = None,
    ) -> dict[str, Any]:
        """`RolloutWorker.rollout` on vLLM: the shard's completions (no hidden states), reward refs in
        completion order, an empty trace, and vLLM's draft counters for the accept length."""
        self.drafting.check_ready(step)
        self.agreement()  # the previous rollout's features are computed before the policy copy changes
        self.states.set(GENERATING)
        started = time.time()
        self.model.load_state_dict(weights)
        self.vllm.load_weights(weights)
        self.drafting.load(drafter)
        if drafter is not None and self.vllm.eagle is not None:
            self.vllm.load_drafter(drafter[1])
        if self.speculation is not None:
            table = self.speculation.table(drafter)
            if table != self.vllm.table:
                self.vllm.set_table(table)
        requests = rl_step.make_requests(problems, problem_ids, self.tokenizer, self.spec.algorithm, step)
        group = self.spec.algorithm.group_size
        index = {r.request_id: i for i, r in enumerate(requests)}
        scored: dict[str, Any] = {}
        first_done: list[float] = []

        def score(completion: Completion) -> None:
            """A finished response to a verifier the moment vLLM returns it (round robin)."""
            i = index[completion.request_id]
            problem = problems[i // group]
            verifier = self.verifiers[len(scored) % len(self.verifiers)]
            text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            record = dict(problem.record)
            scored[completion.request_id] = verifier.score.remote(
                text, problem.answer, problem.prompt, record, completion.request_id
            )
            first_done.append(time.time())

        drafts_before, (_, accepted_before) = self.vllm.speculative_drafts(), self.vllm.speculative_counts()
        self.states.running = len(requests)
        generate_started = time.time()
        try:
            completions = self.vllm.generate(requests, on_finish=score)
        finally:
            self.states.running = 0
        finished = time.time()
        # one draft per request and step that drafted: the row-steps of TLT's accept length
        row_steps = self.vllm.speculative_drafts() - drafts_before
        accepted = self.vllm.speculative_counts()[1] - accepted_before
        speculative = (
            self.speculation.settle(step, self.vllm.steps, row_steps, accepted) if self.speculation is not None else {}
        )
        rewards = [scored[c.request_id] for c in completions]
        self.vllm.release()
        self._leave_settle(completions, step, drafter, candidate)
        self.states.set(IDLE)
        return {
            "worker": self.name,
            "completions": completions,
            "rewards": rewards,
            "streamed": len(scored),
            "trace": [],
            "started_at": started,
            "finished_at": finished,
            "generate_seconds": finished - generate_started,
            "first_response_at": first_done[0] if first_done else finished,
            "sd_row_steps": row_steps,
            "sd_accepted": accepted,
            "sd_arms": dict(sorted(drafting_counts(self.vllm.steps)[2].items())),
            "sd_arm_rates": {},
            "sd_table": [list(r) for r in self.vllm.table] if self.vllm.table is not None else None,
            **speculative,
        }

    def bandit_state(self) -> dict[str, Any] | None:
        """The per-bucket depth bandit's state, for whole-run checkpoints; None without SD."""
        return self.speculation.bandit.state_dict() if self.speculation is not None else self._kept_bandit

    def load_bandit(self, state: dict[str, Any] | None) -> None:
        if self.speculation is not None and state is not None:
            self.speculation.bandit.load_state_dict(state)
        else:
            self._kept_bandit = state

    def _agreement_and_buffer(
        self,
        completions: list[Any],
        step: int,
        drafter: tuple[int, dict[str, torch.Tensor]] | None,
        candidate: tuple[int, dict[str, torch.Tensor]] | None,
    ) -> dict[str, Any]:
        if self.drafting.drafter is None:
            return dict(NO_AGREEMENT)
        started = time.perf_counter()  # the second policy forward vLLM's EAGLE path cannot spare (docs/vllm.md)
        featured = [with_features(self.model, c) for c in completions]
        seconds = time.perf_counter() - started
        return {**super()._agreement_and_buffer(featured, step, drafter, candidate), "feature_seconds": seconds}


def with_features(policy: Any, completion: Completion) -> Completion:
    """`completion` with `hidden` [P + T - 1, H]: the policy's final-norm outputs over prompt + response
    (row t produced token t + 1), what the TLT engine returns with return_hidden=True."""
    fed = (list(completion.prompt_ids) + list(completion.token_ids))[:-1]
    if not fed:
        return completion
    hidden = target_features(policy, torch.tensor([fed], dtype=torch.long))[0]
    return replace(completion, hidden=hidden)
