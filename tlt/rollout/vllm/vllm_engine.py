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
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from tlt.models.eagle_layout import check_eagle_keys
from tlt.rollout.types import Completion, Request
from tlt.rollout.vllm.availability import require_vllm

log = logging.getLogger(__name__)

EXTENSION = "tlt.rollout.vllm.extension.WeightSync"


@dataclass(frozen=True)
class EagleSetup:
    """vLLM's EAGLE speculative decoding: an exported drafter folder and draft tokens per step."""

    path: str
    draft_tokens: int

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

    def generate(self, requests: list[Request]) -> list[Completion]:
        """Complete every request; completions in request order, `hidden` None (vLLM keeps its states)."""
        from vllm import SamplingParams as VllmSampling

        self.wake()
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
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
            )  # token ids only: a Completion carries no text
            for r in requests
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [_completion(request, output.outputs[0]) for request, output in zip(requests, outputs)]

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

    def release(self) -> None:
        """Give back the KV cache memory while idle (vLLM sleep level 1); nothing where sleep is unsupported."""
        if self.releases_memory and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _named(weights: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    return [(name, tensor.detach().contiguous()) for name, tensor in weights.items()]


def _completion(request: Request, out) -> Completion:
    """A `Completion` from one vLLM `CompletionOutput` (sampled token's log-prob taken from each step's dict)."""
    tokens = list(out.token_ids)
    logprobs = torch.tensor([step[token].logprob for step, token in zip(out.logprobs, tokens)], dtype=torch.float32)
    reason = "stop" if out.finish_reason == "stop" else "length"
    return Completion(request.request_id, list(request.prompt_ids), tokens, logprobs, None, reason)
