"""The run spec's speculative-decoding and drafter sections (`speculative`, `drafter`); re-exported by
`tlt.spec.run`, whose module docstring says how the spec is written and checked."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from tlt.spec.base import PathStr, Spec
from tlt.spec.drafter_health import DrafterHealthSpec

Exploration = Literal["weighted", "uniform"]  # which arm an exploring bandit round tries (tlt.adaptive.bandit)


class ArmSpec(Spec):
    """One speculative-decoding strategy the bandit may choose."""

    kind: Literal["chain", "tree", "ngram", "history", "mixed", "block", "plain"] = Field(
        description="Drafting strategy: chain / tree from the learned drafter, ngram from the row's own text, "
        "history from the prompt's other responses (tree when topk > 1), mixed: per row history, else the "
        "learned drafter, else nothing; block: a chain of depth drafts from ONE forward of the block drafter "
        "(2 <= depth <= 8); plain drafts nothing (lets the bandit learn where SD does not pay)."
    )
    depth: int = Field(4, ge=1, le=32, description="Draft tokens per sequence (tree: levels; block: block size).")
    topk: int = Field(1, ge=1, le=16, description="Children per node (tree and history only).")
    verify_tokens: int = Field(0, ge=0, le=256, description="Tree budget of tokens verified; 0: depth*topk.")

    @model_validator(mode="after")
    def _block(self) -> ArmSpec:
        if self.kind == "block" and not (2 <= self.depth <= 8 and self.topk == 1):
            raise ValueError("speculative.arms of kind block need 2 <= depth <= 8 and topk 1")
        return self


def _default_arms() -> list[ArmSpec]:
    return [
        ArmSpec(kind="chain", depth=2),
        ArmSpec(kind="chain", depth=1),
        ArmSpec(kind="tree", depth=2, topk=2, verify_tokens=4),
        ArmSpec(kind="ngram", depth=4),
    ]


class HistorySpec(Spec):
    """The rollout-history drafter's index (`tlt.rollout.history`): per prompt, its responses of this
    step and of earlier steps, per rollout worker."""

    enabled: bool = Field(True, description="Build arms of kind history and mixed; false drops them.")
    max_nodes: int = Field(
        400_000,
        ge=1_000,
        le=100_000_000,
        description="Suffix-index nodes kept per rollout worker (~0.3 KB each); the oldest finished "
        "responses are forgotten first.",
    )
    min_match: int = Field(2, ge=1, le=64, description="Shortest context suffix matched.")
    max_match: int = Field(8, ge=1, le=64, description="Longest context suffix matched.")
    max_draft: int = Field(8, ge=1, le=32, description="Longest history draft (arm depths must not exceed it).")

    @model_validator(mode="after")
    def _ordered(self) -> HistorySpec:
        if self.min_match > self.max_match:
            raise ValueError("speculative.history.minMatch must be <= speculative.history.maxMatch")
        return self


class SpeculativeSpec(Spec):
    """Speculative decoding in the rollout engine and the bandit that tunes it."""

    mode: Literal["off", "ngram", "static", "tlt"] = Field(
        "tlt",
        description="off: plain decoding; ngram: model-free drafts only; static: learned drafter, "
        "never retrained; tlt: drafter trained online in idle time plus the adaptive engine.",
    )
    threshold: int = Field(8, ge=0, le=4096, description="SD is on while the running batch is at most this.")
    arms: list[ArmSpec] = Field(
        default_factory=_default_arms, min_length=1, max_length=32, description="Strategies the bandit chooses from."
    )
    buckets: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 2, 4, 8],
        min_length=1,
        max_length=16,
        description="Upper bounds of running-batch buckets, ascending; one bandit per bucket.",
    )
    epsilon: float = Field(0.1, ge=0, le=1, description="Bandit exploration probability.")
    exploration: Exploration = Field(
        "weighted",
        description="Which arm an exploring round tries: weighted: arms close to the bucket's best "
        "more often, every arm at least 1/20 as often as the best; uniform: any arm equally (the paper's BEG-MAB).",
    )
    window: int = Field(64, ge=1, le=4096, description="Sliding window of rounds per arm and bucket.")
    ngram_min: int = Field(2, ge=1, le=16, description="Shortest n-gram matched.")
    ngram_max: int = Field(4, ge=1, le=16, description="Longest n-gram matched.")
    drafter_path: PathStr | None = Field(None, description="Initial drafter checkpoint folder.")
    history: HistorySpec = Field(default_factory=HistorySpec, description="Rollout-history drafting.")
    draft_vocab: int = Field(
        0,
        ge=0,
        le=16_777_216,
        description="The learned drafter drafts from this many tokens only: the ones each rollout worker's prompts "
        "and responses hold most often, recounted every rollout (EAGLE-3's reduced draft vocabulary; its head "
        "costs draftVocab / vocabulary of the full one). 0: the whole vocabulary. Lossless either way; must be "
        "below the policy's vocabulary and >= every arm's topk.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> SpeculativeSpec:
        if any(a.kind in ("history", "mixed") and a.depth > self.history.max_draft for a in self.arms):
            raise ValueError(
                "speculative.arms of kind history or mixed must have depth <= speculative.history.maxDraft"
            )
        if any(b >= a for b, a in zip(self.buckets, self.buckets[1:])):
            raise ValueError("speculative.buckets must be strictly ascending")
        if self.ngram_min > self.ngram_max:
            raise ValueError("speculative.ngramMin must be <= speculative.ngramMax")
        if 0 < self.draft_vocab < max(a.topk for a in self.arms):
            raise ValueError("speculative.draftVocab must be 0 (the whole vocabulary) or >= every arm's topk")
        return self


class DrafterSpec(Spec):
    """The online drafter and its trainer slots on the rollout pods."""

    training: bool = Field(True, description="Train the drafter online in idle time (mode tlt).")
    learning_rate: float = Field(3e-4, gt=0, le=1.0, description="Drafter AdamW learning rate.")
    batch_tokens: int = Field(2048, ge=16, le=1_048_576, description="Packed tokens per drafter batch.")
    buffer_steps: int = Field(2, ge=1, le=16, description="RL steps of rollouts kept (one-step offset).")
    publish: Literal["validated", "latest"] = Field(
        "validated",
        description="validated: rollouts draft with the trained drafter only once it agrees with the "
        "policy at least as often as the drafter in use, on a step's fresh rollouts (neither trained on them); "
        "latest: every step drafts with the newest parameters.",
    )
    enabled_slots: Literal["auto", "all", "none"] = Field(
        "auto", description="auto: the operator enables slots of idle pods; all / none: fixed."
    )
    min_trainers: int = Field(0, ge=0, le=1024, description="Slots kept enabled at least.")
    max_trainers: int = Field(8, ge=0, le=1024, description="Slots enabled at most.")
    idle_window_seconds: int = Field(10, ge=0, le=3600, description="Idle this long before a slot turns on.")
    busy_window_seconds: int = Field(5, ge=0, le=3600, description="Busy this long before a slot turns off.")
    cooldown_seconds: int = Field(30, ge=0, le=86400, description="Least time between changes of one slot.")
    idle_utilization: float = Field(0.2, ge=0, le=1, description="GPU utilisation below this counts idle.")
    placement: Literal["in-container", "sidecar"] = Field(
        "in-container", description="Trainer in the rollout container, or a sidecar sharing a DRA claim."
    )
    device_class_name: Annotated[str, Field(max_length=253, pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$")] | None = (
        Field(None, description="DRA DeviceClass (sidecar placement), a DNS subdomain name.")
    )
    export_format: Literal["eagle"] = Field("eagle", description="Format of the exported drafter.")
    health: DrafterHealthSpec = Field(
        default_factory=DrafterHealthSpec, description="When a served drafter counts as collapsed (every engine)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> DrafterSpec:
        if self.min_trainers > self.max_trainers:
            raise ValueError("drafter.minTrainers must be <= drafter.maxTrainers")
        if self.placement == "sidecar" and not self.device_class_name:
            raise ValueError("drafter.deviceClassName is required when drafter.placement is 'sidecar'")
        return self
