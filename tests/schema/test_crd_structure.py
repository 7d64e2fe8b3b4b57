"""The generated CRD: committed file up to date, structural schema, bounded for CEL, defaults
equal to pydantic's, subresources and printer columns pointing at real fields."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from tlt.spec import run as config
from tlt.spec.crd import CEL_RULES, CRD_FILE, build_crd, build_schema, crd_yaml
from tlt.spec.crd_validate import CRDValidator
from tlt.spec.run import RunSpec

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"$ref", "$defs", "definitions", "anyOf", "oneOf", "allOf", "not", "title", "const"}
BOUNDED_FORMATS = {"date-time"}


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path (`.prop`, `[]` for items, `{}` for map values)."""
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{key}")
    if "items" in node:
        yield from nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}{{}}")


def unbounded(node: dict[str, Any]) -> str | None:
    """Why a node would make CEL's cost estimate unbounded, or None."""
    kind = node["type"]
    bounded_string = "maxLength" in node or "enum" in node or node.get("format") in BOUNDED_FORMATS
    if kind == "string" and not bounded_string:
        return "string without maxLength"
    if kind == "array" and "maxItems" not in node:
        return "array without maxItems"
    if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
        return "map without maxProperties"
    return None


def test_committed_crd_matches_generator():
    committed = (ROOT / CRD_FILE).read_text()
    assert committed == crd_yaml(), f"{CRD_FILE} is stale: run `make crds` and commit the result"


def test_crd_yaml_is_small_enough_for_client_side_apply():
    size = len(crd_yaml().encode())
    print(f"CRD YAML size: {size} bytes ({size / 1024:.1f} KiB)")
    assert size < 200 * 1024, "the CRD must stay under 200 KiB (256 KiB last-applied annotation limit)"


def test_schema_is_structural():
    problems = []
    for path, node in nodes(build_schema()):
        if FORBIDDEN & node.keys():
            problems.append(f"{path}: has {sorted(FORBIDDEN & node.keys())}")
        if "type" not in node:
            problems.append(f"{path}: no type")
        extra = node.get("additionalProperties")
        if extra is not None and (not isinstance(extra, dict) or "properties" in node):
            problems.append(f"{path}: additionalProperties only as a map value schema")
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if key in node and not isinstance(node[key], bool):
                problems.append(f"{path}: {key} must be a boolean (OpenAPI 3.0)")
        if "default" in node and node["default"] is None:
            problems.append(f"{path}: default null")
    assert not problems, "\n".join(problems)


def test_every_spec_and_status_string_list_and_map_is_bounded():
    props = build_schema()["properties"]
    found = [(f"{top}{p}", n) for top in ("spec", "status") for p, n in nodes(props[top])]
    problems = [f"{p}: {why}" for p, n in found if (why := unbounded(n))]
    assert not problems, "\n".join(problems)


def test_cel_rules_touch_only_bounded_fields():
    spec = build_schema()["properties"]["spec"]
    for path, rules in CEL_RULES.items():
        node = spec
        for key in path:
            node = node["items"] if key == "[]" else node["properties"][key]
        for rule in rules:
            names = set(re.findall(r"\bself\.(\w+)", rule["rule"]))
            touched = [node["properties"][n] for n in names] or [node]
            for sub in touched:
                assert unbounded(sub) is None, f"rule {rule['rule']!r} at spec.{'.'.join(path)} touches {sub}"


def test_every_spec_field_is_described():
    spec = build_schema()["properties"]["spec"]
    missing = [p for p, n in nodes(spec) if "description" not in n and not p.endswith(("[]", "{}"))]
    assert not missing, f"fields without a description: {missing}"


