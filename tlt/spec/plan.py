"""The speculative plan: what a run's `speculative` and `drafter` sections mean, resolved in one place.

`speculative.mode` is a word in a manifest; the rest of the code asks questions of it (does this run
draft at all, which arms may the bandit pick, which drafters does it learn, does its trainer run in this
step). Every answer is here, so no module outside the spec and this one compares the mode to a string
(a test holds it):

- off: no arms, no drafter (plain decoding);
- ngram: the model-free arms only (`ngram`, `history`, `plain`), no learned drafter;
- static / tlt: every arm; the run keeps learned drafters (a hub, buffers, trainer slots): the EAGLE
  drafter when a chain, tree or mixed arm is usable, the block drafter when a block arm is, of block size
  = the largest block arm's depth, reading the target's final-norm state and `spread_layers` of its
  decoder layers. static trains them only in the idle time of the first step (and not at all from
  `speculative.drafterPath`), tlt in every step while `drafter.training` is on.

Torch-free: the operator and `tlt validate` read the plan too.
"""

from __future__ import annotations

from dataclasses import dataclass

from tlt.spec.speculative import DrafterSpec, SpeculativeSpec

LEARNED_MODES = ("static", "tlt")
EAGLE_ARM_KINDS = ("chain", "tree", "mixed")  # arms that draft with the learned EAGLE drafter
HISTORY_KINDS = ("history", "mixed")  # arms that read the rollout-history store
MODEL_FREE_KINDS = ("ngram", "history", "plain")
MSG_NGRAM_ARMS = (
    "speculative.mode 'ngram' needs at least one arm of kind 'ngram' or 'history' "
    "(with speculative.history.enabled) in speculative.arms"
)


@dataclass(frozen=True)
class LearnedDrafters:
    """Which drafters a run learns: the EAGLE drafter (`eagle`), the block drafter (`block_size` > 0) reading
    the target's `feature_layers` beside its final-norm state (rollout engines keep them)."""

    eagle: bool
    block_size: int
    feature_layers: tuple[int, ...] = ()


NO_DRAFTERS = LearnedDrafters(eagle=False, block_size=0)


def spread_layers(num_layers: int, count: int = 3) -> tuple[int, ...]:
    """`count` layers spread from the second to the third-from-last (DFlash's choice), e.g. 16 layers ->
    (1, 7, 13); on a target of fewer than 4 layers the first `count` of those allowed (2 layers -> (0,))."""
    top = num_layers - 3
    if top < 1:
        return tuple(range(min(count, num_layers - 1)))
    if count == 1:
        return (top,)
    return tuple(sorted({round(1 + (top - 1) * i / (count - 1)) for i in range(count)}))


def speculates(spec: SpeculativeSpec) -> bool:
    """Whether the run drafts at all (every mode but off)."""
    return spec.mode != "off"


def model_free_only(spec: SpeculativeSpec) -> bool:
    """Whether only model-free arms draft (mode ngram)."""
    return spec.mode == "ngram"


def learns_drafters(spec: SpeculativeSpec) -> bool:
    """Whether the run keeps learned drafters (modes static and tlt): a hub, buffers, trainer slots."""
    return spec.mode in LEARNED_MODES


def retrains(speculative: SpeculativeSpec) -> bool:
    """Whether the mode trains its drafters in every step (tlt), not at most in the first (static)."""
    return speculative.mode == "tlt"


def trains_online(speculative: SpeculativeSpec, drafter: DrafterSpec) -> bool:
    """Whether trainers may run in every step's idle time (mode tlt with `drafter.training`)."""
    return retrains(speculative) and drafter.training


def trains_first_step(speculative: SpeculativeSpec) -> bool:
    """Whether trainers run in the first step's idle time only (mode static, not from `drafterPath`)."""
    return speculative.mode == "static" and speculative.drafter_path is None


