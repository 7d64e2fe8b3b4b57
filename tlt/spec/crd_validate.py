"""Validate a custom resource against its CRD the way kube-apiserver does, without one.

Order as in the apiserver: unknown fields are found (an error under `kubectl`'s default strict
field validation: 400 BadRequest; otherwise pruned with a warning), schema defaults are applied
(nested ones only under a present parent), then the `openAPIV3Schema` is checked with
`jsonschema` (Draft 4 semantics, after translating `nullable` and dropping `x-kubernetes-*`)
and every `x-kubernetes-validations` CEL rule is evaluated with `cel-python` (`oldSelf` rules
only on update, where the old object has the field; none at all after a "blocking" schema
error: required, enum, type, maxLength, maxItems, as the apiserver does); duplicates in
`x-kubernetes-list-type` map lists and sets are reported. Errors read like the
apiserver's, e.g. `spec.drafter: Invalid value: drafter.minTrainers must be <= drafter.maxTrainers`,
and `Validation.status()` gives the `Status` body a real apiserver answers with (422 / 400).

Simplifications: null values are treated as absent inside CEL; transition rules are not
correlated through list items; only the `date-time` format is checked.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from typing import Any

import celpy
import jsonschema
from celpy import celtypes

from tlt.spec.crd_errors import BLOCKING_REASONS as _BLOCKING
from tlt.spec.crd_errors import FieldError, Validation

_MISSING = object()
CEL_SKIPPED = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {dict: "object", list: "array", str: "string", type(None): "null"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """A value as the apiserver prints it in `Invalid value: ...` (scalars as JSON, else the type)."""
    if isinstance(value, (dict, list)):
        return json.dumps(_json_type(value))
    return json.dumps(value)


def _draft4(node: dict[str, Any]) -> dict[str, Any]:
    """A structural schema node as plain JSON Schema draft 4 (the k8s extensions translated)."""
    out = {
        k: v
        for k, v in node.items()
        if not k.startswith("x-kubernetes-") and k not in ("nullable", "default", "description")
    }
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in node:
        out["properties"] = {k: _draft4(v) for k, v in node["properties"].items()}
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _draft4(node["additionalProperties"])
    if "items" in node:
        out["items"] = _draft4(node["items"])
    return out


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())

    @checker.checks("date-time")
    def _date_time(value: object) -> bool:
        return not isinstance(value, str) or bool(_RFC3339.match(value))

    return checker


def _child(node: dict[str, Any], key: Any) -> tuple[dict[str, Any] | None, str]:
    """The schema of `key` under `node` and its path suffix (`.name`, `[0]`, `[mapKey]`)."""
    if isinstance(key, int):
        return node.get("items"), f"[{key}]"
    if key in node.get("properties", {}):
        return node["properties"][key], f".{key}"
    extra = node.get("additionalProperties")
    return (extra if isinstance(extra, dict) else None), f".{key}"  # the apiserver names map keys with a dot


def _path(root: dict[str, Any], keys: Any) -> str:
    node: dict[str, Any] | None = root
    out = ""
    for key in keys:
        if node is None:
            out += f"[{key}]" if isinstance(key, int) else f".{key}"
            continue
        node, suffix = _child(node, key)
        out += suffix
    return out.lstrip(".")


def _prune(node: dict[str, Any], value: Any, path: str, unknown: list[str]) -> None:
    """Drop fields the schema does not declare (recording their paths); the root's metadata is the
    apiserver's own business and is left alone."""
    if isinstance(value, dict) and node.get("type") == "object":
        props = node.get("properties")
        extra = node.get("additionalProperties")
        for key in list(value):
            sub = f"{path}.{key}" if path else key
            if props is not None and key in props:
                if sub != "metadata":
                    _prune(props[key], value[key], sub, unknown)
            elif isinstance(extra, dict):
                _prune(extra, value[key], f"{path}.{key}", unknown)
            elif sub != "metadata":
                unknown.append(sub)
                del value[key]
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            _prune(node["items"], item, f"{path}[{i}]", unknown)


