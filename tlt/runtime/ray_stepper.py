"""The rollout worker's stepper for each `speculative.mode`.

off: plain decoding. ngram / static / tlt: the adaptive stepper (`tlt.adaptive.stepper`): plain
while more than `speculative.threshold` rows run, below it the speculative arm the bucketed bandit
picks among the mode's arms (n-gram arms cover the time before the learned drafter is useful).
The learned arms draft with the worker's drafter copy, the one its spot trainer trains, loaded
with the hub's newest parameters at the start of each rollout. The worker keeps its bandit across
rollouts, so what it learned about the arms carries over from step to step.
"""

from __future__ import annotations

from tlt.adaptive.bandit import BucketedBandit
from tlt.adaptive.stepper import AdaptiveStepper, build_adaptive_stepper
from tlt.spec.run import SpeculativeSpec
from tlt.models.drafter import EagleDrafter
from tlt.rollout.history import HistoryStore
from tlt.rollout.runner import ModelRunner
from tlt.rollout.stepper import PlainStepper


def rollout_stepper(
    spec: SpeculativeSpec,
    runner: ModelRunner,
    drafter: EagleDrafter | None,
    *,
    rows: int,
    context: int,
    bandit: BucketedBandit | None,
    seed: int,
    history: HistoryStore | None = None,
) -> PlainStepper | AdaptiveStepper:
    """The stepper of one rollout (build a fresh one per rollout; pass the previous one's bandit)."""
    if spec.mode == "off":
        return PlainStepper(runner)
    return build_adaptive_stepper(spec, runner, drafter, rows=rows, context=context, bandit=bandit, seed=seed,
                                  history=history)