def usable_arms(spec: SpeculativeSpec) -> list[int]:
    """Indices into `spec.arms` usable in `spec.mode` (the module docstring); history arms only with
    `speculative.history.enabled`. ValueError: mode ngram without a model-free arm that drafts."""
    if not speculates(spec):
        return []
    usable = [i for i, a in enumerate(spec.arms) if spec.history.enabled or a.kind not in HISTORY_KINDS]
    if model_free_only(spec):
        chosen = [i for i in usable if spec.arms[i].kind in MODEL_FREE_KINDS]
        if not any(spec.arms[i].kind != "plain" for i in chosen):
            raise ValueError(MSG_NGRAM_ARMS)
        return chosen
    return usable


def learned_block_size(spec: SpeculativeSpec) -> int:
    """The block size of the block drafter `spec`'s usable arms draft with: the largest block arm's depth
    (0: none, also in modes off / ngram)."""
    if not learns_drafters(spec):
        return 0
    return max((spec.arms[i].depth for i in usable_arms(spec) if spec.arms[i].kind == "block"), default=0)


def learned_drafters(spec: SpeculativeSpec, target_layers: int) -> LearnedDrafters:
    """The drafters the usable arms of `spec` draft with (modes off / ngram: none), for a target of
    `target_layers` decoder layers: a block drafter reads `spread_layers` of them."""
    if not learns_drafters(spec):
        return NO_DRAFTERS
    block_size = learned_block_size(spec)
    return LearnedDrafters(
        eagle=any(spec.arms[i].kind in EAGLE_ARM_KINDS for i in usable_arms(spec)),
        block_size=block_size,
        feature_layers=spread_layers(target_layers) if block_size else (),
    )


@dataclass(frozen=True)
class SpeculativePlan:
    """A run's speculative decoding and drafter training, resolved once (`SpeculativePlan.of`).

    `arms`: indices into `speculative.arms` the bandit may pick; `learns`: the run keeps learned drafters;
    `eagle` / `block_size`: which (`learned` adds the feature layers for a target's depth); `retrains`: the
    mode trains them in every step (tlt), not at most in the first (static); `trains_online`:
    trainers may run in every step's idle time (tlt with `drafter.training`); `trains_first_step`: only in
    the first step's (static without `speculative.drafterPath`)."""

    mode: str
    arms: tuple[int, ...]
    learns: bool
    eagle: bool
    block_size: int
    retrains: bool
    trains_online: bool
    trains_first_step: bool

    @classmethod
    def of(cls, speculative: SpeculativeSpec, drafter: DrafterSpec) -> SpeculativePlan:
        arms = tuple(usable_arms(speculative))
        learns = learns_drafters(speculative)
        return cls(
            mode=speculative.mode,
            arms=arms,
            learns=learns,
            eagle=learns and any(speculative.arms[i].kind in EAGLE_ARM_KINDS for i in arms),
            block_size=learned_block_size(speculative),
            retrains=retrains(speculative),
            trains_online=trains_online(speculative, drafter),
            trains_first_step=trains_first_step(speculative),
        )

    @property
    def drafts(self) -> bool:
        """Whether the run drafts at all (mode off: no)."""
        return self.mode != "off"

    @property
    def model_free_only(self) -> bool:
        """Whether only model-free arms draft (mode ngram)."""
        return self.mode == "ngram"

    @property
    def ever_trains(self) -> bool:
        """Whether any step's idle time trains the drafters."""
        return self.trains_online or self.trains_first_step

    def trains_drafter(self, step: int) -> bool:
        """Whether trainers may run in `step`'s idle time."""
        return self.trains_online or (self.trains_first_step and step == 1)

    def learned(self, target_layers: int) -> LearnedDrafters:
        """The drafters learned for a target of `target_layers` decoder layers (the block drafter's feature
        layers depend on its depth)."""
        if not self.block_size:
            return LearnedDrafters(eagle=self.eagle, block_size=0)
        return LearnedDrafters(self.eagle, self.block_size, spread_layers(target_layers))
