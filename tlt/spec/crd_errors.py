"""The apiserver's answers to an invalid custom resource: field errors and the `Status` body.

Used by `tlt.spec.crd_validate` (which finds the errors) and by the operator tests' fake API server
(which answers with them); the wording, reasons and codes are kube-apiserver's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_REASONS = {
    "Required value": "FieldValueRequired",
    "Unsupported value": "FieldValueNotSupported",
    "Too long": "FieldValueTooLong",
    "Too many": "FieldValueTooMany",
    "Invalid value": "FieldValueInvalid",
    "Duplicate value": "FieldValueDuplicate",
}
# Schema errors after which the apiserver evaluates no CEL rule at all (it says so instead).
BLOCKING_REASONS = {
    "FieldValueRequired",
    "FieldValueNotSupported",
    "FieldValueTooLong",
    "FieldValueTooMany",
    "FieldValueTypeInvalid",
}


@dataclass(frozen=True)
class FieldError:
    """One apiserver field error: `field` like `spec.speculative.arms[0].kind`, `kind` like
    `Invalid value`, `detail` the rest (a rule's message, after the value when it is a scalar)."""

    field: str
    kind: str
    detail: str = ""
    type_invalid: bool = False

    @property
    def reason(self) -> str:
        """The `StatusCause` reason, e.g. `FieldValueInvalid`."""
        return "FieldValueTypeInvalid" if self.type_invalid else _REASONS.get(self.kind, "FieldValueInvalid")

    @property
    def body(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


@dataclass
class Validation:
    """Outcome of validating one object: the defaulted, pruned object and what was wrong."""

    object: dict[str, Any]
    errors: list[FieldError] = field(default_factory=list)
    unknown_fields: list[str] = field(default_factory=list)
    strict: bool = False
    kind: str = ""
    group: str = ""
    version: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors and not (self.strict and self.unknown_fields)

    @property
    def warnings(self) -> list[str]:
        """Warnings a non-strict request gets (the apiserver's `Warning` headers)."""
        return [] if self.strict else [f'unknown field "{p}"' for p in self.unknown_fields]

    def messages(self) -> list[str]:
        """Every problem as one line, field path first."""
        unknown = [f'unknown field "{p}"' for p in self.unknown_fields] if self.strict else []
        return unknown + [str(e) for e in self.errors]

    def status(self, name: str) -> dict[str, Any] | None:
        """The `Status` body the apiserver answers a failed create/update of `name` with; None when valid."""
        kind, group, version = self.kind, self.group, self.version
        if self.strict and self.unknown_fields:
            unknown = ", ".join(f'unknown field "{p}"' for p in self.unknown_fields)
            return _status(
                400,
                "BadRequest",
                f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {unknown}',
            )
        if not self.errors:
            return None
        listed = str(self.errors[0]) if len(self.errors) == 1 else "[" + ", ".join(map(str, self.errors)) + "]"
        causes = [{"reason": e.reason, "message": e.body, "field": e.field} for e in self.errors]
        details = {"name": name, "group": group, "kind": kind, "causes": causes}
        return _status(422, "Invalid", f'{kind}.{group} "{name}" is invalid: {listed}', details)


def _status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body
