"""A rollout engine on vLLM with the same duties as `tlt.rollout.engine.Engine` in a rollout worker:
generate token ids and the target's log-probs, take new policy (and drafter) weights every step in
place, and give back its KV cache memory while idle.

- Weights travel through `LLM.collective_rpc` into `extension.WeightSync` (vLLM's worker extension,
  as RL frameworks do): tensors, never a folder on disk, never an engine restart.
- Speculative decoding is vLLM's EAGLE with TLT's drafter exported in the EAGLE layout
  (`tlt.drafter.export`); the drafter's state dict names are the EAGLE names, so the hub's weights
  load as they are.
- Idle memory: vLLM's sleep mode (`sleep(level=1)` drops the KV cache, `wake_up()` brings it back)
  where the platform has it (CUDA, ROCm, XPU); vLLM's CPU build ignores sleep, so `releases_memory`
  is False there and `release` / `wake` do nothing (`sleep_supported` says which).
- Log-probs are vLLM's `raw_logprobs`: log_softmax of the unprocessed logits (temperature 1), which
  equals `Completion.logprobs` for greedy requests; the RL update recomputes its own anyway.

Only the driver side lives here; vLLM is imported when an engine is built.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from tlt.models.eagle_layout import check_eagle_keys
from tlt.rollout.types import Completion, Request
from tlt.rollout.vllm.availability import require_vllm
from tlt.rollout.vllm.spec_table import k_at

log = logging.getLogger(__name__)

EXTENSION = "tlt.rollout.vllm.extension.WeightSync"


@dataclass(frozen=True)
class VllmStep:
    """One vLLM engine step: requests running when it started, draft tokens scheduled per request (K), tokens
    the requests gained (accepted drafts + one each), wall seconds."""

    running: int
    k: int
    new_tokens: int
    seconds: float


def drafting_counts(steps: list[VllmStep]) -> tuple[int, int, Counter]:
    """(drafting row-steps, accepted draft tokens, row-steps per `eagle-<K>`) over one generate's engine steps
    (the first prefills the prompts), from the tokens the rows gained: a response cut at its token limit
    counts what it kept."""
    drafting = [s for s in steps[1:] if s.k > 0]
    arms = Counter({f"eagle-{k}": sum(s.running for s in drafting if s.k == k) for k in {s.k for s in drafting}})
    return sum(s.running for s in drafting), sum(max(s.new_tokens - s.running, 0) for s in drafting), arms


@dataclass(frozen=True)
class EagleSetup:
    """vLLM's EAGLE speculative decoding: an exported drafter folder, the most draft tokens per step, and
    vLLM's dynamic table (`tlt.rollout.vllm.spec_table`: (first, last, K) rows over running-batch sizes; None
    drafts `draft_tokens` at every batch size)."""

    path: str
    draft_tokens: int
    table: tuple[tuple[int, int, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.draft_tokens < 1:
            raise ValueError(f"draft_tokens must be >= 1, got {self.draft_tokens}")
        if not (Path(self.path) / "config.json").is_file():
            raise ValueError(
                f"EAGLE drafter folder {self.path!r} has no config.json (write it with `tlt export-drafter`)"
            )


def sleep_supported() -> bool:
    """Whether this vLLM platform implements sleep mode (False on vLLM's CPU build)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


class VllmEngine:
    """One vLLM `LLM` over a saved policy folder (`tlt.models.loading.save_policy` layout)."""

    started: ClassVar[int] = 0  # engines started in this process (vLLM's metrics follow the newest only)

    def __init__(
        self,
        policy_path: str | Path,
        dtype: str = "float32",
        max_context: int = 512,
        max_batch_size: int = 64,
        eagle: EagleSetup | None = None,
        seed: int = 0,
        memory_fraction: float = 0.9,
        kv_cache_bytes: int | None = None,
        enforce_eager: bool = True,
    ) -> None:
        """memory_fraction: vLLM's `gpu_memory_utilization`, which on vLLM's CPU build is the share of
        the machine's RAM it reserves (checked against free RAM at start); kv_cache_bytes: a fixed KV
        cache size instead of all that is left of the reserve (set it on CPU, or vLLM takes ~90% of RAM).
        enforce_eager: False runs vLLM's default compiled mode (on its CPU build: dynamo traced once,
        inductor; the compile happens at start, tens of seconds)."""
        require_vllm()
        if not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        if kv_cache_bytes is not None and kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be >= 1 or None (vLLM sizes it), got {kv_cache_bytes}")
        from vllm import LLM

        self.releases_memory = sleep_supported()
        self.eagle = eagle
        extra = {}
        if eagle is not None:
            extra["speculative_config"] = {
                "method": "eagle",
                "model": eagle.path,
                "num_speculative_tokens": eagle.draft_tokens,
            }
            if eagle.table is not None:
                extra["speculative_config"]["num_speculative_tokens_per_batch_size"] = [list(r) for r in eagle.table]
        self.llm = LLM(
            model=str(policy_path),
            dtype=dtype,
            max_model_len=max_context,
            max_num_seqs=max_batch_size,
            enforce_eager=enforce_eager,
            seed=seed,
            worker_extension_cls=EXTENSION,
            logprobs_mode="raw_logprobs",
            enable_sleep_mode=self.releases_memory,
            gpu_memory_utilization=memory_fraction,
            kv_cache_memory_bytes=kv_cache_bytes,
            disable_log_stats=False,
            **extra,
        )
        VllmEngine.started += 1
        self.start_index = VllmEngine.started
        self.asleep = False
        self.max_batch_size = max_batch_size
        self.table = list(eagle.table) if eagle is not None and eagle.table is not None else None
        self.steps: list[VllmStep] = []  # the last generate's engine steps
        self._submitted = 0

    @property
    def table_rewritable(self) -> bool:
        """Whether `set_table` can change the draft table between generate calls: vLLM started with a table and
        its engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), where the scheduler's lookup
        is reachable; in multi-process mode the table stays the one vLLM started with."""
        return self.table is not None and self._scheduler() is not None

    def set_table(self, table: list[tuple[int, int, int]]) -> None:
        """Draft with `table` from the next scheduler step on (no restart: the scheduler's dense batch -> K lookup
        is rebuilt with vLLM's own `build_dynamic_sd_schedule_lookup`, a list of max_batch_size + 1 ints)."""
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        scheduler = self._scheduler()
        if self.table is None or scheduler is None:
            raise RuntimeError(
                "set_table: vLLM's draft table can change only where it started with one and its engine core runs "
                "in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0); the run keeps the table it started with"
            )
        assert self.eagle is not None
        scheduler.dynamic_sd_lookup = build_dynamic_sd_schedule_lookup(
            [list(r) for r in table],
            vllm_max_batch_size=self.max_batch_size,
            vllm_num_speculative_tokens=self.eagle.draft_tokens,
        )
        self.table = list(table)

    def _scheduler(self) -> Any | None:
        core = getattr(self.llm.llm_engine.engine_core, "engine_core", None)  # InprocClient's EngineCore
        return getattr(core, "scheduler", None)

    def k_at(self, batch: int) -> int:
        """Draft tokens vLLM schedules for a step of `batch` running requests."""
        if self.eagle is None:
            return 0
        return self.eagle.draft_tokens if self.table is None else min(self.eagle.draft_tokens, k_at(self.table, batch))

    def generate(
        self, requests: list[Request], on_finish: Callable[[Completion], None] | None = None
    ) -> list[Completion]:
        """Complete every request; completions in request order, `hidden` None (vLLM keeps its states).

        vLLM's engine is stepped here (its requests' outputs as deltas), so each response goes to `on_finish` the
        step it finishes, and `steps` records every engine step: running requests, K drafted, tokens gained,
        seconds."""
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import RequestOutputKind

        self.wake()
        params = [
            VllmSampling(
                temperature=r.params.temperature,
                top_p=r.params.top_p,
                max_tokens=r.params.max_new_tokens,
                stop_token_ids=list(r.params.stop_token_ids),
                seed=r.params.seed,
                logprobs=0,
                ignore_eos=not r.params.stop_token_ids,
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
            )  # token ids only: a Completion carries no text
            for r in requests
        ]
        engine = self.llm.llm_engine
        ids: dict[str, int] = {}
        for i, (request, param) in enumerate(zip(requests, params)):
            self._submitted += 1
            ids[f"tlt-{self._submitted}"] = i
            engine.add_request(f"tlt-{self._submitted}", {"prompt_token_ids": list(request.prompt_ids)}, param)
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        done: list[Completion | None] = [None] * len(requests)
        self.steps = []
        while engine.has_unfinished_requests():
            running = engine.get_num_unfinished_requests()
            started = time.perf_counter()
            outputs = engine.step()
            seconds = time.perf_counter() - started
            gained = 0
            for output in outputs:
                i = ids[output.request_id]
                out = output.outputs[0]
                new = list(out.token_ids)
                gained += len(new)
                tokens[i] += new
                logprobs[i] += [step[token].logprob for step, token in zip(out.logprobs or [], new)]
                if output.finished:
                    reason = "stop" if out.finish_reason == "stop" else "length"
                    done[i] = _completion(requests[i], tokens[i], logprobs[i], reason)
                    if on_finish is not None:
                        on_finish(done[i])
            self.steps.append(VllmStep(running, self.k_at(running), gained, seconds))
        assert all(c is not None for c in done)
        return done  # type: ignore[return-value]

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """New policy weights (HF names, as `state_dict()` of the policy) in place."""
        self.wake()
        self.llm.collective_rpc("tlt_update_policy", args=(_named(weights),))
        self.llm.reset_prefix_cache()

    def load_drafter(self, state: dict[str, torch.Tensor]) -> None:
        """New EAGLE drafter weights (the drafter's state dict: EAGLE names) in place."""
        if self.eagle is None:
            raise RuntimeError("load_drafter: this engine was built without an EAGLE drafter (eagle=None)")
        check_eagle_keys(list(state), "load_drafter")  # vLLM would skip a misnamed tensor silently
        self.wake()
        self.llm.collective_rpc("tlt_update_drafter", args=(_named(state),))

    def speculative_counts(self) -> tuple[int, int]:
        """(draft tokens proposed, draft tokens accepted) by vLLM's EAGLE since start; (0, 0) without SD.
        Acceptance rate over a span = accepted / proposed, from differences of these counters."""
        values = self._metrics()
        return (
            int(values.get("vllm:spec_decode_num_draft_tokens") or 0),
            int(values.get("vllm:spec_decode_num_accepted_tokens") or 0),
        )

    def speculative_drafts(self) -> int:
        """Drafts since start (one per request and step that drafted); 0 without SD. Accept length over a
        span (tokens a row gains per target forward) = 1 + accepted / drafts, from differences."""
        return int(self._metrics().get("vllm:spec_decode_num_drafts") or 0)

    def _metrics(self) -> dict[str, object]:
        """vLLM's metrics: process-wide, and each new `LLM` unregisters the older ones' collectors, so
        they are this engine's only while it is the newest in the process (refused otherwise)."""
        if self.start_index != VllmEngine.started:
            raise RuntimeError(
                "vLLM's metrics follow the newest engine of a process and another VllmEngine started "
                "after this one: read speculative counts from the newest engine only"
            )
        return {m.name: getattr(m, "value", None) for m in self.llm.get_metrics()}

    def release(self, level: int = 1) -> None:
        """Give back memory while idle: vLLM sleep level 1 (the KV cache dropped, the weights offloaded to host
        memory and restored on wake); nothing where sleep is unsupported. Level 2 (weights discarded, only the
        target reloaded on wake) is refused while a drafter is served: vLLM would wake with the drafter's weights
        lost and draft on, exact and slow (the drafter health check would flag it a step later)."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if level == 2 and self.eagle is not None:
            raise ValueError(
                "sleep level 2 discards the weights and wakes with the target's only: refused while an EAGLE drafter "
                "is served (use level 1)"
            )
        if self.releases_memory and not self.asleep:
            self.llm.sleep(level=level)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _named(weights: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    return [(name, tensor.detach().contiguous()) for name, tensor in weights.items()]


def _completion(request: Request, tokens: list[int], logprobs: list[float], reason: str) -> Completion:
    """A `Completion` from one request's tokens and each sampled token's log-prob."""
    return Completion(
        request.request_id, list(request.prompt_ids), tokens, torch.tensor(logprobs, dtype=torch.float32), None, reason
    )
