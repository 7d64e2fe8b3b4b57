"""The `.status` of a `TLTTrainingRun`: what the operator writes and `kubectl get` shows.

camelCase on the wire like the spec. Every field is optional so the operator can merge-patch
any part; `status_patch` dumps a model into the patch body (unset fields left out). Conditions
have the exact `metav1.Condition` shape; `set_condition` keeps `lastTransitionTime` stable
while a condition's status does not change, as Kubernetes' own helpers do.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

Phase = Literal["Pending", "Running", "Suspended", "Restarting", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]

ConditionType = Annotated[
    str,
    Field(
        min_length=1,
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    ),
]
Reason = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")]
Message = Annotated[str, Field(max_length=32768)]
Count = Annotated[int, Field(ge=0, le=1_000_000)]
Seconds = Annotated[float, Field(ge=0)]


class StatusPart(BaseModel):
    """Base of every status section: camelCase aliases, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Condition(StatusPart):
    """One observation, shaped exactly like `metav1.Condition`."""

    type: ConditionType = Field(description="Condition type in CamelCase, e.g. Ready, Progressing, Suspended.")
    status: Literal["True", "False", "Unknown"] = Field(description="Status of the condition.")
    observed_generation: Annotated[int, Field(ge=0)] | None = Field(
        None, description="metadata.generation the condition was set from."
    )
    last_transition_time: datetime = Field(description="Last time the status changed (RFC 3339).")
    reason: Reason = Field(description="Programmatic CamelCase reason for the last transition.")
    message: Message = Field(description="Human-readable details of the transition.")


class RoleStatus(StatusPart):
    """Pod counts of one role (policy, rollout or verifier)."""

    desired: Count | None = Field(None, description="Pods the spec asks for.")
    ready: Count | None = Field(None, description="Pods running and ready.")
    failed: Count | None = Field(None, description="Pods that failed.")


class StepStatus(StatusPart):
    """RL step progress reported by the coordinator."""

    current: Count | None = Field(None, description="Steps finished.")
    total: Count | None = Field(None, description="Steps the run will take (spec.algorithm.steps).")
    last_step_seconds: Seconds | None = Field(None, description="Wall time of the last finished step.")
    eval_accuracy: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None,
        description="Share of held-out problems answered with the full reward, last evaluation "
        "(spec.algorithm.evalEvery).",
    )
    eval_reward: Annotated[float, Field(ge=-1e9, le=1e9)] | None = Field(
        None, description="Mean reward on the held-out problems, last evaluation."
    )
    off_policy_fraction: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None,
        description="Share of the last step's trained tokens sampled by an older policy "
        "(spec.algorithm.rollout.mode partial); 0 in sync mode.",
    )


class ServedDrafter(StatusPart):
    """The drafter one rollout engine serves and its health (`spec.drafter.health`)."""

    worker: Annotated[str, Field(max_length=253)] = Field(description="Rollout worker (rollout-<rank>).")
    version: Count | None = Field(None, description="Drafter version the engine was last given.")
    healthy: bool | None = Field(None, description="False: the engine's drafter collapsed, it decodes plainly.")
    accept_length: Annotated[float, Field(ge=0, le=1024)] | None = Field(
        None, description="The engine's last judged accept length (tokens per drafting row-step)."
    )


class DrafterStatus(StatusPart):
    """The online drafter and the trainer slots that train it."""

    version: Count | None = Field(None, description="Newest drafter version on the hub (its last push).")
    served: list[ServedDrafter] | None = Field(
        None, max_length=1024, description="The drafter each rollout engine serves, and its health."
    )
    oldest_served: Count | None = Field(
        None, description="Oldest drafter version a rollout engine serves (version - oldestServed: the skew)."
    )
    accept_length: Annotated[float, Field(ge=0, le=1024)] | None = Field(
        None, description="Mean accepted tokens per verification in the last step (bonus token included)."
    )
    enabled_slots: list[Annotated[str, Field(max_length=253)]] | None = Field(
        None, max_length=1024, description="Rollout pods whose drafter-trainer slot is enabled."
    )
    enabled_trainers: Count | None = Field(None, description="Rollout pods whose trainer slot is enabled (count).")
    active_trainers: Count | None = Field(None, description="Trainers running right now.")
    idle_gpu_seconds: Seconds | None = Field(None, description="Rollout GPU-seconds spent idle, all steps.")
    harvested_gpu_seconds: Seconds | None = Field(
        None, description="Idle rollout GPU-seconds used for drafter training, all steps."
    )


class RunStatus(StatusPart):
    """Status of one `TLTTrainingRun`."""

    phase: Phase | None = Field(None, description="Coarse state of the run.")
    conditions: list[Condition] | None = Field(
        None, max_length=16, description="Latest observations, one per type (Ready, Progressing, Suspended, ...)."
    )
    observed_generation: Annotated[int, Field(ge=0)] | None = Field(
        None, description="metadata.generation the operator last reconciled."
    )
    policy: RoleStatus | None = Field(None, description="Policy pods.")
    rollout: RoleStatus | None = Field(None, description="Rollout pods.")
    verifier: RoleStatus | None = Field(None, description="Verifier pods.")
    replicas: Count | None = Field(None, description="Rollout pods observed (scale subresource).")
    selector: Annotated[str, Field(max_length=1024)] | None = Field(
        None, description="Label selector of the rollout pods (scale subresource)."
    )
    step: StepStatus | None = Field(None, description="RL step progress.")
    drafter: DrafterStatus | None = Field(None, description="Online drafter state.")
    restarts: Count | None = Field(None, description="Restarts after failures so far (see runPolicy.backoffLimit).")
    start_time: datetime | None = Field(None, description="When the run's pods were first created.")
    completion_time: datetime | None = Field(None, description="When the run Succeeded or Failed.")
    message: Message | None = Field(None, description="Human-readable summary of the phase.")
    ray_token_secret: Annotated[str, Field(max_length=253)] | None = Field(
        None,
        description="Name of the run's Ray token Secret, made by the server when the operator created it "
        "(generateName): the pods use this one only, never a Secret someone else named.",
    )

    @model_validator(mode="after")
    def _one_condition_per_type(self) -> RunStatus:
        types = [c.type for c in self.conditions or []]
        if len(types) != len(set(types)):
            raise ValueError("status.conditions must have one entry per type")
        return self


def status_patch(status: RunStatus) -> dict[str, Any]:
    """The JSON body for a merge patch of `.status`: camelCase, unset and None fields left out."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Conditions with `new` replacing the one of its type; `lastTransitionTime` is kept when
    the status is unchanged (only reason, message, observedGeneration refresh)."""
    out: list[Condition] = []
    replaced = False
    for cond in conditions:
        if cond.type != new.type:
            out.append(cond)
            continue
        keep_time = cond.status == new.status
        out.append(new.model_copy(update={"last_transition_time": cond.last_transition_time}) if keep_time else new)
        replaced = True
    if not replaced:
        out.append(new)
    return out
