"""The in-process executor's rollout worker (`tlt.runtime.local_executor`): what a Ray run spreads over rollout
workers, verifiers, the drafter hub and spot trainers, in this process and on the same code.

Generation is a Ray rollout worker's (`tlt.workers.shard_generation.ShardGenerator`: the step's requests, the
stepper of the run's arms on a bandit kept across rollouts, the rollout-history store), so is the drafter role
(`tlt.workers.rollout_drafter.WorkerDrafter`: the EAGLE and / or block drafter bound to the engine's policy copy,
its online buffer and spot trainer), synced with an in-process `DrafterHub` and published as in a Ray run
(`drafter.publish`). Responses are scored as they finish, by a `VerifierWorker` in this process. So every
`speculative.mode`, arm and drafter runs here as it does on Ray.

One process has no idle device time to harvest, so a step that trains the drafters (`SpeculativePlan.
trains_drafter`) spends a fixed amount of work instead: one epoch of the buffer, after the policy update (a
resumed run repeats it bit for bit); the hub's pushes give the step's drafter metrics under a Ray step's names,
its snapshots go where a Ray hub's do. `add_to` / `resume` are the whole-run checkpoint's worker parts in a Ray
run's layout (`tlt.checkpoint.store.add_drafter`; state "bandits": one bandit). What needs a second process
by nature is refused in one line: `drafter.placement: sidecar`.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.adaptive.arms import block_graphs, drafter_graphs
from tlt.checkpoint.store import Checkpoint, add_drafter, drafter_of
from tlt.drafter.hub import DrafterHub
from tlt.drafter.publish import publish_outcome, step_drafters
from tlt.drafter.warmstart import warm_start_params
from tlt.models.drafter import drafter_config_from_target
from tlt.models.loading import resolve_dtype
from tlt.rl.reward_plugin import RewardError
from tlt.rollout.compiled import resolve_compile
from tlt.rollout.engine import Engine
from tlt.rollout.types import Completion
from tlt.rollout.warmup import warm_up, warm_up_blocks
from tlt.runtime.partial_work import GroupWork, shard_parts, shard_quotas
from tlt.runtime.shard_metrics import drafter_step_metrics
from tlt.spec.plan import SpeculativePlan
from tlt.spec.run import RunSpec
from tlt.tasks.problem import Problem
from tlt.workers.drafter_watch import DrafterWatch
from tlt.workers.rollout_drafter import WorkerDrafter
from tlt.workers.rollout_state import WorkerStates
from tlt.workers.services import VerifierWorker
from tlt.workers.shard_generation import ShardGenerator

NAME = "local"
MSG_SIDECAR = (
    "drafter.placement 'sidecar' trains the drafter in a second container of the rollout pod: it needs the Ray "
    "runtime (run without --local), or set drafter.placement to 'in-container'"
)


class LocalWorker:
    """The rollout engine over a copy of `policy` in `model.dtype` (one wave of the step's groups x G rows: P, or
    more with partial rollouts' `overProvision`), its drafters and
    hub, its verifier; resumed from `ckpt`, else started from `speculative.drafterPath` when set."""

    name = NAME

    def __init__(
        self,
        spec: RunSpec,
        policy: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        ckpt: Checkpoint | None,
        snapshot_dir: Path | None = None,
    ) -> None:
        self.spec = spec
        self.plan = SpeculativePlan.of(spec.speculative, spec.drafter)
        model = copy.deepcopy(policy).to(resolve_dtype(spec.model.dtype)).eval()
        context = min(spec.model.max_context, model.config.max_position_embeddings)
        rows = spec.algorithm.rollout.groups_started(spec.algorithm.prompts_per_step) * spec.algorithm.group_size
        with torch.random.fork_rng(devices=[]):  # the drafters' and hub's init: the run's own RNG stays as it was
            self.drafting = WorkerDrafter(NAME, spec, model)
            learns = self.drafting.drafter is not None
            if learns and spec.drafter.placement == "sidecar":
                raise ValueError(MSG_SIDECAR)
            self.hub = (
                DrafterHub(
                    drafter_config_from_target(model.config),
                    spec.drafter.learning_rate,
                    seed=spec.algorithm.seed,
                    snapshot_dir=snapshot_dir,
                )
                if learns
                else None
            )
        self.engine = Engine(
            model,
            max_batch_size=rows,
            max_context=context,
            return_hidden=learns,
            feature_layers=self.drafting.learned.feature_layers,
            compile=resolve_compile(spec.rollout.compile, model),
        )
        self.engine.draft_vocab = self.drafting.draft_vocab
        eagle, block = self.drafting.eagle, self.drafting.block
        self.generator = ShardGenerator(self.engine, tokenizer, spec, 0, eagle, rows, context, block=block)
        self.drafting.setup_trainer(self.hub)
        sampled = spec.algorithm.temperature > 0  # compile now, not in step 1's rollout
        self.warmup_seconds = warm_up(self.engine, eagle, **drafter_graphs(spec.speculative, sampled=sampled))
        self.warmup_seconds += warm_up_blocks(self.engine, block, **block_graphs(spec.speculative, sampled=sampled))
        self.verifier = VerifierWorker(
            spec.dataset.answer_format, spec.verifier.reward, threads=torch.get_num_threads()
        )
        self.states = WorkerStates()
        self.watch = DrafterWatch(spec.drafter.health)
        self.served: tuple[int, dict[str, Any]] | None = None
        self.candidate: tuple[int, dict[str, Any]] | None = None
        if ckpt is not None:
            self.resume(ckpt)
        path = spec.speculative.drafter_path
        if self.hub is not None and self.hub.version == 0 and path is not None:
            self.hub.load_params(warm_start_params(path, model.config, self.hub.drafters()))

    def rollout(
        self, step: int, ids: list[int], problems: list[Problem], work: list[GroupWork] | None = None
    ) -> tuple[list[Completion], list[tuple[float, RewardError | None] | None], dict[str, Any]]:
        """Step `step`'s rollout of `problems` (indices `ids`) with the served drafter: its completions, their
        (reward, error) in order, and the generation's result fields (`ShardGenerator.generate`) with the set-up's
        parts as a Ray worker reports them (`worker`, `called_at`, `setup_seconds`). `work`: a partial rollout's
        groups, ended at `promptsPerStep` complete ones (None scores for the responses still running)."""
        called = time.time()
        self.load_drafters()
        loaded = time.time()

        def submit(index: int, request_id: str, text: str, problem: Problem) -> tuple[float, RewardError | None]:
            return self.verifier.score(text, problem.answer, problem.prompt, dict(problem.record), request_id)

        quotas = None if work is None else local_quotas(self.spec, len(work))
        self.watch.serve(self.served)
        speculate = self.watch.drafts()
        result = self.generator.generate(step, ids, problems, submit, self.states, work, quotas, speculate=speculate)
        if self.drafting.drafter is not None:
            result["sd_health"] = self.watch.judge(
                step, result["sd_row_steps"], result["sd_accepted"], drafted=speculate
            )
        setup = {"load_drafter": loaded - called, "stepper": result.pop("generate_started") - loaded}
        result.update(worker=self.name, called_at=called, started_at=called, setup_seconds=setup)
        if self.generator.history is not None:  # this step's responses draft the next ones
            self.generator.index_waves(self.generator.take_waves())
        return result["completions"], result["rewards"], result

    def load_drafters(self) -> None:
        """The step's served drafter (and the candidate scored beside it) from the hub (`drafter.publish`),
        loaded into the copy the arms draft with."""
        if self.hub is not None:
            self.served, self.candidate = step_drafters(self.spec.drafter.publish, self.served, self.hub.pull())
        self.drafting.load(self.served)

    def load_weights(self, policy: PreTrainedModel) -> None:
        """The engine's copy of the policy, refreshed in place (cast to its dtype; tied embeddings stay tied)."""
        self.engine.load_weights(policy.state_dict())

    def after_update(self, completions: list[Completion], step: int) -> dict[str, Any]:
        """The drafters' part of `step`, after the policy update: the rollout buffered and the served drafter and
        the candidate scored on it, then one epoch of training when the step trains them; the metrics under a Ray
        step's names (`drafter_step_metrics` over the hub's pushes, the publish metrics); {} without learned
        drafters."""
        if self.hub is None:
            return {}
        take = self.drafting.take_rollouts(self.engine.runner.model, completions, step, self.served, self.candidate)
        published, self.served = publish_outcome(self.served, self.candidate, [take])
        self._train(step)
        return {**drafter_step_metrics([take], [], self.hub.take_pushes()), **published}

    def _train(self, step: int) -> None:
        trainer = self.drafting.trainer
        if trainer is None or not self.plan.trains_drafter(step):
            return
        run = trainer.train_epochs(step, epochs=1)
        if run["error"] is not None:
            raise RuntimeError(f"drafter training of step {step} failed: {run['error']}")

    def snapshot(self, step: int) -> None:
        """Queue the hub's asynchronous drafter snapshot of `step` (with a snapshot folder)."""
        if self.hub is not None and self.hub.snapshot_dir is not None:
            self.hub.snapshot(step)

    def add_to(self, ckpt: Checkpoint) -> None:
        """This worker's part of a whole-run checkpoint in a Ray run's layout: the hub's state with the served
        drafter, the trainer's state, the bandit."""
        if self.hub is not None:
            hub = self.hub.state()
            if self.served is not None:
                hub["served"] = {"version": self.served[0], "params": self.served[1]}
            add_drafter(ckpt, hub, [self.drafting.state()])
        if self.plan.drafts:
            ckpt.state["bandits"] = [self.generator.bandit_state()]

    def resume(self, ckpt: Checkpoint) -> None:
        """Continue from `add_to`'s part of `ckpt` (what it holds of it)."""
        bandits = ckpt.state.get("bandits") or [None]
        self.generator.load_bandit(bandits[0])
        hub, trainers = drafter_of(ckpt)
        if self.hub is None or hub is None:
            return
        self.hub.load_state(hub)
        served = hub.get("served")
        self.served = (int(served["version"]), served["params"]) if served else None
        if trainers:
            self.drafting.load_state(trainers[0])


def local_quotas(spec: RunSpec, groups: int) -> list[int]:
    """A partial rollout's shards in this process: the `rollout.replicas` shards a Ray run splits the step's
    `groups` into, each ending at its share of `promptsPerStep` (so both executors train the same groups)."""
    parts = shard_parts(groups, [0] * max(spec.rollout.replicas, 1))
    return shard_quotas([len(p) for p in parts], spec.algorithm.prompts_per_step)
