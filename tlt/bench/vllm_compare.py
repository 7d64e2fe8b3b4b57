"""The vLLM engine bench's records and comparison, pure: rows of timed rounds, paired ratios against the
faster vLLM-plain variant, the goal, and where greedy outputs first differ from the reference's."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tlt.rollout.types import Request

VLLM_PLAIN = ("vllm-plain-eager", "vllm-plain-compiled")
VARIANTS = (*VLLM_PLAIN, "vllm-eagle", "vllm-dynamic", "tlt-plain", "tlt-adaptive")  # table order
FIXED_PREFIX = "vllm-fixed-k"  # vllm-fixed-k<K>: one per EAGLE depth, after vllm-eagle in the table
REFERENCE = "tlt-plain"  # the greedy output every variant must equal
GOAL = "tlt-adaptive tokens/s >= 1.0x the vLLM-plain reference at every batch, >= 1.5x at batch <= 4"
DYNAMIC_GOAL = (
    "vllm-dynamic tokens/s >= the better of vLLM's best fixed K and the vLLM-plain reference at every batch, "
    "within the rounds' range (the paired ratio's maximum >= 1)"
)


def variant_order(names: list[str]) -> list[str]:
    """`names` in table order: VARIANTS' order, the vllm-fixed-k<K> variants (by K) after vllm-eagle."""

    def key(name: str) -> tuple[int, int]:
        if name.startswith(FIXED_PREFIX):
            return VARIANTS.index("vllm-eagle"), int(name.removeprefix(FIXED_PREFIX))
        return VARIANTS.index(name), -1

    return sorted(names, key=key)