def _default(node: dict[str, Any], value: Any) -> None:
    """Apply schema defaults in place, top down (a default creates the parent its children's defaults need)."""
    if isinstance(value, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key in value and value[key] is None and not sub.get("nullable") and "default" in sub:
                del value[key]
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(sub, value[key])
    elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        for item in value.values():
            _default(node["additionalProperties"], item)
    elif isinstance(value, list) and "items" in node:
        for item in value:
            _default(node["items"], item)


def _list_errors(node: dict[str, Any], value: Any, path: str) -> list[FieldError]:
    """Duplicates in `x-kubernetes-list-type` map lists (by their keys) and sets, as the apiserver finds them."""
    out: list[FieldError] = []
    if isinstance(value, list):
        kind = node.get("x-kubernetes-list-type")
        keys = node.get("x-kubernetes-list-map-keys", [])
        seen: list[Any] = []
        for i, item in enumerate(value):
            ident = {k: item.get(k) for k in keys} if kind == "map" and isinstance(item, dict) else item
            if kind in ("map", "set") and ident in seen:
                out.append(FieldError(f"{path}[{i}]", "Duplicate value", json.dumps(ident)))
            seen.append(ident)
            out.extend(_list_errors(node.get("items", {}), item, f"{path}[{i}]"))
    elif isinstance(value, dict):
        for key, item in value.items():
            sub, suffix = _child(node, key)
            if sub is not None:
                out.extend(_list_errors(sub, item, (path + suffix).lstrip(".")))
    return out


def _is_sorted(items: celtypes.ListType) -> celtypes.BoolType:
    """Kubernetes' CEL list library `isSorted()`: elements in non-decreasing order."""
    return celtypes.BoolType(all(a <= b for a, b in zip(items, items[1:])))


_ENV = celpy.Environment()
_FUNCTIONS = {"isSorted": _is_sorted}


@cache
def _program(rule: str) -> celpy.Runner:
    return _ENV.program(_ENV.compile(rule), functions=_FUNCTIONS)


def without_nulls(value: Any) -> Any:
    """`value` without null fields: CEL sees a null as absent (`has()` false)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _to_cel(value: Any) -> Any:
    return celpy.json_to_cel(without_nulls(value))


def _cel(node: dict[str, Any], value: Any, old: Any, path: str, out: list[FieldError]) -> None:
    """Evaluate every CEL rule at and below `node` (`oldSelf` rules only where `old` has the field)."""
    if value is None:
        return
    for rule in node.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"] and old is _MISSING:
            continue
        variables = {"self": _to_cel(value)}
        if old is not _MISSING:
            variables["oldSelf"] = _to_cel(old)
        try:
            result = _program(rule["rule"]).evaluate(variables)
        except celpy.CELEvalError as exc:
            result = exc
        if isinstance(result, celpy.CELEvalError):
            out.append(FieldError(path, "Invalid value", f"{_show(value)}: {result} evaluating rule: {rule['rule']}"))
        elif not result:
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            where = path + rule["fieldPath"] if rule.get("fieldPath") else path  # the apiserver reports there
            # kube-apiserver 1.36 shows a scalar's value before the message and nothing for an object or list.
            shown = "" if isinstance(value, (dict, list)) else f"{json.dumps(value)}: "
            out.append(FieldError(where.lstrip("."), "Invalid value", f"{shown}{message}"))
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        for key, item in value.items():
            sub, suffix = (props[key], f".{key}") if key in props else (extra, f".{key}")
            if isinstance(sub, dict):
                prev = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                _cel(sub, item, prev, (path + suffix).lstrip("."), out)
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            _cel(node["items"], item, _MISSING, f"{path}[{i}]", out)


def _go_number(value: Any) -> str:
    """A bound as Go's `%v` prints a float64: `1`, not `1.0`."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def _schema_error(root: dict[str, Any], err: jsonschema.ValidationError) -> list[FieldError]:
    keys = list(err.absolute_path)
    path = _path(root, keys)
    value = err.instance
    limit = err.validator_value
    where = f"{path} in body"
    match err.validator:
        case "required":
            prefix = f"{path}." if path else ""
            return [FieldError(f"{prefix}{name}", "Required value") for name in limit if name not in value]
        case "type":
            want = limit[0] if isinstance(limit, list) else limit
            shown = json.dumps(_json_type(value))
            return [FieldError(path, "Invalid value", f"{shown}: {where} must be of type {want}: {shown}", True)]
        case "enum":
            allowed = ", ".join(json.dumps(v) for v in limit if v is not None)
            return [FieldError(path, "Unsupported value", f"{_show(value)}: supported values: {allowed}")]
        case "minimum" | "maximum":
            schema = err.schema
            exclusive = schema.get("exclusiveMinimum" if err.validator == "minimum" else "exclusiveMaximum")
            side = "greater" if err.validator == "minimum" else "less"
            limit = _go_number(limit)
            bound = f"{side} than {limit}" if exclusive else f"{side} than or equal to {limit}"
            return [FieldError(path, "Invalid value", f"{_show(value)}: {where} should be {bound}")]
        case "maxLength":
            return [FieldError(path, "Too long", f"may not be more than {limit} bytes")]
        case "minLength":
            return [FieldError(path, "Invalid value", f"{_show(value)}: {where} should be at least {limit} chars long")]
        case "pattern":
            return [FieldError(path, "Invalid value", f"{_show(value)}: {where} should match '{limit}'")]
        case "maxItems" | "maxProperties":
            return [FieldError(path, "Too many", f"{len(value)}: must have at most {limit} items")]
        case "minItems" | "minProperties":
            return [FieldError(path, "Invalid value", f"{len(value)}: {where} should have at least {limit} items")]
        case "format":
            shown = _show(value)
            return [FieldError(path, "Invalid value", f"{shown}: {where} must be of type {limit}: {shown}")]
    return [FieldError(path, "Invalid value", f"{_show(value)}: {err.message}")]


def _metadata_errors(meta: Any) -> list[FieldError]:
    """The apiserver's own checks of a custom resource's name (the schema says nothing about metadata)."""
    if not isinstance(meta, dict):
        return [FieldError("metadata.name", "Required value", "name or generateName is required")]
    name = meta.get("name")
    if not name:
        if meta.get("generateName"):
            return []
        return [FieldError("metadata.name", "Required value", "name or generateName is required")]
    if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        return [FieldError("metadata.name", "Invalid value", f"{_show(name)}: {DNS_SUBDOMAIN_MSG}")]
    return []


class CRDValidator:
    """Validates objects of one version of a CRD (its `openAPIV3Schema` and CEL rules)."""

    def __init__(self, crd: dict[str, Any], version: str | None = None):
        versions = crd["spec"]["versions"]
        chosen = next((v for v in versions if version in (None, v["name"])), None)
        if chosen is None:
            raise ValueError(f"version {version!r} not in the CRD; it has {[v['name'] for v in versions]}")
        self.schema: dict[str, Any] = chosen["schema"]["openAPIV3Schema"]
        self.kind: str = crd["spec"]["names"]["kind"]
        self.group: str = crd["spec"]["group"]
        self.version: str = chosen["name"]
        self._validator = jsonschema.Draft4Validator(_draft4(self.schema), format_checker=_format_checker())

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None = None, *, strict: bool = False) -> Validation:
        """Prune, default and validate `obj` (an update when `old` is given). `strict` is `kubectl`'s
        default field validation: unknown fields are errors rather than pruned with a warning."""
        new = copy.deepcopy(obj)
        unknown: list[str] = []
        _prune(self.schema, new, "", unknown)
        _default(self.schema, new)
        errors = _metadata_errors(new.get("metadata"))
        for err in sorted(self._validator.iter_errors(new), key=lambda e: list(map(str, e.absolute_path))):
            errors.extend(_schema_error(self.schema, err))
        errors.extend(_list_errors(self.schema, new, ""))
        prev: Any = _MISSING
        if old is not None:
            prev = copy.deepcopy(old)
            _prune(self.schema, prev, "", [])
            _default(self.schema, prev)
        if any(e.reason in _BLOCKING for e in errors):
            errors.append(FieldError("<nil>", "Invalid value", f"null: {CEL_SKIPPED}"))
        else:
            _cel(self.schema, new, prev, "", errors)
        return Validation(new, errors, unknown, strict, self.kind, self.group, self.version)


@cache
def default_validator() -> CRDValidator:
    """The validator of the `TLTTrainingRun` CRD this package generates."""
    from tlt.spec.crd import build_crd

    return CRDValidator(build_crd())


def validate_run(obj: dict[str, Any], old: dict[str, Any] | None = None, *, strict: bool = True) -> Validation:
    """Validate a `TLTTrainingRun` manifest as `kubectl apply` (strict) would have the apiserver do."""
    return default_validator().validate(obj, old, strict=strict)
