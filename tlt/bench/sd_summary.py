"""Summaries of the sd bench's rows: one ratio per running batch, at the bench's sampling temperature.

Rows are `SdRow.as_dict()`s: variant, batch, temperature, accept_length, tokens_per_s (median)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _at(rows: list[dict[str, Any]], temperature: float) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["variant"], r["batch"]): r for r in rows if r["temperature"] == temperature}


def history_summary(
    rows: list[dict[str, Any]],
    variants: list[str],
    batches: tuple[int, ...],
    temperature: float,
    ngram_k: int,
    history_k: int,
) -> dict[str, dict[str, float]]:
    """Per batch: history's accept length over n-gram's, and the mixed variant's tokens/s over the best
    single drafter's (EAGLE chains, tree, history)."""
    at = _at(rows, temperature)
    singles = [v for v in variants if v.startswith(("chain-", "tree-", "history-"))]
    out: dict[str, dict[str, float]] = {"history_vs_ngram_accept": {}, "mixed_vs_best_single": {}}
    for b in batches:
        ngram = at[f"ngram-{ngram_k}", b]["accept_length"]
        out["history_vs_ngram_accept"][str(b)] = at[f"history-{history_k}", b]["accept_length"] / ngram
        best = max(at[v, b]["tokens_per_s"] for v in singles)
        out["mixed_vs_best_single"][str(b)] = at[f"mixed-{history_k}", b]["tokens_per_s"] / best
    return out


def _best_over_best(
    rows: list[dict[str, Any]],
    batches: tuple[int, ...],
    temperature: float,
    top: Callable[[str], bool],
    bottom: Callable[[str], bool],
) -> dict[str, float]:
    """{batch: best tokens/s of the variants `top` picks over the best of those `bottom` picks}; batches
    without both are left out."""
    at = _at(rows, temperature)
    out = {}
    for b in batches:
        over = [r["tokens_per_s"] for (v, batch), r in at.items() if batch == b and top(v)]
        under = [r["tokens_per_s"] for (v, batch), r in at.items() if batch == b and bottom(v)]
        if over and under:
            out[str(b)] = max(over) / max(under)
    return out


def block_vs_best_chain(rows: list[dict[str, Any]], batches: tuple[int, ...], temperature: float) -> dict[str, float]:
    """{batch: tokens/s of the best block variant (`block-<k>[-wide]`) over the best EAGLE chain variant's
    (`chain-<k>[-guess]`)}."""
    return _best_over_best(
        rows, batches, temperature, lambda v: v.startswith("block-"), lambda v: v.startswith("chain-")
    )


def wide_vs_final_norm_block(
    rows: list[dict[str, Any]], batches: tuple[int, ...], temperature: float
) -> dict[str, float]:
    """{batch: tokens/s of the best block variant reading chosen target layers too (`block-<k>-wide`) over
    the best reading the final-norm state alone (`block-<k>`)}."""

    def wide(v: str) -> bool:
        return v.startswith("block-") and v.endswith("-wide")

    return _best_over_best(rows, batches, temperature, wide, lambda v: v.startswith("block-") and not wide(v))


def feature_keeping(
    rows: list[dict[str, Any]], batches: tuple[int, ...], temperature: float
) -> dict[str, dict[str, float]]:
    """{batch: {"hidden": tokens/s of plain decoding returning the final-norm features (`plain-hidden`), "wide":
    keeping the block drafter's target layers too (`plain-wide`), each over plain decoding's}}: what a run's
    rollout pays on every plain step for the drafters' features. Kinds the rows lack are left out."""
    at = _at(rows, temperature)
    out: dict[str, dict[str, float]] = {}
    for b in batches:
        if ("plain", b) not in at:
            continue
        base = at["plain", b]["tokens_per_s"]
        kinds = {
            kind: at[f"plain-{kind}", b]["tokens_per_s"] / base
            for kind in ("hidden", "wide")
            if (f"plain-{kind}", b) in at
        }
        if kinds:
            out[str(b)] = kinds
    return out


def drafting_fraction(
    rows: list[dict[str, Any]], batches: tuple[int, ...], temperature: float
) -> dict[str, dict[str, float]]:
    """{variant: {batch: its drafter graph's ms per decode step (`split["draft_graph"]`: an EAGLE chain's fused
    catch-up + chain, a block drafter's one forward) over plain decoding's target step (target forward + LM
    head, ms per step)}}, timed inside the bench's own decode loops: the drafter cost as the engine pays it.
    Variants without a drafter graph (plain, n-gram, history) are left out."""
    at = _at(rows, temperature)
    out: dict[str, dict[str, float]] = {}
    for (variant, b), row in sorted(at.items()):
        plain = at.get(("plain", b))
        if b not in batches or plain is None or "draft_graph" not in row.get("split", {}):
            continue
        step = plain["split"]["target_forward"] + plain["split"]["lm_head"]
        out.setdefault(variant, {})[str(b)] = row["split"]["draft_graph"] / step
    return out
