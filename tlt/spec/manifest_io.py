"""Reading a run file: a full `TLTTrainingRun` manifest or a bare spec, with every error listed."""

from __future__ import annotations

import difflib
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tlt.spec.base import PathStr, Quantity
from tlt.spec.pod_template import EnvName
from tlt.spec.run import (
    IMAGE_PATTERN,
    KIND,
    RUN_NAME_PATTERN,
    LabelValue,
    Name,
    PromLabel,
    PromMetric,
    QualifiedName,
    TLTTrainingRun,
)


def _pattern(annotated: Any) -> str:
    """The regex of a constrained `Annotated[str, Field(pattern=...)]` type."""
    return next(m.pattern for info in annotated.__metadata__ for m in info.metadata if getattr(m, "pattern", None))


# What each shared pattern means, in words (an error shows both).
PATTERN_WORDS = {
    _pattern(Name): "a DNS name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
    _pattern(LabelValue): "a label value: empty or up to 63 letters, digits, '-', '_' and '.', starting and ending "
    "with a letter or digit",
    _pattern(QualifiedName): "a qualified name: an optional DNS prefix and '/', then up to 63 letters, digits, '-', "
    "'_' and '.', starting and ending with a letter or digit",
    _pattern(Quantity): "a quantity: a number with an optional suffix m, k, M, G, T, Ki, Mi, Gi or Ti (e.g. 4Gi, 500m)",
    _pattern(PromMetric): "a Prometheus metric name: letters, digits, '_' and ':', not starting with a digit",
    _pattern(PromLabel): "a Prometheus label name: letters, digits and '_', not starting with a digit",
    _pattern(PathStr): "a path without control characters (no newline, tab or NUL)",
    _pattern(EnvName): "an environment variable name: letters, digits, '-', '_' and '.', not starting with a digit, "
    "and not '.', '..' or starting with '..'",
    IMAGE_PATTERN: "an image reference: [registry[:port]/]lowercase/path[:tag][@sha256:digest], no spaces",
    RUN_NAME_PATTERN: "a DNS-1035 label: lowercase letters, digits and '-', starting with a letter and ending with a "
    "letter or digit",
}


# libyaml's parser where PyYAML was built with it (much faster on a large manifest), else the pure-Python one.
_SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_OBJECT_BYTES = 3 * 2**20 // 2  # etcd's default request limit: the API server stores no larger object
MAX_ANNOTATION_BYTES = 256 * 2**10  # the API server's limit on all of an object's annotations together


class _Loader(_SafeLoader):  # type: ignore[misc, valid-type]
    """YAML 1.2 floats, as kubectl reads them: `1e-5` is a number, not the string PyYAML 1.1 makes; a key
    given twice in one mapping is an error (kubectl's strict decoding), not the last one winning; merge
    keys (`<<: *anchor`) are merged as kubectl does, keys written beside them winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            # A plain key is compared as written (constructing each key twice doubles a large file's load time).
            scalar = isinstance(key_node, yaml.ScalarNode) and key_node.tag == "tag:yaml.org,2002:str"
            key = key_node.value if scalar else self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$|^[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?$"),
    list("-+0123456789."),
)


def read_yaml(text: str) -> Any:
    """Parse YAML with kubectl's number rules."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


class SpecError(ValueError):
    """A run file that does not validate; `errors` holds one line per problem, field path first."""

    def __init__(self, source: str, errors: list[str]):
        self.errors = errors
        super().__init__(f"{source}: {len(errors)} error(s)\n" + "\n".join(f"  {e}" for e in errors))


@cache
def _field_names() -> tuple[str, ...]:
    """Every field name of the manifest schema, camelCase (for "did you mean")."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(TLTTrainingRun.model_json_schema(by_alias=True))
    return tuple(sorted(names))


# The words YAML 1.1 (PyYAML, and kubectl's decoder) reads as booleans when they are not quoted.
YAML_BOOLEAN_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def _boolean_for_word(err: dict[str, Any]) -> str | None:
    """The message for a word field that got a boolean: `mode: off` unquoted is YAML's false, not 'off'."""
    value = err.get("input")
    if not isinstance(value, bool) or err["type"] not in ("literal_error", "string_type"):
        return None
    expected = err.get("ctx", {}).get("expected", "")
    word = next((w for w in YAML_BOOLEAN_WORDS[value] if f"'{w}'" in expected), None)
    fix = f'quote it: "{word}"' if word else "quote the word you meant"
    allowed = f"; allowed: {expected}" if expected else ""
    return (
        f"read as the boolean {str(value).lower()} (YAML reads unquoted on/off/yes/no/true/false as booleans); "
        f"{fix}{allowed}"
    )


