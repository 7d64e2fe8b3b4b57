"""Settings that validate but silently do nothing: `tlt validate` prints them as warnings, not errors.

`spec_warnings(spec)` is pure: one line per finding, field path first, saying what has no effect.
"""

from __future__ import annotations

import re
from fractions import Fraction

from tlt.spec.plan import learns_drafters, speculates
from tlt.spec.run import ArmSpec, RunSpec

_SUFFIX = {
    "": 1,
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")


def quantity_bytes(quantity: str) -> Fraction:
    """The bytes a memory quantity means, exactly, at any size ("1.5Gi" -> 1610612736; "100m" -> 1/10)."""
    match = _QUANTITY.match(quantity)
    if match is None:
        raise ValueError(f"{quantity!r} is not a quantity")
    return Fraction(match.group(1)) * _SUFFIX[match.group(2) or ""]


def tree_candidates(arm: ArmSpec) -> int:
    """Draft nodes a tree arm can offer its budget: topk children of the root, then topk children of
    each of the best topk nodes of every further level (`rollout.eagle_tree.EagleTreeDrafter`)."""
    return arm.topk + (arm.depth - 1) * arm.topk * arm.topk


def one_rank_sharding(spec: RunSpec) -> str:
    return (
        f"spec.policy.sharding: {spec.policy.sharding} with one policy rank (replicas x max(1, resources.gpus) "
        "= 1) shares nothing: the update runs unsharded on that rank"
    )


def spec_warnings(spec: RunSpec) -> list[str]:
    out: list[str] = []
    sd = spec.speculative
    if speculates(sd) and sd.buckets and sd.threshold > sd.buckets[-1]:
        out.append(
            f"spec.speculative.threshold: {sd.threshold} is past the last bucket ({sd.buckets[-1]}); running "
            f"batches above {sd.buckets[-1]} have no bucket and decode plainly, so the rest does nothing"
        )
    for i, arm in enumerate(sd.arms):
        if arm.kind == "tree" and arm.verify_tokens > tree_candidates(arm):
            out.append(
                f"spec.speculative.arms[{i}].verifyTokens: {arm.verify_tokens} is past the "
                f"{tree_candidates(arm)} nodes a depth-{arm.depth}, topk-{arm.topk} tree has; the rest of the "
                "budget does nothing"
            )
        if arm.kind == "block" and learns_drafters(sd) and spec.drafter.placement == "sidecar":
            out.append(
                f"spec.speculative.arms[{i}]: kind block trains its drafter in the rollout container, not in a "
                "sidecar: with drafter.placement 'sidecar' the rollout workers refuse this arm"
            )
    seen: dict[tuple[str, int, int, int], int] = {}
    for i, arm in enumerate(sd.arms):
        key = (arm.kind, arm.depth, arm.topk, arm.verify_tokens)
        if key in seen:
            out.append(
                f"spec.speculative.arms[{i}]: the same arm as arms[{seen[key]}]; the bandit splits its "
                "rounds between the two copies, so the duplicate only slows its learning"
            )
        seen.setdefault(key, i)
    if sd.draft_vocab and (not learns_drafters(sd) or spec.rollout.engine == "vllm"):
        why = (
            "rollout.engine vllm drafts from the whole vocabulary"
            if spec.rollout.engine == "vllm"
            else f"speculative.mode {sd.mode} has no learned drafter"
        )
        out.append(f"spec.speculative.draftVocab: {sd.draft_vocab} does nothing here: {why}")
    if spec.algorithm.max_new_tokens >= spec.model.max_context:
        out.append(
            f"spec.algorithm.maxNewTokens: {spec.algorithm.max_new_tokens} is not below model.maxContext "
            f"({spec.model.max_context}); responses end at the context limit first, so the cap does nothing"
        )
    if spec.policy.sharding in ("ddp", "fsdp") and spec.policy.world == 1:
        out.append(one_rank_sharding(spec))
    out.extend(dataset_warnings(spec))
    for role in ("policy", "rollout", "verifier"):
        memory = getattr(spec, role).resources.memory
        if quantity_bytes(memory) % 1:
            out.append(
                f"spec.{role}.resources.memory: {memory!r} is a fraction of a byte; Kubernetes rounds it up "
                "(write a whole number of bytes, e.g. 4Gi)"
            )
    return out


def dataset_warnings(spec: RunSpec) -> list[str]:
    """Dataset settings that validate but do nothing: file-only fields on the built-in task, the
    prompt key beside a template, a held-out fraction beside an eval file."""
    data, out = spec.dataset, []
    defaults = type(data)()
    if data.source == "builtin":
        for field, alias in (("path", "path"), ("eval_path", "evalPath"), ("prompt", "prompt"), ("chat", "chat")):
            if getattr(data, field) != getattr(defaults, field):
                out.append(
                    f"spec.dataset.{alias}: the built-in task (dataset.source builtin) has its own prompts "
                    "and splits, so it does nothing"
                )
        return out
    if data.prompt is not None and data.prompt_key != defaults.prompt_key:
        out.append(f"spec.dataset.promptKey: {data.prompt_key!r} is not read when dataset.prompt (a template) is set")
    if data.eval_path is not None and data.eval_fraction != defaults.eval_fraction:
        out.append(
            f"spec.dataset.evalFraction: {data.eval_fraction} does nothing beside dataset.evalPath, "
            "which is the whole held-out set"
        )
    return out
