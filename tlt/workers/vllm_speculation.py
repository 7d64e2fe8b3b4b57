"""The speculative plan of one vLLM rollout engine, step by step: which table it drafts with, what each bucket
measured, and whether its drafter is healthy.

Before a rollout, `table` asks the bandit for each bucket's depth (`speculative.arms` of EAGLE kinds give the
depths; a `plain` arm gives K = 0) and writes TLT's threshold and buckets as vLLM's table
(`tlt.rollout.vllm.spec_table`); a flagged drafter gets the table that drafts nothing. After it, `settle`
scores each bucket's depth on the tokens the rows gained per second in that bucket's engine steps (the same
reward as this engine's adaptive stepper), counts each bucket's proposed and accepted drafts, and judges
the drafter's health from vLLM's own spec-decode counters (`tlt.workers.drafter_watch`).
"""

from __future__ import annotations

from typing import Any

from tlt.adaptive.adaptive_stepper import new_bandit
from tlt.rollout.draft_switch import sd_bucket
from tlt.rollout.vllm.spec_map import EAGLE_KINDS
from tlt.rollout.vllm.spec_table import Table, k_table, off_table
from tlt.spec.drafter_health import DrafterHealthSpec
from tlt.spec.run import SpeculativeSpec
from tlt.workers.drafter_watch import DrafterWatch


def depth_choices(spec: SpeculativeSpec) -> list[int]:
    """The draft lengths a bucket's bandit chooses from: every EAGLE arm's depth, and 0 for a `plain` arm."""
    depths = {arm.depth for arm in spec.arms if arm.kind in EAGLE_KINDS}
    if any(arm.kind == "plain" for arm in spec.arms):
        depths.add(0)
    return sorted(depths)


class VllmSpeculation:
    """The bandit, the current table and the drafter watch of one vLLM engine of `max_batch` rows."""

    def __init__(self, spec: SpeculativeSpec, health: DrafterHealthSpec, max_batch: int, seed: int) -> None:
        self.spec = spec
        self.max_batch = max_batch
        self.depths = depth_choices(spec)
        self.bandit = new_bandit(spec, len(self.depths), seed)
        self.watch = DrafterWatch(health)
        self.arms: list[int] = [len(self.depths) - 1] * len(spec.buckets)  # the deepest until the bandit chooses
        self.drafting = True

    def start_table(self) -> Table:
        """The table vLLM starts with: every bucket at the deepest depth."""
        return k_table(self.spec.threshold, self.spec.buckets, [self.depths[a] for a in self.arms], self.max_batch)

    def table(self, served: tuple[int, Any] | None) -> Table:
        """The table of the next rollout, whose engine was given drafter `served` (None: the one it had)."""
        self.watch.serve(served)
        self.drafting = self.watch.drafts()
        if not self.drafting:
            return off_table(self.max_batch)
        self.arms = [self.bandit.choose(b) for b in range(len(self.spec.buckets))]
        return k_table(self.spec.threshold, self.spec.buckets, [self.depths[a] for a in self.arms], self.max_batch)

    def settle(self, step: int, steps: list[Any], drafts: int, accepted: int) -> dict[str, Any]:
        """After `step`'s rollout: `steps` its engine steps (`VllmStep`), `drafts` / `accepted` the differences
        of vLLM's counters `spec_decode_num_drafts` / `spec_decode_num_accepted_tokens` over it. Returns the
        rollout result's `sd_by_bucket` ({bucket bound: [row-steps, proposed, accepted]}, accepted from the tokens
        the rows gained: a response cut at its token limit counts what it kept) and `sd_health`."""
        by_bucket: dict[str, list[int]] = {}
        for record in steps[1:]:  # the first step prefills the prompts: nothing was drafted for it
            bucket = sd_bucket(record.running, self.spec.threshold, self.spec.buckets)
            if bucket is None or not self.drafting:
                continue
            self.bandit.update(bucket, self.arms[bucket], record.new_tokens / record.running, max(record.seconds, 1e-9))
            if record.k > 0:
                cell = by_bucket.setdefault(str(self.spec.buckets[bucket]), [0, 0, 0])
                cell[0] += record.running
                cell[1] += record.running * record.k
                cell[2] += max(record.new_tokens - record.running, 0)
        health = self.watch.judge(step, drafts, accepted, drafted=self.drafting)
        return {"sd_by_bucket": dict(sorted(by_bucket.items(), key=lambda kv: int(kv[0]))), "sd_health": health}
