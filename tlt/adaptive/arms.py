"""Speculative-decoding arms: drafters built from `speculative.arms`, filtered by `speculative.mode`.

An arm is one drafting strategy the bandit may pick: an n-gram chain, an EAGLE chain of some depth,
an EAGLE tree (top-k children per node, `depth` levels, a verify budget), or `plain` (no draft: a
plain decode step, so the bandit itself learns the batch sizes where speculation does not pay).
Which arms a mode may use is the speculative plan's (`tlt.spec.plan.usable_arms`); `chain`, `tree` and
`mixed` arms draft with the learned EAGLE drafter, `block` arms with the block drafter
(`tlt.models.block_drafter`: a chain of `depth` drafts from one forward).

`history` and `mixed` arms read the rollout-history store (`tlt.rollout.history`); with
`speculative.history.enabled: false` they are dropped. All of an engine's history arms share one store,
which the caller passes in to keep it across rollouts.

All EAGLE arms of one engine share ONE drafter KV cache (`EagleCache`): whichever arm runs, the
drafter catches up from the target's saved hidden states only on positions it has not seen, so
switching arms (or switching SD on) never re-runs the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tlt.models.block_drafter import BlockDrafter
from tlt.models.drafter import EagleDrafter
from tlt.rollout.block import BlockChainDrafter
from tlt.rollout.drafting import Drafter, EagleCache, EagleChainDrafter, NgramDrafter
from tlt.rollout.eagle_tree import EagleTreeDrafter
from tlt.rollout.history import HistoryDrafter, HistoryStore, HistoryTreeDrafter
from tlt.rollout.mixed import MixedDrafter
from tlt.spec.plan import EAGLE_ARM_KINDS, HISTORY_KINDS, usable_arms
from tlt.spec.run import ArmSpec, SpeculativeSpec

BLOCK_KINDS = ("block",)


@dataclass(frozen=True)
class Arm:
    """One bandit arm: its place in `speculative.arms`, a short label, its spec and its drafter
    (None for a plain arm)."""

    index: int
    label: str
    spec: ArmSpec
    drafter: Drafter | None


def arm_label(arm: ArmSpec) -> str:
    """A short stable name for metrics, e.g. 'chain-d4', 'tree-d4k2v8', 'ngram-d4', 'plain'."""
    if arm.kind == "plain":
        return "plain"
    if _is_tree(arm):
        return f"{arm.kind}-d{arm.depth}k{arm.topk}v{tree_budget(arm)}"
    return f"{arm.kind}-d{arm.depth}"


def _is_tree(arm: ArmSpec) -> bool:
    return arm.kind == "tree" or (arm.kind == "history" and arm.topk > 1)


def tree_budget(arm: ArmSpec) -> int:
    """Draft nodes a tree arm verifies: `verifyTokens`, or depth * topk when it is 0."""
    return arm.verify_tokens or arm.depth * arm.topk


def verify_width(arm: ArmSpec) -> int:
    """Tokens per row the target forwards in one step of this arm (the root plus its draft nodes)."""
    if arm.kind == "plain":
        return 1
    return 1 + (tree_budget(arm) if _is_tree(arm) else arm.depth)


def chain_depths(spec: SpeculativeSpec) -> list[int]:
    """Draft lengths of the EAGLE chains usable in `spec.mode` (chain and mixed arms), sorted, each once:
    the drafter's fused chain graphs a compiled engine warms up."""
    return sorted({spec.arms[i].depth for i in usable_arms(spec) if spec.arms[i].kind in ("chain", "mixed")})


def drafter_graphs(spec: SpeculativeSpec, *, sampled: bool) -> dict[str, list]:
    """The compiled drafter graphs the usable arms of `spec` can reach, as `tlt.rollout.warmup.warm_up`'s
    keywords: {"chain_depths": chain and mixed arms' depths, "guesses": "coupled" in a sampling run
    (`sampled`: temperature > 0), else "argmax" (a chain drafts coupled guesses only where its batch
    samples), "step_widths": the drafter step's width classes (1: width 1, 2: wider), which only trees
    run: their catch-up pass (padded to width >= 2) and, below the root, one pass per level of topk
    nodes}. Empty lists where no EAGLE arm is usable."""
    depths = chain_depths(spec)
    trees = [spec.arms[i] for i in usable_arms(spec) if spec.arms[i].kind == "tree"]
    widths = {2} if trees else set()
    widths |= {min(t.topk, 2) for t in trees if t.depth > 1}
    return {
        "chain_depths": depths,
        "guesses": (["coupled" if sampled else "argmax"] if depths else []),
        "step_widths": sorted(widths),
    }


def block_graphs(spec: SpeculativeSpec, *, sampled: bool) -> dict[str, list]:
    """The compiled block-draft graphs the usable block arms of `spec` reach, as `tlt.rollout.warmup.
    warm_up_blocks`'s keywords: {"depths": the block arms' depths, "guesses": "coupled" in a sampling run,
    else "argmax"}; empty lists without a usable block arm."""
    depths = sorted({spec.arms[i].depth for i in usable_arms(spec) if spec.arms[i].kind in BLOCK_KINDS})
    return {"depths": depths, "guesses": (["coupled" if sampled else "argmax"] if depths else [])}


