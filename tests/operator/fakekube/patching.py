"""Patch documents as the apiserver applies them: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).

Strategic merge patch is applied as a JSON merge patch: the fake has no per-field patch
strategies (list merge keys), so strategic patches of lists replace the list. The operator and
kopf send only merge and JSON patches.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A patch that cannot be applied; `test_failed` marks a failed JSON-patch `test` operation."""

    def __init__(self, message: str, *, test_failed: bool = False) -> None:
        super().__init__(message)
        self.test_failed = test_failed


def merge_patch(target: Any, patch: Any) -> Any:
    """Return `target` with the RFC 7386 merge patch applied (inputs are not modified)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(parent):
            raise PatchError(f"index {last!r} out of range in {path!r}")
        parent.insert(index, value)
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    _get(doc, path)
    parent = _parent(doc, parts, path)
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        del parent[int(parts[-1])]
    return doc


def json_patch(target: Any, operations: list[dict[str, Any]]) -> Any:
    """Return `target` with the RFC 6902 operations applied, all or nothing."""
    doc = copy.deepcopy(target)
    for op in operations:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"test operation at {path!r} failed", test_failed=True)
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        else:
            raise PatchError(f"unknown JSON-patch op {kind!r}")
    return doc
