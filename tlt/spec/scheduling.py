"""The run's scheduling sections: restarts and clean-up (`runPolicy`), queueing, priority and gang scheduling
(`schedulingPolicy`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tlt.spec.base import LabelValue, Name, Spec


class RunPolicy(Spec):
    """Restarts, deadlines and clean-up (as Kubeflow Trainer's runPolicy)."""

    backoff_limit: int = Field(3, ge=0, le=1000, description="Restarts after failures before Failed.")
    active_deadline_seconds: int | None = Field(None, ge=1, le=31_536_000, description="Fail after this long.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, le=31_536_000, description="Delete after finishing.")
    clean_pod_policy: Literal["All", "Running", "None"] = Field("Running", description="Pods deleted at the end.")


class PodGroupPolicy(Spec):
    """Gang scheduling: all of the run's pods start together or none does."""

    scheduler: Literal["scheduler-plugins", "volcano"] = Field(
        "scheduler-plugins", description="Whose PodGroup kind is created."
    )
    schedule_timeout_seconds: int = Field(300, ge=1, le=86400, description="How long the gang may wait to start.")


class SchedulingPolicy(Spec):
    """Queueing and scheduling of the run's pods."""

    queue: Annotated[LabelValue, Field(min_length=1)] | None = Field(
        None, description="Kueue LocalQueue (`kueue.x-k8s.io/queue-name`, a label value)."
    )
    priority_class_name: Name | None = Field(None, description="PriorityClass of every pod.")
    gang: PodGroupPolicy | None = Field(None, description="Create a PodGroup for gang scheduling.")
