"""The run's shared services, as plain classes that `tlt.runtime.ray_cluster` turns into Ray actors.

- `VerifierWorker`: scores one response against its reference (CPU).
- `HubWorker`: the drafter hub (`tlt.drafter.hub.DrafterHub`), the parameters every spot trainer syncs with;
  `hub_push` is the trainers' side of it. Ray restarts a lost hub's process (`HUB_RESTARTS`); the restarted
  hub refuses the drafter's calls (`HubRestarted`) until the coordinator has restored it
  (`tlt.runtime.hub_keeper`), so no trainer syncs with, and no rollout drafts with, a freshly initialised one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from tlt.drafter.hub import DrafterHub
from tlt.drafter.priority import lower_thread_priority
from tlt.models.drafter import drafter_config_from_target
from tlt.rl.reward_plugin import RewardError, call_reward, load_reward
from tlt.rl.rewards import score
from tlt.runtime.devices import to_cpu
from tlt.runtime.optional_ray import ray
from tlt.spec.plan import LearnedDrafters


class VerifierWorker:
    """Scores responses: `tlt.rl.rewards.score` under `answer_format`, or the `verifier.reward` plug-in
    (imported here; `tlt.rl.reward_plugin`), whose failure fails only its sample (0.0 and the error)."""

    def __init__(self, answer_format: str, reward: str | None = None, threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.answer_format = answer_format
        self.reward = None if reward is None else load_reward(reward)
        self.scored = 0

    def status(self) -> dict[str, Any]:
        """Its count of scored responses and its process (the coordinator's liveness probe)."""
        return {"scored": self.scored, "pid": os.getpid()}

    def score(
        self, response: str, reference: str, prompt: str = "", record: dict[str, Any] | None = None, sample: str = ""
    ) -> tuple[float, RewardError | None]:
        """(reward, None), or with the plug-in failing on this sample (0.0, its RewardError)."""
        self.scored += 1
        if self.reward is None:
            return score(response, reference, self.answer_format), None
        return call_reward(self.reward, prompt, response, record or {}, sample)


# Ray restarts a lost hub's process up to this many times in a run (`tlt.runtime.hub_keeper` restores its state);
# one lost more often than that fails the step, which restarts from the newest checkpoint.
HUB_RESTARTS = 3


class HubRestarted(RuntimeError):
    """The drafter hub's process was restarted and its drafter not yet restored (`HubWorker.restore`)."""


# The hub actor's concurrency group for trainers' pushes, and its threads (one per trainer that may push at once
# is enough: a push is short, and a trainer waits for its own).
PUSH_GROUP = "push"
PUSH_THREADS = 2


class HubWorker(DrafterHub):
    """The drafter hub as an actor: built from the policy's config (a picklable PretrainedConfig).

    Its pushes serve idle-time training only, so they run at the spot trainers' lowest priority
    (`lower_thread_priority`): in the long tail they would otherwise take CPU from the rollout still
    decoding. A thread that served a push stays at that priority (SCHED_IDLE is one-way for an
    unprivileged thread), so pushes are sent to their own concurrency group (`PUSH_GROUP`, see
    `hub_actor`) and the pulls, snapshots and state the coordinator asks for keep normal threads."""

    def __init__(
        self, target_config: Any, learning_rate: float, seed: int, snapshot_dir: str | None, threads: int = 1
    ) -> None:
        torch.set_num_threads(threads)
        super().__init__(drafter_config_from_target(target_config), learning_rate, seed=seed, snapshot_dir=snapshot_dir)
        # Ray re-runs this constructor in a restarted process: its drafter is a fresh one until `restore`
        in_ray = ray is not None and ray.is_initialized()
        self.awaiting = in_ray and ray.get_runtime_context().was_current_actor_reconstructed

    def _check_restored(self) -> None:
        if self.awaiting:
            raise HubRestarted("the drafter hub restarted; its drafter is being restored by the coordinator")

    def restore(self, learned: LearnedDrafters, version: int, params: dict[str, torch.Tensor]) -> None:
        """Hold `learned` at (`version`, `params`) (the drafter the coordinator last pulled) and serve again."""
        self.use_drafters(learned)
        self.load_state({"params": params, "optimizer": self.optimizer.state_dict(), "version": version})
        self.awaiting = False

    def push(
        self, trainer: str, grads: dict[str, torch.Tensor], based_on: int, tokens: int, loss: float
    ) -> tuple[int, dict[str, torch.Tensor]]:
        lower_thread_priority()
        self._check_restored()
        return super().push(trainer, grads, based_on, tokens, loss)

    def push_delta(
        self, trainer: str, delta: dict[str, torch.Tensor], based_on: int, steps: int, tokens: int, loss: float
    ) -> tuple[int, dict[str, torch.Tensor]]:
        lower_thread_priority()
        self._check_restored()
        return super().push_delta(trainer, delta, based_on, steps, tokens, loss)

    def pull(self) -> tuple[int, dict[str, torch.Tensor]]:
        self._check_restored()
        return super().pull()

    def state(self) -> dict[str, Any]:
        self._check_restored()
        return super().state()

    def snapshot(self, step: int) -> float:
        self._check_restored()
        return super().snapshot(step)

    def ping(self) -> dict[str, Any]:
        """Its process and whether it waits to be restored (the coordinator's probe)."""
        return {"pid": os.getpid(), "awaiting": self.awaiting}


def hub_actor(num_cpus: float) -> Any:
    """The hub's Ray actor class with its options: the default group's threads for the coordinator's calls,
    `PUSH_GROUP`'s for the trainers' pushes (sent there with `.options(concurrency_group=PUSH_GROUP)`)."""
    return ray.remote(concurrency_groups={PUSH_GROUP: PUSH_THREADS})(HubWorker).options(
        num_cpus=num_cpus, max_concurrency=4, max_restarts=HUB_RESTARTS, max_task_retries=0
    )


def hub_push(hub: Any) -> Callable[..., tuple[int, dict[str, torch.Tensor]]]:
    method = hub.push_delta.options(concurrency_group=PUSH_GROUP)  # the hub's low-priority threads

    def push(trainer: str, delta: dict[str, torch.Tensor], based_on: int, steps: int, tokens: int, loss: float):
        return ray.get(method.remote(trainer, to_cpu(delta), based_on, steps, tokens, loss))  # the hub: CPU

    return push


def no_hub(trainer: str, *_: Any) -> tuple[int, dict[str, torch.Tensor]]:
    raise RuntimeError(f"trainer {trainer}: no drafter hub (speculative.mode static or tlt needs one)")
