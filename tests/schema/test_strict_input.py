"""`tlt validate`'s reading of a run file: a key given twice is refused as kubectl's strict
decoding refuses it, and an unknown field is answered with the closest known field."""

from __future__ import annotations

import pytest

from tlt.spec.manifest_io import SpecError, load_run, parse_run, read_yaml

DUPLICATE = """\
apiVersion: tlt.dev/v1alpha1
kind: TLTTrainingRun
metadata: {name: x}
spec:
  rollout:
    replicas: 1
    image: ghcr.io/tlt-dev/tlt-worker:0.1.0
    replicas: 64
"""


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(DUPLICATE)
    with pytest.raises(SpecError) as info:
        load_run(path)
    (error,) = info.value.errors
    assert "duplicate key 'replicas'" in error and "line 8" in error


def test_the_same_key_in_different_mappings_is_fine():
    assert read_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            {"algorithm": {"learningRat": 0.1}},
            "spec.algorithm.learningRat: unknown field (did you mean 'learningRate'?)",
        ),
        ({"rollout": {"replicaz": 2}}, "spec.rollout.replicaz: unknown field (did you mean 'replicas'?)"),
        ({"rollout": {"zzzqqq": 2}}, "spec.rollout.zzzqqq: unknown field (check spelling; fields are camelCase)"),
    ],
)
def test_an_unknown_field_gets_a_did_you_mean(spec, error):
    with pytest.raises(SpecError) as info:
        parse_run({"apiVersion": "tlt.dev/v1alpha1", "kind": "TLTTrainingRun", "metadata": {"name": "x"}, "spec": spec})
    assert info.value.errors == [error]


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            {"rollout": {"resources": {"memory": "4GB"}}},
            "spec.rollout.resources.memory: must be a quantity: a number with an optional suffix",
        ),
        ({"rollout": {"image": "ghcr.io/tlt worker"}}, "spec.rollout.image: must be an image reference"),
        (
            {"schedulingPolicy": {"priorityClassName": "High"}},
            "spec.schedulingPolicy.priorityClassName: must be a DNS name: lowercase letters",
        ),
    ],
)
def test_a_pattern_is_explained_in_words(spec, error):
    with pytest.raises(SpecError) as info:
        parse_run({"apiVersion": "tlt.dev/v1alpha1", "kind": "TLTTrainingRun", "metadata": {"name": "x"}, "spec": spec})
    (message,) = info.value.errors
    assert message.startswith(error) and "got " in message


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"labels": {"team": 3}}, "metadata.labels.team"),
        ({"labels": {"team": "a b"}}, "metadata.labels.team"),
        ({"annotations": {"note": ["x"]}}, "metadata.annotations.note"),
        ({"labels": {"a b": "x"}}, "metadata.labels.a b.[key]"),
    ],
)
def test_metadata_labels_and_annotations_are_typed(metadata, field):
    with pytest.raises(SpecError) as info:
        parse_run(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "x", **metadata},
                "spec": {},
            }
        )
    assert any(e.startswith(f"{field}:") for e in info.value.errors), info.value.errors


@pytest.mark.parametrize(
    "template", [{"labels": {"a b": "x"}}, {"annotations": {"/x": "y"}}, {"nodeSelector": {"gpu type": "h100"}}]
)
def test_pod_template_keys_are_qualified_names(template):
    """tlt validate only: the CRD cannot check map keys within the apiserver's CEL cost budget."""
    with pytest.raises(SpecError) as info:
        parse_run({"spec": {"rollout": {"podTemplate": template}}})
    (error,) = info.value.errors
    assert error.startswith("spec.rollout.podTemplate: podTemplate label, annotation and nodeSelector keys")