def uses_history(spec: SpeculativeSpec) -> bool:
    """Whether some arm usable in `spec.mode` reads the rollout-history store."""
    return any(spec.arms[i].kind in HISTORY_KINDS for i in usable_arms(spec))


def new_history_store(spec: SpeculativeSpec) -> HistoryStore:
    """An empty rollout-history store sized by `speculative.history`."""
    h = spec.history
    return HistoryStore(max_nodes=h.max_nodes, min_match=h.min_match, max_match=h.max_match, max_draft=h.max_draft)


def build_arms(
    spec: SpeculativeSpec,
    *,
    embed: nn.Embedding,
    drafter: EagleDrafter | None,
    max_batch_size: int,
    max_context: int,
    compile: bool = False,
    history: HistoryStore | None = None,
    block: BlockDrafter | None = None,
) -> list[Arm]:
    """The arms of `spec.mode`, each with its drafter (a drafter factory over `spec.arms`).

    embed: the target's input embedding (the EAGLE drafter reads x[t+1] through it); drafter: the
    learned EAGLE drafter, bound to the target's embedding and head; required when an arm of kind
    chain or tree is in use. The engine must keep hidden states (`Engine(return_hidden=True)`).
    compile: the EAGLE arms' drafter steps are compiled (as the engine's, `Engine(compile=True)`).
    history: the rollout-history store of the history and mixed arms (a new one from
    `speculative.history` when None and such an arm is in use). block: the block drafter, bound like
    `drafter`; required when an arm of kind block is in use (compiled with `compile`, `tlt.rollout.block`).
    """
    indices = usable_arms(spec)
    needs_drafter = any(spec.arms[i].kind in EAGLE_ARM_KINDS for i in indices)
    if needs_drafter and drafter is None:
        raise ValueError(
            f"speculative.mode {spec.mode!r} with arms of kind chain/tree needs the learned drafter; none was given"
        )
    if block is None and any(spec.arms[i].kind in BLOCK_KINDS for i in indices):
        raise ValueError(
            f"speculative.mode {spec.mode!r} with arms of kind block needs the block drafter; none was given"
        )
    scratch = max((_scratch(spec.arms[i]) for i in indices), default=0)
    shared = EagleCache(drafter, embed, max_batch_size, max_context, compile, scratch) if needs_drafter else None
    if history is None and any(spec.arms[i].kind in HISTORY_KINDS for i in indices):
        history = new_history_store(spec)
    arms = []
    for i in indices:
        arm = spec.arms[i]
        if arm.kind in BLOCK_KINDS and block is not None:
            built: Drafter | None = BlockChainDrafter(block, arm.depth, compile=compile)
        else:
            built = _drafter(arm, spec, drafter, embed, shared, max_batch_size, max_context, history)
        arms.append(Arm(i, arm_label(arm), arm, built))
    return arms


def _scratch(arm: ArmSpec) -> int:
    """Drafter cache slots an arm writes past the committed ones in one step."""
    if arm.kind in ("chain", "mixed"):
        return arm.depth - 1
    if arm.kind == "tree":
        return arm.topk * (arm.depth - 1)
    return 0


def _drafter(
    arm: ArmSpec,
    spec: SpeculativeSpec,
    drafter: EagleDrafter | None,
    embed: nn.Embedding,
    shared: EagleCache | None,
    max_batch_size: int,
    max_context: int,
    history: HistoryStore | None,
) -> Drafter | None:
    if arm.kind == "plain":
        return None
    if arm.kind == "ngram":
        return NgramDrafter(arm.depth, spec.ngram_min, spec.ngram_max)
    if arm.kind == "history" and history is not None:
        if arm.topk > 1:
            return HistoryTreeDrafter(history, topk=arm.topk, depth=arm.depth, budget=tree_budget(arm))
        return HistoryDrafter(history, arm.depth)
    if drafter is None or shared is None:
        raise ValueError(f"arm kind {arm.kind!r} needs the learned drafter")
    if arm.kind == "mixed" and history is not None:
        eagle = EagleChainDrafter(
            drafter, embed, arm.depth, max_batch_size=max_batch_size, max_context=max_context, state=shared
        )
        return MixedDrafter(history, eagle, arm.depth)
    if arm.kind == "chain":
        return EagleChainDrafter(
            drafter, embed, arm.depth, max_batch_size=max_batch_size, max_context=max_context, state=shared
        )
    if arm.kind == "tree":
        return EagleTreeDrafter(
            drafter,
            embed,
            topk=arm.topk,
            depth=arm.depth,
            budget=tree_budget(arm),
            max_batch_size=max_batch_size,
            max_context=max_context,
            state=shared,
        )
    raise ValueError(
        f"arm kind must be one of 'chain', 'tree', 'ngram', 'history', 'mixed', 'block', 'plain', got {arm.kind!r}"
    )
