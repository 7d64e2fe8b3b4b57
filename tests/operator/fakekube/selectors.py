"""Label and field selectors with the apiserver's grammar (equality- and set-based)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Requirement = Callable[[Mapping[str, str]], bool]

_SET = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split(selector: str) -> list[str]:
    """Split at commas that are not inside parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _requirement(term: str) -> Requirement:
    match = _SET.match(term)
    if match:
        key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for op in ("!=", "==", "="):
        if op in term:
            key, value = (s.strip() for s in term.split(op, 1))
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: term in labels


def parse(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """Compile a label selector string; an empty selector matches everything."""
    requirements = [_requirement(term) for term in _split(selector or "")]
    return lambda labels: all(req(labels) for req in requirements)


def field_values(obj: Mapping[str, Any]) -> dict[str, str]:
    """The fields a field selector may name (the common subset every resource supports)."""
    meta = obj.get("metadata", {})
    values = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", "")}
    if "phase" in obj.get("status", {}):
        values["status.phase"] = obj["status"]["phase"]
    return values
