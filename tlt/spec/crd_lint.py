"""Checks kube-apiserver makes of a CRD itself when it is created, which a structural-schema check misses.

The CEL here is Google's own (`cel-expr-python`, the cel-cpp runtime), whose parser is the grammar
cel-go and so the apiserver use: a rule it cannot compile, the apiserver refuses too (`cel-python`,
which `tlt.spec.crd_validate` evaluates with, accepts unknown string escapes such as `'\\.'`). Three checks:

- every `x-kubernetes-validations` rule compiles (with the Kubernetes list library functions the
  project's rules use declared: `isSorted`);
- every `fieldPath` names a field declared under the rule's node (`.a.b`, `['a']`);
- every schema `default` passes the rules at and below its node, evaluated on the default AS
  WRITTEN (transition rules with `oldSelf` = the default too): the apiserver checks `default: {}`
  before nested defaults fill it, so a rule that reads a key without `has()` fails with "no such key".

`evaluate(schema, obj)` also runs every rule of an object (transition rules with `oldSelf = self`) with
the same engine, so samples are checked by a second, maintained CEL implementation.

What this cannot check: the apiserver's CEL cost estimate (bounded by `maxLength` / `maxItems`, which
tests/schema checks separately), type-checking against the schema's declared types (variables are
`dyn`, so a type mismatch shows only when a rule runs on a value), and Kubernetes' CEL libraries
beyond the functions declared here (an undeclared one is reported as a compile error, not missed).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from typing import Any

from tlt.spec.crd_validate import without_nulls as _without_nulls

_FIELD_PATH = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\['([^']+)'\]")


def _engine() -> Any:
    try:
        from cel_expr_python import cel
    except ImportError as exc:  # a test extra: `pip install -e '.[test]'`
        raise RuntimeError("the CRD lint needs cel-expr-python (pip install 'cel-expr-python>=0.1.3')") from exc
    return cel


def _is_sorted(items: list[Any]) -> bool:
    return all(a <= b for a, b in zip(items, items[1:]))


@cache
def _env() -> Any:
    cel = _engine()
    is_sorted = cel.FunctionDecl(
        "isSorted",
        [
            cel.Overload(
                "list_is_sorted",
                return_type=cel.Type.BOOL,
                parameters=[cel.Type.List(cel.Type.DYN)],
                is_member=True,
                impl=_is_sorted,
            )
        ],
    )
    return cel.NewEnv(variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN}, functions=[is_sorted])


@cache
def _compiled(rule: str) -> Any:
    return _env().compile(rule)


def compile_error(rule: str) -> str | None:
    """The compiler's message for `rule`, or None when it compiles."""
    try:
        _compiled(rule)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


def run_rule(rule: str, value: Any, old: Any = None) -> bool | str:
    """`rule` on `self = value` (and `oldSelf = old` for a transition rule): its result, or the error text."""
    data = {"self": _without_nulls(value)}
    if "oldSelf" in rule:
        data["oldSelf"] = _without_nulls(value if old is None else old)
    result = _compiled(rule).eval(data=data)
    if result.type() == _engine().Type.ERROR:
        return str(result.value())
    return bool(result.value())


def _nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path as the apiserver names it (`properties[spec].properties[x]`)."""
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.properties[{key}]")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}.items")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}.additionalProperties")


def _field_path_ok(node: dict[str, Any], field_path: str) -> bool:
    pos = 0
    while pos < len(field_path):
        match = _FIELD_PATH.match(field_path, pos)
        if not match:
            return False
        key = match.group(1) or match.group(2)
        props = node.get("properties", {})
        if key in props:
            node = props[key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return False
        pos = match.end()
    return bool(field_path)


def _rule_failures(node: dict[str, Any], value: Any, old: Any, where: str, transitions: bool) -> Iterator[str]:
    """Failures of every rule at and below `node` on `value` (transition rules only when `transitions`)."""
    if value is None:
        return
    for rule in node.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"] and not transitions:
            continue
        if compile_error(rule["rule"]) is not None:
            continue  # reported by the compile check
        result = run_rule(rule["rule"], value, old)
        if result is not True:
            why = result if isinstance(result, str) else rule.get("message") or f"failed rule: {rule['rule']}"
            yield f"{where + ': ' if where else ''}{why} evaluating rule: {rule['rule']}"
    if isinstance(value, dict):
        for key, item in value.items():
            sub = node.get("properties", {}).get(key, node.get("additionalProperties"))
            if isinstance(sub, dict):
                prev = old.get(key) if isinstance(old, dict) else None
                yield from _rule_failures(sub, item, prev, f"{where}.{key}".lstrip("."), transitions)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            yield from _rule_failures(node["items"], item, None, f"{where}[{i}]", transitions)


def schema_problems(schema: dict[str, Any], where: str = "openAPIV3Schema") -> list[str]:
    """What the apiserver would refuse in one version's `openAPIV3Schema`, one line each."""
    problems: list[str] = []
    for path, node in _nodes(schema, where):
        for i, rule in enumerate(node.get("x-kubernetes-validations", [])):
            at = f"{path}.x-kubernetes-validations[{i}]"
            error = compile_error(rule["rule"])
            if error is not None:
                problems.append(f"{at}.rule: compilation failed: {error}")
            field_path = rule.get("fieldPath")
            if field_path is not None and not _field_path_ok(node, field_path):
                problems.append(f"{at}.fieldPath: {field_path!r} must be a valid path (a field declared here)")
        if "default" in node:
            problems += [
                f"{path}.default: {failure}"
                for failure in _rule_failures(node, node["default"], node["default"], "", transitions=True)
            ]
    return problems


def crd_problems(crd: dict[str, Any]) -> list[str]:
    """`schema_problems` of every version of `crd`."""
    out: list[str] = []
    for version in crd["spec"]["versions"]:
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema:
            out += schema_problems(schema, f"spec.versions[{version['name']}].schema.openAPIV3Schema")
    return out


def evaluate(schema: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """Every rule of `schema` on `obj` (defaults already applied), transition rules against an unchanged
    object: the failures, one line each."""
    return list(_rule_failures(schema, obj, obj, "", transitions=True))
