"""The drafter each Ray step drafts with, pulled from the run's drafter hub (`drafter.publish`).

Per step the coordinator hands the rollout workers the *served* drafter and, under `drafter.publish:
validated`, the hub's newer parameters as a *candidate* to score beside it (`tlt.drafter.publish`).
The hub's newest parameters are pulled as early as nothing can change them any more: when a step
ends with no trainer running (`stop_trainers_at="update"` stopped them all, and acknowledged,
before the update), so the next rollout does not wait for a round trip to the hub; otherwise when
the next step starts, after its trainers stopped. The pulled object goes to the workers as it is
(an object ref), not copied into a second one, and a served drafter that stays served keeps its
object from step to step. The hub is reached through the coordinator's `tlt.runtime.hub_keeper.HubKeeper`,
which restores a hub that restarted, so a pull never returns a freshly initialised drafter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from tlt.drafter.export import write_served_drafter
from tlt.drafter.publish import publish_outcome, step_drafters
from tlt.runtime.hub_keeper import HubKeeper

Drafter = tuple[int, Any]  # (version, parameters)


class StepDrafters:
    """The served drafter (None: the hub's newest), the step's candidate, a prefetched hub pull."""

    def __init__(self, publish: str, served: Drafter | None = None) -> None:
        self.publish = publish
        self.served = served
        self.candidate: Drafter | None = None
        self._pulled: Any | None = None  # ObjectRef of a hub pull issued early (`prefetch`)
        self._objects: list[tuple[Drafter, Any]] = []  # the last step's drafters and their object refs

    def prefetch(self, hub: HubKeeper) -> None:
        """Pull the hub's newest parameters now; call only when no trainer can push before the next step."""
        self._pulled = hub.pull_ref()

    def forget(self) -> None:
        """Drop a prefetched pull and kept objects (the actors are gone, or the run resumes)."""
        self._pulled = None
        self._objects = []

    def refs(self, hub: HubKeeper | None) -> tuple[Any, Any]:
        """Object refs of the step's (served drafter, candidate); (None, None) without a hub."""
        self.candidate = None
        if hub is None:
            return None, None
        pulled = self._pulled if self._pulled is not None else hub.pull_ref()
        self._pulled = None
        newest, pulled = hub.fetch(pulled)
        self.served, self.candidate = step_drafters(self.publish, self.served, newest)

        objects = {id(d): obj for d, obj in self._objects}  # every drafter here is alive: ids are unique
        objects[id(newest)] = pulled

        def ref(drafter: Drafter | None) -> Any:
            if drafter is None:
                return None
            if id(drafter) not in objects:
                objects[id(drafter)] = ray.put(drafter)
            return objects[id(drafter)]

        served, candidate = ref(self.served), ref(self.candidate)
        self._objects = [(d, obj) for d, obj in ((self.served, served), (self.candidate, candidate)) if d is not None]
        return served, candidate

    def outcome(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The step's publish metrics (`publish_outcome`); the drafter served from the next step on is set."""
        published, self.served = publish_outcome(self.served, self.candidate, results)
        self.candidate = None
        return published

    def next_drafter(self, newest: Drafter) -> Drafter:
        """The drafter the next step would draft with, given the hub's `newest`."""
        return step_drafters(self.publish, self.served, newest)[0]

    def write_served(
        self,
        out_dir: Path,
        hub: HubKeeper | None,
        checkpointed: dict[str, Any] | None,
        config: Any,
        step: int,
        feature_layers: tuple[int, ...] = (),
    ) -> None:
        """Write the drafter the next step would draft with (the served one under `drafter.publish: validated`,
        the hub's newest under `latest`) as `<out>/drafter-served/`, what `tlt export-drafter RUN` exports. The
        hub's newest comes from `hub`, or from the `checkpointed` hub state when no actors ran (a finished run
        started again). Nothing without a drafter. `config`: the policy's model config; `feature_layers`: the target
        layers a block drafter reads (`LearnedDrafters.feature_layers`)."""
        if hub is not None:
            newest = hub.pull()
        elif checkpointed is not None:
            newest = (int(checkpointed["version"]), checkpointed["params"])
        else:
            return
        drafter = self.next_drafter(newest)
        write_served_drafter(out_dir, drafter, config, publish=self.publish, step=step, feature_layers=feature_layers)
