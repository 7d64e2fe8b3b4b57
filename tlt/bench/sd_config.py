"""The sd bench's settings: which SD variants run, on which policy and drafters, at which batches."""

from __future__ import annotations

from dataclasses import dataclass

from tlt.bench.bench_drafter import DrafterBudget

# plain decoding, on an engine returning the final-norm features, on one keeping the block drafter's layers too
PLAIN_VARIANTS = ("plain", "plain-hidden", "plain-wide")


@dataclass(frozen=True)
class SdBenchConfig:
    """Plain vs chain / tree / n-gram SD on the warm-started policy, plus the measured costs.

    warmstart: "full" (WarmstartConfig()), "reduced" (reduced_config()) or "deep" (deep_config()).
    workload: a `tlt bench run` workload file instead: its warm-started policy and its `drafterWarmstart`
    drafter (the one its static / tlt variants start from), its temperature, response budget, group size
    and `rollout.compile` (compile: compiled target and drafter steps). Each
    running batch B runs max(B, min_prompts) requests (waves of B, rows leave at eos): at T = 0 one per
    task prompt, at T > 0 `group_size` per prompt. The drafter trains for drafter_steps on the policy's
    own T=1 samples of drafter_prompts other task prompts. history: (k, min_match, max_match) of the
    history and mixed variants (the mixed one's EAGLE chain drafts k too).
    """

    warmstart: str = "full"
    workload: str | None = None
    compile: bool = False
    dtype: str = "fp32"
    batches: tuple[int, ...] = (1, 4, 32)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    min_prompts: int = 8
    max_new_tokens: int = 128
    chain_depths: tuple[int, ...] = (2, 4)
    tree: tuple[int, int, int] = (2, 4, 8)  # (top-k, depth, verify budget)
    ngram: tuple[int, int, int] = (4, 2, 4)  # (k, ngram_min, ngram_max)
    history: tuple[int, int, int] = (4, 2, 8)  # (k, min_match, max_match)
    history_nodes: int = 400_000
    block_depths: tuple[int, ...] = (2, 4, 8)  # block drafts (one drafter forward each); the drafter's block: max
    block_layers: int = 1
    block_wide: bool = True  # block-<k>-wide too: a second block drafter reading `spread_layers` of the target
    group_size: int = 8
    drafter_prompts: int = 512
    drafter_steps: int = 400
    drafter_batch: int = 32
    drafter_lr: float = 3e-3
    cost_widths: tuple[int, ...] = (2, 4, 8, 16)
    cost_context: int = 128
    repeats: int = 3
    seed: int = 0

    def drafter_budget(self) -> DrafterBudget:
        return DrafterBudget(
            self.max_new_tokens,
            self.drafter_prompts,
            self.drafter_steps,
            self.drafter_batch,
            self.drafter_lr,
            self.seed,
        )

    threads: int = 2

    @classmethod
    def quick(cls, repeats: int = 1) -> SdBenchConfig:
        return cls(
            warmstart="reduced",
            batches=(1, 4),
            min_prompts=2,
            max_new_tokens=16,
            drafter_prompts=16,
            drafter_steps=5,
            drafter_batch=16,
            cost_widths=(2, 4),
            cost_context=32,
            repeats=repeats,
            group_size=2,
            block_depths=(2, 4),
        )

    def variants(self) -> list[str]:
        topk, depth, budget = self.tree
        # chain-<k>-argmax: the deepest chain drafting the drafter's argmax instead of its coupled guess
        # (the two differ only at T > 0)
        return [
            *(PLAIN_VARIANTS if self.block_wide else PLAIN_VARIANTS[:2]),
            *(f"chain-{d}" for d in self.chain_depths),
            f"chain-{max(self.chain_depths)}-argmax",
            f"tree-k{topk}-d{depth}-b{budget}",
            f"ngram-{self.ngram[0]}",
            f"history-{self.history[0]}",
            f"mixed-{self.history[0]}",
            *(f"block-{d}" for d in self.block_depths),
            *(f"block-{d}-wide" for d in (self.block_depths if self.block_wide else ())),
        ]
