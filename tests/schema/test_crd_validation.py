"""pydantic (`tlt validate`) and the CRD (openAPIV3Schema + CEL, as the apiserver applies it) accept
and reject the same manifests, each naming the offending field; `managedBy` cannot change."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from invalid_runs import CEL_MESSAGES, INVALID, manifest

from tlt.spec.crd import MSG_MODEL, MSG_QUEUED_REPLICAS, MSG_TRAINERS
from tlt.spec.crd_validate import CEL_SKIPPED, validate_run
from tlt.spec.manifest_io import SpecError, parse_run
from tlt.spec.run import API_GROUP, KIND

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = [ROOT / "examples" / "run.yaml", ROOT / "manifests" / "samples" / "run.yaml"]


def pydantic_errors(doc: dict[str, Any]) -> list[str]:
    try:
        parse_run(doc)
    except SpecError as exc:
        return exc.errors
    return []


def dotted(k8s_path: str) -> str:
    """`spec.arms[0].kind` -> `spec.arms.0.kind`: pydantic's spelling of the same path."""
    return re.sub(r"\[([^\]]+)\]", r".\1", k8s_path)


def test_enough_invalid_cases():
    assert len(INVALID) >= 15


@pytest.mark.parametrize(("case", "spec", "path"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_manifest_rejected_by_pydantic_and_crd(case, spec, path):
    doc = manifest(spec)
    py = pydantic_errors(doc)
    crd = validate_run(doc)
    assert py, f"pydantic accepted: {case}"
    assert not crd.ok, f"the CRD accepted: {case}"
    assert any(e.startswith(f"{dotted(path)}:") for e in py), f"pydantic errors lack {dotted(path)}: {py}"
    crd_messages = crd.messages()
    assert any(m.startswith(f"{path}:") or f'unknown field "{path}"' == m for m in crd_messages), (
        f"CRD errors lack {path}: {crd_messages}"
    )


@pytest.mark.parametrize("case", sorted(CEL_MESSAGES))
def test_cel_rule_says_what_pydantic_says(case):
    spec, path = next((s, p) for c, s, p in INVALID if c == case)
    doc = manifest(spec)
    message = CEL_MESSAGES[case]
    assert f"{dotted(path)}: {message}" in pydantic_errors(doc)
    assert f"{path}: Invalid value: {message}" in validate_run(doc).messages()


def test_cel_rejection_is_a_422_status_like_the_apiserver():
    doc = manifest({"drafter": {"minTrainers": 3, "maxTrainers": 1}}, name="r1")
    status = validate_run(doc).status("r1")
    assert status is not None and status["code"] == 422 and status["reason"] == "Invalid"
    expected = f'{KIND}.{API_GROUP} "r1" is invalid: spec.drafter: Invalid value: {MSG_TRAINERS}'
    assert status["message"] == expected
    assert status["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": f"Invalid value: {MSG_TRAINERS}", "field": "spec.drafter"}
    ]


def test_unknown_field_is_400_when_strict_and_pruned_with_warning_otherwise():
    doc = manifest({"algorithm": {"stepz": 3}})
    strict = validate_run(doc, strict=True)
    assert strict.status("run")["code"] == 400
    lenient = validate_run(doc, strict=False)
    assert lenient.ok and lenient.warnings == ['unknown field "spec.algorithm.stepz"']
    assert "stepz" not in lenient.object["spec"]["algorithm"]


def test_every_error_is_reported_not_just_the_first():
    doc = manifest({"algorithm": {"steps": 0, "topP": 2}, "drafter": {"minTrainers": 9}})
    fields = {m.split(":")[0] for m in validate_run(doc).messages()}
    assert fields == {"spec.algorithm.steps", "spec.algorithm.topP", "spec.drafter"}
    assert {e.split(":")[0] for e in pydantic_errors(doc)} == fields


def test_blocking_schema_error_skips_cel_and_says_so_like_the_apiserver():
    doc = manifest({"algorithm": {"name": "ppo"}, "drafter": {"minTrainers": 9}})
    assert validate_run(doc).messages() == [
        'spec.algorithm.name: Unsupported value: "ppo": supported values: "grpo"',
        f"<nil>: Invalid value: null: {CEL_SKIPPED}",
    ]


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_samples_accepted_by_both(path):
    doc = yaml.safe_load(path.read_text())
    assert pydantic_errors(doc) == []
    result = validate_run(doc)
    assert result.ok, result.messages()


def test_sample_manifest_matches_example():
    example, sample = (yaml.safe_load(p.read_text()) for p in SAMPLES)
    assert sample == example, "manifests/samples/run.yaml must carry examples/run.yaml's manifest"
    assert "namespace" not in sample["metadata"], "kustomize sets the namespace"


VALID: list[dict[str, Any]] = [
    {},
    {"drafter": {"placement": "sidecar", "deviceClassName": "gpu.nvidia.com", "minTrainers": 2, "maxTrainers": 2}},
    {"dataset": {"source": "file", "path": "/data/gsm8k.jsonl", "answerFormat": "gsm8k"}},
    {"speculative": {"buckets": [2], "ngramMin": 3, "ngramMax": 3, "arms": [{"kind": "ngram"}]}},
    {
        "policy": {
            "podTemplate": {
                "labels": {"team": "rl"},
                "env": [{"name": "HF_TOKEN", "secretKeyRef": {"name": "hf", "key": "token"}}],
            }
        }
    },
    {"schedulingPolicy": {"queue": "team-a", "gang": {"scheduler": "volcano"}}, "suspend": True},
    {"algorithm": {"rollout": {"mode": "partial", "overProvision": 1, "maxStaleness": 2, "importanceCap": 4}}},
    {"algorithm": {"rollout": {"mode": "sync", "overProvision": 0}}, "rollout": {"engine": "vllm"}},
    {
        "rollout": {
            "podTemplate": {
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                "env": [{"name": "A", "value": "", "secretKeyRef": {"name": "s", "key": "k"}}],
            }
        }
    },
]


@pytest.mark.parametrize("spec", VALID, ids=range(len(VALID)))
def test_valid_manifest_accepted_by_both(spec):
    doc = manifest(spec)
    assert pydantic_errors(doc) == []
    result = validate_run(doc)
    assert result.ok, result.messages()


@pytest.mark.parametrize("name", ["Bad_Name", "-run", "x" * 254, "x" * 54, "my.run", "1run"])
def test_bad_run_name_rejected_by_both(name):
    """KubeRay's rule: DNS-1035 and at most 53 characters, so every child name fits."""
    doc = manifest({}, name=name)
    assert any(e.startswith("metadata.name:") for e in pydantic_errors(doc))
    assert any(m.startswith("metadata.name: Invalid value:") for m in validate_run(doc).messages())


def test_longest_run_name_is_accepted_by_both():
    doc = manifest({}, name="r" * 53)
    assert pydantic_errors(doc) == [] and validate_run(doc).ok


def test_model_is_immutable():
    old, new = manifest({}), manifest({"model": {"maxContext": 2048}})
    assert validate_run(new).ok
    assert validate_run(new, old=old).messages() == [f"spec.model: Invalid value: {MSG_MODEL}"]


def test_replicas_are_immutable_while_queued_and_scale_freely_otherwise():
    queued = {"schedulingPolicy": {"queue": "team-a"}}
    result = validate_run(manifest({**queued, "rollout": {"replicas": 4}}), old=manifest(queued))
    assert result.messages() == [f"spec: Invalid value: {MSG_QUEUED_REPLICAS}"]
    assert validate_run(manifest({"rollout": {"replicas": 4}}), old=manifest({})).ok
    assert validate_run(manifest({**queued, "algorithm": {"steps": 30}}), old=manifest(queued)).ok


def test_managed_by_change_rejected_on_update():
    old = manifest({"managedBy": "tlt.dev/operator"})
    new = manifest({"managedBy": "kueue.x-k8s.io/multikueue"})
    assert validate_run(new).ok, "any managedBy is fine on create"
    result = validate_run(new, old=old)
    assert result.messages() == ['spec.managedBy: Invalid value: "kueue.x-k8s.io/multikueue": managedBy is immutable']
    assert result.status("run")["code"] == 422


def test_managed_by_unchanged_update_accepted():
    old = manifest({"managedBy": "tlt.dev/operator"})
    new = manifest({"managedBy": "tlt.dev/operator", "suspend": True, "algorithm": {"steps": 5}})
    assert validate_run(new, old=old).ok


def test_managed_by_defaulted_on_both_sides_is_unchanged():
    assert validate_run(manifest({"suspend": True}), old=manifest({})).ok
    assert not validate_run(manifest({"managedBy": "other.io/ctl"}), old=manifest({})).ok
