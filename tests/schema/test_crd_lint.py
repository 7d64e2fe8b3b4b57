"""The CRD as kube-apiserver checks it at create time, with Google's CEL (cel-expr-python): every rule
compiles, every fieldPath is a declared field, every default passes its rules as written, and every
sample and example passes every rule (the guard that runs where no real API server does)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tlt.spec.crd import CEL_RULES, build_crd, build_schema, cel_string
from tlt.spec.crd_lint import compile_error, crd_problems, evaluate, run_rule, schema_problems
from tlt.spec.crd_validate import _default
from tlt.spec.run import FORBIDDEN_MOUNT, NON_CANONICAL, PARENT_SEGMENT, RUN_NAME_PATTERN

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted(
    p for p in [*ROOT.glob("examples/*.yaml"), *ROOT.glob("manifests/samples/*.yaml")] if p.name != "kustomization.yaml"
)


def _runs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "TLTTrainingRun"]


def test_generated_crd_has_nothing_the_apiserver_refuses():
    assert crd_problems(build_crd()) == []


@pytest.mark.parametrize("path", list(CEL_RULES), ids=lambda p: ".".join(p) or "spec")
def test_every_rule_compiles_with_googles_cel(path):
    for rule in CEL_RULES[path]:
        assert compile_error(rule["rule"]) is None, rule["rule"]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sample_passes_every_rule(manifest):
    schema = build_schema()
    runs = _runs(manifest)
    assert runs, f"{manifest} holds no TLTTrainingRun"
    for run in runs:
        obj = copy.deepcopy(run)
        _default(schema, obj)
        assert evaluate(schema, obj) == []


def test_an_unguarded_rule_under_an_empty_default_is_refused():
    schema = {
        "type": "object",
        "properties": {
            "drafter": {
                "type": "object",
                "default": {},
                "properties": {"a": {"type": "integer", "default": 1}, "b": {"type": "integer", "default": 2}},
                "x-kubernetes-validations": [{"rule": "self.a <= self.b", "message": "a <= b"}],
            }
        },
    }
    (problem,) = schema_problems(schema)
    assert "properties[drafter].default" in problem and "Key not found" in problem and "a <= b" not in problem
    schema["properties"]["drafter"]["x-kubernetes-validations"][0]["rule"] = "!has(self.a) || self.a <= self.b"
    assert schema_problems(schema) == []


def test_a_transition_rule_is_checked_on_the_default_too():
    schema = {
        "type": "object",
        "default": {},
        "properties": {"q": {"type": "object", "properties": {}}},
        "x-kubernetes-validations": [{"rule": "!has(self.q.x) || has(oldSelf.q.x)"}],
    }
    assert len(schema_problems(schema)) == 1


def test_an_unknown_string_escape_is_a_compile_error():
    assert "token recognition error" in compile_error(r"self.matches('(^|/)\.\.')")
    assert compile_error(r"self.matches('(^|/)\\.\\.')") is None


def test_a_field_path_must_name_a_declared_field():
    schema = {
        "type": "object",
        "properties": {
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
        "x-kubernetes-validations": [
            {"rule": "true", "fieldPath": ".metadata.name"},
            {"rule": "true", "fieldPath": ".spec.x"},
            {"rule": "true", "fieldPath": ".spec['x']"},
            {"rule": "true", "fieldPath": ".spec.y"},
        ],
    }
    problems = schema_problems(schema)
    assert len(problems) == 2
    assert "'.metadata.name'" in problems[0] and "'.spec.y'" in problems[1]


def test_an_undeclared_function_is_reported_not_missed():
    assert "undeclared reference" in compile_error("self.x.notAKubernetesFunction()")


@pytest.mark.parametrize(
    "pattern,samples",
    [
        (PARENT_SEGMENT, ["..", "a/../b", "a/..", "../a", "a/.b", "a..b", "/x/y"]),
        (
            FORBIDDEN_MOUNT,
            [
                "/etc/tlt",
                "/",
                "/etc",
                "/var/lib",
                "/tmp/x",
                ".",
                "/etc/tlt/x",
                "/var/lib/tlt2",
                "a",
                "/var/lib/tlt/a",
                "/var/run/secrets/kubernetes.io/serviceaccount",
            ],
        ),
        (NON_CANONICAL, ["/etc/tlt/.", "//etc", "a/", "/", "./x", "a/./b", "a.b", ".hidden", "x/.hidden"]),
        (RUN_NAME_PATTERN, ["a", "a-b", "-a", "a-", "A", "a1"]),
    ],
)
def test_cel_string_keeps_the_regex_python_uses(pattern, samples):
    """The pattern reaches CEL's RE2 as Python's `re` reads it (escapes doubled once, not lost)."""
    rule = f"self.matches({cel_string(pattern)})"
    for text in samples:
        assert run_rule(rule, text) is bool(re.search(pattern, text)), text


def test_rules_read_only_keys_they_guard_on_a_bare_object():
    """A rule meets `{}` whenever a parent default is written; none may error there."""
    for path, rules in CEL_RULES.items():
        for rule in rules:
            result = run_rule(rule["rule"], {}, {})
            assert result is True, (path, rule["rule"], result)
