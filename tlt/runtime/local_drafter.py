"""The single-process loop's block drafter (`tlt train --local` with block arms): what a Ray run spreads
over its rollout workers, spot trainers and hub, in the one process, on the same code.

The block drafter is a `DrafterSet` (`tlt.drafter.drafter_set`) bound to the engine's copy of the policy,
trained by a `SpotTrainer` on an `OnlineBuffer` of the rollouts' tokens and target features, synced with an
in-process `DrafterHub` (its version counts optimizer steps), published as in a Ray run (`drafter.publish`:
`tlt.drafter.publish`, the candidate scored beside the served drafter on each step's fresh rollouts). The
EAGLE drafter is not run here (`tlt.runtime.local.local_speculative` drops the EAGLE arms).

Per step: `stepper` drafts the rollout with the served drafter on the bandit kept across rollouts; `take`
buffers the rollout and scores the served drafter and the candidate on it; `train` (when the step trains
the drafter, `SpeculativePlan.trains_drafter`) runs one pass over the buffer on the caller's thread. One process
has no idle device time to harvest, so the loop spends a fixed amount of work instead (one epoch of the
buffer), after the policy update: a resumed run repeats it bit for bit. `add_to` / `resume` are the
whole-run checkpoint's drafter part, in the Ray run's layout (`tlt.runtime.checkpoint.add_drafter`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from tlt.adaptive.adaptive_stepper import AdaptiveStepper, rollout_stepper
from tlt.adaptive.arms import block_graphs
from tlt.adaptive.bandit import BucketedBandit
from tlt.drafter.buffer import OnlineBuffer
from tlt.drafter.drafter_set import new_drafter_set
from tlt.drafter.hub import DrafterHub
from tlt.drafter.intake import buffer_and_agreement
from tlt.drafter.publish import publish_outcome, step_drafters
from tlt.drafter.trainer import SpotTrainer
from tlt.drafter.warmstart import has_block_part, warm_start_params
from tlt.models.drafter import drafter_config_from_target
from tlt.rollout.decode_step import PlainStepper
from tlt.rollout.engine import Engine
from tlt.rollout.warmup import warm_up_blocks
from tlt.runtime.checkpoint import Checkpoint, add_drafter, drafter_of
from tlt.spec.plan import LearnedDrafters, SpeculativePlan, learned_block_size, learned_drafters
from tlt.spec.run import RunSpec

TRAINER = "local"


def local_learned(spec: RunSpec, target_layers: int) -> LearnedDrafters:
    """The drafters this loop learns for a target of `target_layers` decoder layers: the block drafter of
    `learned_drafters`, never the EAGLE one."""
    return replace(learned_drafters(spec.speculative, target_layers), eagle=False)


class LocalBlockDrafter:
    """The block drafter of `engine` (built with `return_hidden=True`) for `spec` (block arms usable)."""

    def __init__(self, spec: RunSpec, engine: Engine) -> None:
        model = engine.runner.model
        learned = local_learned(spec, model.config.num_hidden_layers)
        if learned.block_size < 1:
            raise ValueError("LocalBlockDrafter needs a usable speculative.arms entry of kind block")
        if engine.runner.feature_layers != learned.feature_layers:
            raise ValueError(
                f"the engine keeps feature layers {list(engine.runner.feature_layers)}; this run's block drafter "
                f"reads {list(learned.feature_layers)}: build it with Engine(feature_layers=...)"
            )
        self.spec, self.engine = spec, engine
        self.plan = SpeculativePlan.of(spec.speculative, spec.drafter)
        self.drafters = new_drafter_set(model, learned)
        self.hub = DrafterHub(
            drafter_config_from_target(model.config), spec.drafter.learning_rate, seed=spec.algorithm.seed
        )
        self.hub.use_drafters(learned)
        self.buffer = OnlineBuffer(spec.drafter.buffer_steps, spec.drafter.batch_tokens, seed=spec.algorithm.seed)
        self.trainer = SpotTrainer(
            TRAINER, self.drafters, self.buffer, self.hub.push_delta, learning_rate=spec.drafter.learning_rate
        )
        self.served: tuple[int, dict[str, Any]] | None = None
        self.candidate: tuple[int, dict[str, Any]] | None = None
        self.bandit: BucketedBandit | None = None
        self._bandit_state: dict[str, Any] | None = None  # a checkpoint's, loaded into the next stepper

    def stepper(self, rows: int, context: int) -> PlainStepper | AdaptiveStepper:
        """The stepper of the next rollout: the served drafter (the hub's newest under `drafter.publish:
        latest`) loaded, the bandit of the last rollout (or the checkpoint's) carried over."""
        self.served, self.candidate = step_drafters(self.spec.drafter.publish, self.served, self.hub.pull())
        self.trainer.load(*self.served)
        stepper = rollout_stepper(
            self.spec.speculative,
            self.engine.runner,
            None,
            rows=rows,
            context=context,
            bandit=self.bandit,
            seed=self.spec.algorithm.seed,
            block=self.drafters.block,
        )
        if isinstance(stepper, AdaptiveStepper):
            if self._bandit_state is not None:
                stepper.bandit.load_state_dict(self._bandit_state)
                self._bandit_state = None
            self.bandit = stepper.bandit
        return stepper

    def take(self, completions: list[Any], step: int) -> dict[str, Any]:
        """Buffer `step`'s completions (hidden states kept) and score the served drafter and the candidate on
        them; the publish metrics (`publish_outcome`) and "drafter_agreement". The trainer goes on from the
        candidate."""
        result = buffer_and_agreement(
            self.buffer, self.trainer, completions, step, self.spec.drafter.batch_tokens, self.candidate
        )
        metrics, self.served = publish_outcome(self.served, self.candidate, [result])
        metrics["drafter_agreement"] = result["agree"] / result["agree_total"] if result["agree_total"] else None
        return metrics

    def train(self, step: int) -> dict[str, Any]:
        """One pass over the buffer when `step` trains the drafter; its metrics (hub version, loss, steps)."""
        if not self.plan.trains_drafter(step):
            return {"drafter_version": self.hub.version, "drafter_updates": 0, "drafter_loss": None}
        run = self.trainer.train_epochs(step, epochs=1)
        if run["error"] is not None:
            raise RuntimeError(f"block drafter training of step {step} failed: {run['error']}")
        return {
            "drafter_version": self.hub.version,
            "drafter_updates": run["iterations"],
            "drafter_loss": run["loss_last"],
        }

    def after_update(self, completions: list[Any], step: int) -> dict[str, Any]:
        """The drafter's part of `step`, after the policy update (off the step's timing): the rollout's arms
        ("sd_arms", "accept_length"), `take`, `train`. The engine decodes plainly until the next `stepper`
        (the held-out evaluation)."""
        stepper = self.engine.stepper
        summary = stepper.summary() if isinstance(stepper, AdaptiveStepper) else {}
        self.engine.stepper = PlainStepper(self.engine.runner)
        return {
            "sd_arms": summary.get("arms_chosen", {}),
            "accept_length": summary.get("accept_length"),
            **self.take(completions, step),
            **self.train(step),
        }

    def add_to(self, ckpt: Checkpoint) -> None:
        """Put the drafter into a whole-run checkpoint in a Ray run's layout (`add_drafter`: the hub's state
        with the served drafter, one trainer's state; state "bandits": one bandit)."""
        hub = self.hub.state()
        if self.served is not None:
            hub["served"] = {"version": self.served[0], "params": self.served[1]}
        add_drafter(ckpt, hub, [self.trainer.state_dict()])
        ckpt.state["bandits"] = [self.bandit.state_dict() if self.bandit is not None else self._bandit_state]

    def resume(self, ckpt: Checkpoint) -> None:
        """Continue from `add_to`'s part of `ckpt` (nothing when it holds no drafter)."""
        hub, trainers = drafter_of(ckpt)
        if hub is None or not trainers:
            return
        self.hub.load_state(hub)
        served = hub.get("served")
        self.served = (int(served["version"]), served["params"]) if served else None
        self.trainer.load_state_dict(trainers[0])
        self.bandit, self._bandit_state = None, (ckpt.state.get("bandits") or [None])[0]


def local_block_drafter(spec: RunSpec, engine: Engine, ckpt: Checkpoint | None) -> LocalBlockDrafter | None:
    """The block drafter of a run with usable block arms (None without), its graphs compiled (a compiled
    engine), resumed from `ckpt`, else started from the block part of `speculative.drafterPath` when it has one
    (`tlt.drafter.warmstart`; this loop runs no EAGLE drafter)."""
    if not learned_block_size(spec.speculative):
        return None
    with torch.random.fork_rng(devices=[]):  # the hub seeds its drafters' init: the run's own RNG stays as it was
        block = LocalBlockDrafter(spec, engine)
    warm_up_blocks(
        engine, block.drafters.block, **block_graphs(spec.speculative, sampled=spec.algorithm.temperature > 0)
    )
    if ckpt is not None:
        block.resume(ckpt)
    path = spec.speculative.drafter_path
    if block.hub.version == 0 and path is not None and has_block_part(path):
        block.hub.load_params(warm_start_params(path, engine.runner.model.config, block.hub.drafters()))
    return block
