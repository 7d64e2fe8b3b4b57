"""CRD validation for the fake: `tlt.spec.crd_validate` does what the apiserver does (prune, default,
structural schema, CEL), so the fake stores what a real server would and rejects what it would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tlt.spec.crd_validate import CRDValidator

from .resources import Validator


def crd_validator(crd: Mapping[str, Any]) -> Validator:
    """A store validator for the served version of `crd`: unknown fields are pruned (the API's
    default) or, for `fieldValidation=Strict` requests (kubectl's default), refused with 400."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
        return lambda obj, old, strict: (obj, None)  # schemaless (e.g. the PodGroup CRDs in the tests)
    validator = CRDValidator(dict(crd))

    def validate(
        obj: dict[str, Any], old: dict[str, Any] | None, strict: bool
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        result = validator.validate(obj, old, strict=strict)
        stored = {**result.object, "apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": obj["metadata"]}
        return stored, result.status(obj.get("metadata", {}).get("name", ""))

    return validate