def _format(err: dict[str, Any]) -> str:
    path = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
    msg = _boolean_for_word(err) or err["msg"].removeprefix("Value error, ")
    if err["type"] == "string_pattern_mismatch" and err["ctx"]["pattern"] in PATTERN_WORDS:
        msg = f"must be {PATTERN_WORDS[err['ctx']['pattern']]}, got {err['input']!r}"
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(err["loc"][-1]), _field_names(), n=1, cutoff=0.7)
        hint = f"did you mean {close[0]!r}?" if close else "check spelling; fields are camelCase"
        msg = f"unknown field ({hint})"
    return f"{path or 'top level'}: {msg}"


@cache
def _spec_schema() -> dict[str, Any]:
    from tlt.spec.crd import build_schema  # the CRD is generated from this module's models: import it late

    return build_schema()["properties"]["spec"]


def _too_many(node: dict[str, Any], value: Any, path: str) -> list[str]:
    """Lists longer than the CRD's `maxItems`, found without looking inside them (the API server refuses
    them as "Too many"; validating 40,000 list items first only to refuse the list costs seconds)."""
    if isinstance(value, list) and "items" in node:
        limit = node.get("maxItems")
        if limit is not None and len(value) > limit:
            return [f"{path}: Too many: {len(value)}: must have at most {limit} items"]
        return [e for i, item in enumerate(value) for e in _too_many(node["items"], item, f"{path}[{i}]")]
    if isinstance(value, dict) and "properties" in node:
        return [
            e
            for key, item in value.items()
            if key in node["properties"]
            for e in _too_many(node["properties"][key], item, f"{path}.{key}")
        ]
    return []


def parse_run(doc: Any, source: str = "<run>") -> TLTTrainingRun:
    """Validate a loaded YAML document (full manifest or bare spec) into a `TLTTrainingRun`."""
    if not isinstance(doc, dict):
        raise SpecError(source, [f"top level: expected a mapping, got {type(doc).__name__}"])
    full = "kind" in doc or "apiVersion" in doc or "spec" in doc
    if full and doc.get("kind", KIND) != KIND:
        raise SpecError(source, [f"kind: expected {KIND!r}, got {doc.get('kind')!r}"])
    meta = doc.get("metadata")
    if errors := _too_many(_spec_schema(), doc.get("spec") if full else doc, "spec"):
        raise SpecError(source, errors)
    manifest = "kind" in doc or "apiVersion" in doc  # what kubectl would send
    if manifest and not (isinstance(meta, dict) and (meta.get("name") or meta.get("generateName"))):
        raise SpecError(
            source,
            [
                "metadata.name: Required value: name or generateName is required (as the API "
                "server says; a spec without kind and apiVersion runs as 'tlt-run')"
            ],
        )
    try:
        if full:
            return TLTTrainingRun.model_validate(doc)
        return TLTTrainingRun.model_validate({"spec": doc})
    except ValidationError as exc:
        raise SpecError(source, [_format(e) for e in exc.errors()]) from None


def decode_manifest(raw: bytes, source: str) -> str:
    """The text of a manifest file, refused (one line, `SpecError`) where the API server would refuse it
    or it is not text: over MAX_OBJECT_BYTES, or not UTF-8 (the offset of the first bad byte)."""
    if len(raw) > MAX_OBJECT_BYTES:
        raise SpecError(
            source,
            [
                f"the file is {len(raw)} bytes; the API server stores objects of at most "
                f"{MAX_OBJECT_BYTES} bytes (1.5 MiB)"
            ],
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            source, [f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start} (save the file as UTF-8)"]
        ) from None


def _annotation_errors(doc: Any) -> list[str]:
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict):
        return []
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size <= MAX_ANNOTATION_BYTES:
        return []
    return [f"metadata.annotations: Too long: may not be more than {MAX_ANNOTATION_BYTES} bytes (got {size})"]


def load_run(path: str | Path) -> TLTTrainingRun:
    """Read and validate a run file; raises `SpecError` listing every problem with its field path."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(str(path), ["file not found"])
    text = decode_manifest(path.read_bytes(), str(path))
    try:
        doc = read_yaml(text)
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [f"not valid YAML: {exc}"]) from None
    if errors := _annotation_errors(doc):
        raise SpecError(str(path), errors)
    return parse_run(doc, str(path))
