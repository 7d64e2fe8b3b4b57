"""The pod-template part of a role's spec: the bounded set of pod fields a run may set (labels,
annotations, node selector, tolerations, environment, identity, pull secrets, grace period), and the
role's resources. Imported from `tlt.spec.run` like every section."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from tlt.spec.base import QUALIFIED_NAME, LabelValue, Name, QualifiedName, Quantity, Spec

RESERVED_PREFIX = "tlt.dev/"  # labels and annotations only the operator and its workers set
MSG_RESERVED = (
    f"podTemplate labels and annotations must not use the prefix '{RESERVED_PREFIX}' (the operator's "
    "own keys: run, role, rank, spec hash, progress, worker state)"
)


class Toleration(Spec):
    """A pod toleration (the subset of `core/v1.Toleration` a run may set)."""

    key: QualifiedName | None = Field(None, description="Taint key; empty with operator Exists matches every taint.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="How key and value match the taint.")
    value: LabelValue | None = Field(None, description="Taint value (operator Equal), a label value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect matched; empty matches all effects."
    )

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("toleration.value must be empty when toleration.operator is 'Exists'")
        return self


class SecretKeyRef(Spec):
    """One key of a Secret in the run's namespace."""

    name: Name = Field(description="Secret name.")
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="Key within the Secret: letters, digits, '-', '_' and '.'."
    )


# Kubernetes' rule for an env var's name (IsEnvVarName): letters, digits, '-', '_' and '.', not starting with a
# digit, and not '.', '..' or starting with '..' (the API server refuses those when the pod is created).
EnvName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^([-_a-zA-Z]|\.[-_a-zA-Z0-9])[-._a-zA-Z0-9]*$")]


class EnvVar(Spec):
    """An environment variable of the run's containers."""

    name: EnvName = Field(
        description="Variable name: letters, digits, '-', '_' and '.'; not a digit first, not '.' or '..' first."
    )
    value: Annotated[str, Field(max_length=4096)] | None = Field(None, description="Literal value.")
    secret_key_ref: SecretKeyRef | None = Field(None, description="Value taken from a Secret, by reference.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value and self.secret_key_ref is not None:
            raise ValueError("env.value and env.secretKeyRef are mutually exclusive")
        return self


class Resources(Spec):
    """Requests and limits of each pod of a role (requests equal limits)."""

    cpu: Quantity = Field("1", description="CPU request and limit.")
    memory: Quantity = Field("4Gi", description="Memory request and limit.")
    gpus: int = Field(0, ge=0, le=16, description="`nvidia.com/gpu` per pod.")


class PodOverrides(Spec):
    """The bounded set of pod-template fields a run may override."""

    labels: dict[str, LabelValue] = Field(default_factory=dict, max_length=32, description="Extra pod labels.")
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=32, description="Extra pod annotations."
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Node labels the pods must match."
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32, description="Pod tolerations.")
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description="Extra environment variables.")
    service_account_name: Name | None = Field(None, description="ServiceAccount the pods run as.")
    image_pull_secrets: list[Name] = Field(
        default_factory=list, max_length=8, description="Secrets used to pull the image."
    )
    termination_grace_period_seconds: int | None = Field(
        None,
        ge=0,
        le=86400,
        description="Seconds a pod has after SIGTERM before it is killed. On the policy pods: at least one "
        "step plus one checkpoint, so a stop (drain, eviction, suspend) keeps the step. Unset: the cluster's "
        "default (30).",
    )

    @model_validator(mode="after")
    def _no_reserved_keys(self) -> PodOverrides:
        if any(k.startswith(RESERVED_PREFIX) for k in [*self.labels, *self.annotations]):
            raise ValueError(MSG_RESERVED)
        # The CRD cannot check map keys cheaply (a CEL regex over unbounded keys fails the apiserver's
        # cost check); the apiserver refuses such a pod later (the run shows Created=False).
        bad = sorted(
            k for k in [*self.labels, *self.annotations, *self.node_selector] if not re.fullmatch(QUALIFIED_NAME, k)
        )
        if bad:
            raise ValueError(
                f"podTemplate label, annotation and nodeSelector keys must be qualified names (an "
                "optional DNS prefix and '/', then up to 63 letters, digits, '-', '_' and '.', starting "
                f"and ending with a letter or digit), got {bad[:5]}"
            )
        return self