def _models_with_validators(model: type[BaseModel], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    if model.__pydantic_decorators__.model_validators:
        yield path
    for name, info in model.model_fields.items():
        sub, key = info.annotation, info.alias or name
        if get_origin(sub) is list:
            sub, key = get_args(sub)[0], f"{key}/[]"
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            yield from _models_with_validators(sub, (*path, *key.split("/")))


def test_every_pydantic_cross_field_validator_has_cel_rules():
    with_validators = set(_models_with_validators(RunSpec, ()))
    assert {("dataset",), ("speculative",), ("drafter",), ("rollout", "podTemplate", "env", "[]")} <= with_validators
    missing = with_validators - CEL_RULES.keys()
    assert not missing, f"pydantic validators without CEL rules at {missing}"


def test_managed_by_has_transition_rule():
    node = build_schema()["properties"]["spec"]["properties"]["managedBy"]
    assert {"rule": "self == oldSelf", "message": "managedBy is immutable"} in node["x-kubernetes-validations"]


def _drop_empty(value: Any) -> Any:
    if isinstance(value, dict):
        pruned = {k: _drop_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


def test_crd_defaults_equal_pydantic_defaults():
    defaulted = CRDValidator(build_crd()).validate({"metadata": {"name": "r"}})
    assert defaulted.ok, defaulted.messages()
    expected = RunSpec().model_dump(mode="json", by_alias=True)
    assert _drop_empty(defaulted.object["spec"]) == _drop_empty(expected)


def test_nested_defaults_apply_under_a_partly_set_parent():
    spec = {"drafter": {"minTrainers": 2}, "speculative": {"arms": [{"kind": "tree"}]}}
    run = {"metadata": {"name": "r"}, "spec": spec}
    out = CRDValidator(build_crd()).validate(run)
    assert out.ok, out.messages()
    assert out.object["spec"]["drafter"]["maxTrainers"] == config.DrafterSpec().max_trainers
    assert out.object["spec"]["speculative"]["arms"] == [{"kind": "tree", "depth": 4, "topk": 1, "verifyTokens": 0}]
    assert out.object["spec"]["policy"]["resources"]["memory"] == "4Gi"


def _has_path(schema: dict[str, Any], json_path: str) -> bool:
    """Whether `json_path` names a field of `schema`; a list filter (`conditions[?(@.type=="X")]`) steps into
    the list's items."""
    node = schema
    for key in re.sub(r"\[\?\(@\.[a-z]+==\"[A-Za-z]+\"\)\]", "[]", json_path).strip(".").split("."):
        key, into_items = key.removesuffix("[]"), key.endswith("[]")
        if key not in node.get("properties", {}):
            return False
        node = node["properties"][key]
        if into_items:
            node = node["items"]
    return True


def test_names_scope_and_subresources():
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "tltrainingruns.tlt.dev"
    assert spec["group"] == "tlt.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == "tltrainingruns"
    assert spec["names"]["shortNames"] == ["tltrun"] and spec["names"]["categories"] == ["tlt"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    scale = version["subresources"]["scale"]
    assert version["subresources"]["status"] == {}
    assert scale == {
        "specReplicasPath": ".spec.rollout.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    schema = build_schema()
    for path in scale.values():
        assert _has_path(schema, path), f"scale path {path} not in the schema"


def test_printer_columns_point_at_schema_fields():
    (version,) = build_crd()["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns] == [
        "Phase",
        "Step",
        "Rollout Ready",
        "Trainers Active",
        "Slots",
        "Idle GPU-s",
        "Harvested GPU-s",
        "Accept Length",
        "Mode",
        "Off-Policy",
        "Drafter",
        "Served",
        "Drafter Healthy",
        "Age",
    ]
    wide = {"Mode", "Off-Policy", "Drafter", "Served", "Drafter Healthy"}
    assert {c["name"] for c in columns if c.get("priority") == 1} >= wide, "shown with -o wide"
    schema = build_schema()
    for column in columns:
        if column["jsonPath"] != ".metadata.creationTimestamp":
            assert _has_path(schema, column["jsonPath"]), f"column {column['name']}: {column['jsonPath']} missing"


def test_conditions_are_a_map_list_keyed_by_type():
    node = build_schema()["properties"]["status"]["properties"]["conditions"]
    assert node["x-kubernetes-list-type"] == "map" and node["x-kubernetes-list-map-keys"] == ["type"]
    assert set(node["items"]["required"]) == {"type", "status", "lastTransitionTime", "reason", "message"}


def _unknown_keys(value: Any, type_name: str, path: str) -> Iterator[str]:
    """Keys the Kubernetes API types do not have, walking `value` as `type_name` (client model names)."""
    models = pytest.importorskip("kubernetes.client")
    if type_name.startswith("list["):
        for i, item in enumerate(value):
            yield from _unknown_keys(item, type_name[5:-1], f"{path}[{i}]")
        return
    if type_name.startswith("dict(str, "):
        for key, item in value.items():
            yield from _unknown_keys(item, type_name[10:-1], f"{path}.{key}")
        return
    model = getattr(models, type_name, None)
    if model is None or not isinstance(value, dict):
        return
    by_wire = {wire: attr for attr, wire in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_wire:
            yield f"{path}.{key}"
            continue
        sub_type = model.openapi_types[by_wire[key]]
        if type_name == "V1JSONSchemaProps" and key == "additionalProperties":
            sub_type = "V1JSONSchemaProps"
        yield from _unknown_keys(item, sub_type, f"{path}.{key}")


def test_crd_uses_only_fields_the_kubernetes_api_has():
    unknown = list(_unknown_keys(build_crd(), "V1CustomResourceDefinition", ""))
    assert not unknown, f"not apiextensions.k8s.io/v1 fields: {unknown}"