def requests_per_batch(batch: int, min_prompts: int) -> int:
    """Requests a round runs at running batch `batch`: max(batch, min_prompts) rounded up to a multiple of it."""
    return -(-max(batch, min_prompts) // batch) * batch


def paired_ratio(over: list[float], base: list[float]) -> tuple[float, float, float]:
    """(median, min, max) over rounds of over[r] / base[r]; over, base: [R] tokens/s of two variants in
    the same rounds (pairing cancels what a round shares: machine load, prompts)."""
    if len(over) != len(base) or not over:
        raise ValueError(f"paired_ratio needs two equally long non-empty lists, got {len(over)} and {len(base)}")
    ratios = [o / b for o, b in zip(over, base)]
    return statistics.median(ratios), min(ratios), max(ratios)


def faster(rates: dict[str, list[float]]) -> str:
    """The variant with the highest median tokens/s; rates: variant -> [R] tokens/s."""
    return max(rates, key=lambda name: statistics.median(rates[name]))


def goal_met(ratio: float, batch: int) -> bool:
    """The issue's goal at one running batch: `ratio` (tlt-adaptive / vLLM-plain tokens/s) >= 1.5 at
    batch <= 4, >= 1.0 above."""
    return ratio >= (1.5 if batch <= 4 else 1.0)


def first_mismatches(reference: list[list[int]], outputs: list[list[int]]) -> list[tuple[int, int]]:
    """(request index, first differing position) of every request whose token ids differ; a prefix
    differs at the shorter one's length. reference, outputs: [N] token id lists in request order."""
    out = []
    for i, (ref, got) in enumerate(zip(reference, outputs, strict=True)):
        if ref != got:
            out.append((i, next((p for p, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))))
    return out


def mismatch_report(reference: list[list[list[int]]], outputs: list[list[list[int]]]) -> tuple[int, dict | None]:
    """(requests that differ over all rounds, the first of them: round, request, position and both tokens
    there, None past an end); reference, outputs: [rounds][N] token id lists."""
    bad = [
        (r, *m) for r, (ref, got) in enumerate(zip(reference, outputs, strict=True)) for m in first_mismatches(ref, got)
    ]
    if not bad:
        return 0, None
    r, i, p = bad[0]
    ref, got = reference[r][i], outputs[r][i]
    return len(bad), {
        "round": r,
        "request": i,
        "position": p,
        "reference_token": ref[p] if p < len(ref) else None,
        "token": got[p] if p < len(got) else None,
    }


@dataclass
class Call:
    """One generate call: token ids per request, wall seconds, and SD counts (drafting row-steps, accepted)."""

    outputs: list[list[int]]
    seconds: float
    sd_rows: int = 0
    accepted: int = 0
    arms: Counter = field(default_factory=Counter)


Runner = Callable[[int, list[Request]], Call]


@dataclass
class Row:
    """One (variant, batch): per timed round its tokens and seconds; outputs of every round."""

    variant: str
    batch: int
    groups: int
    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    outputs: list[list[list[int]]] = field(default_factory=list, repr=False)  # per round, warm-up included
    sd_rows: int = 0
    accepted: int = 0
    arms: Counter = field(default_factory=Counter)

    def rates(self) -> list[float]:
        return [t / s for t, s in zip(self.tokens, self.seconds)]

    def as_dict(self, reference: Row) -> dict[str, Any]:
        rates = self.rates()
        mismatched, first = mismatch_report(reference.outputs, self.outputs)
        out = {
            "variant": self.variant,
            "batch": self.batch,
            "groups": self.groups,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "seconds_median": statistics.median(self.seconds),
            "seconds_min": min(self.seconds),
            "seconds_max": max(self.seconds),
            "tokens_per_s": statistics.median(rates),
            "tokens_per_s_range": [min(rates), max(rates)],
            "accept_length": 1 + self.accepted / self.sd_rows if self.sd_rows else None,
            "compared_requests": sum(map(len, self.outputs)),
            "mismatched_requests": mismatched,
            "first_mismatch": first,
        }
        if self.arms:
            out["arms_chosen"] = dict(sorted(self.arms.items()))
        return out


def summarize(
    info: dict[str, Any], rows: dict[tuple[str, int], Row], batches: tuple[int, ...], load: dict[str, list[float]]
) -> dict[str, Any]:
    """The result: rows as dicts, and per batch the paired ratios against the faster vLLM-plain variant."""
    out: dict[str, Any] = {
        "tlt_vs_vllm_plain": {},
        "tlt_vs_vllm_plain_range": {},
        "vllm_eagle_vs_plain": {},
        "vllm_eagle_vs_plain_range": {},
        "vllm_plain_reference": {},
        "goal_met": {},
    }
    dynamic = any(v == "vllm-dynamic" for v, _ in rows)
    if dynamic:
        for key in ("vllm_best_fixed", "vllm_dynamic_vs_best", "vllm_dynamic_vs_best_range", "dynamic_goal_met"):
            out[key] = {}
    for b in batches:
        reference = rows[faster({v: rows[v, b].rates() for v in VLLM_PLAIN if (v, b) in rows}), b]
        out["vllm_plain_reference"][str(b)] = reference.variant
        for key, variant in (("tlt_vs_vllm_plain", "tlt-adaptive"), ("vllm_eagle_vs_plain", "vllm-eagle")):
            median, low, high = paired_ratio(rows[variant, b].rates(), reference.rates())
            out[key][str(b)], out[f"{key}_range"][str(b)] = median, [low, high]
        out["goal_met"][str(b)] = goal_met(out["tlt_vs_vllm_plain"][str(b)], b)
        if dynamic:
            fixed = {v: rows[v, b].rates() for v, bb in rows if bb == b and v.startswith(FIXED_PREFIX)}
            best_fixed = faster(fixed) if fixed else None
            out["vllm_best_fixed"][str(b)] = best_fixed
            better = faster({n: rows[n, b].rates() for n in (best_fixed, reference.variant) if n is not None})
            median, low, high = paired_ratio(rows["vllm-dynamic", b].rates(), rows[better, b].rates())
            out["vllm_dynamic_vs_best"][str(b)] = {"over": better, "ratio": median}
            out["vllm_dynamic_vs_best_range"][str(b)] = [low, high]
            out["dynamic_goal_met"][str(b)] = high >= 1.0
    info["rows"] = [row.as_dict(rows[REFERENCE, row.batch]) for row in rows.values()]
    return {"vllm": info, **out, "load_average": load}
