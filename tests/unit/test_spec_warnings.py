"""Settings that validate but do nothing are warned about by `tlt validate`."""

from __future__ import annotations

from fractions import Fraction

import pytest
import yaml

from tlt.cli import main
from tlt.spec.run import RunSpec
from tlt.spec.spec_warnings import quantity_bytes, spec_warnings, tree_candidates


def test_the_default_spec_has_no_warnings():
    assert spec_warnings(RunSpec()) == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"speculative": {"threshold": 100, "buckets": [1, 4, 16]}}, "spec.speculative.threshold"),
        (
            {"speculative": {"arms": [{"kind": "tree", "depth": 2, "topk": 2, "verifyTokens": 7}]}},
            "spec.speculative.arms[0].verifyTokens",
        ),
        (
            {
                "speculative": {"arms": [{"kind": "block", "depth": 4}]},
                "drafter": {"placement": "sidecar", "deviceClassName": "gpu.example.com"},
            },
            "spec.speculative.arms[0]",
        ),
        ({"model": {"maxContext": 256}, "algorithm": {"maxNewTokens": 256}}, "spec.algorithm.maxNewTokens"),
        ({"verifier": {"resources": {"memory": "100m"}}}, "spec.verifier.resources.memory"),
        ({"rollout": {"resources": {"memory": "1.0001Ki"}}}, "spec.rollout.resources.memory"),
        ({"dataset": {"chat": True}}, "spec.dataset.chat"),
        ({"speculative": {"mode": "off", "draftVocab": 1000}}, "spec.speculative.draftVocab"),
        ({"speculative": {"draftVocab": 1000}, "rollout": {"engine": "vllm"}}, "spec.speculative.draftVocab"),
        ({"dataset": {"evalPath": "e.jsonl"}}, "spec.dataset.evalPath"),
        ({"policy": {"sharding": "fsdp"}}, "spec.policy.sharding"),
        ({"policy": {"replicas": 1, "sharding": "ddp"}}, "spec.policy.sharding"),
        (
            {"dataset": {"source": "file", "path": "d.jsonl", "prompt": "{q}", "promptKey": "q"}},
            "spec.dataset.promptKey",
        ),
        (
            {"dataset": {"source": "file", "path": "d.jsonl", "evalPath": "e.jsonl", "evalFraction": 0.2}},
            "spec.dataset.evalFraction",
        ),
    ],
)
def test_each_setting_that_does_nothing_is_named(spec, field):
    (warning,) = spec_warnings(RunSpec.model_validate(spec))
    assert warning.startswith(f"{field}: ")


def test_boundaries_are_quiet():
    quiet = {
        "speculative": {
            "threshold": 16,
            "buckets": [1, 4, 16],
            "arms": [{"kind": "tree", "depth": 2, "topk": 2, "verifyTokens": 6}],
        },
        "model": {"maxContext": 256},
        "algorithm": {"maxNewTokens": 255},
        "verifier": {"resources": {"memory": "1.5Gi"}},
    }
    quiet["speculative"]["draftVocab"] = 1000  # mode tlt, engine tlt: a reduced draft vocabulary applies
    quiet["speculative"]["arms"].append({"kind": "block", "depth": 4})  # trained in the rollout container
    assert spec_warnings(RunSpec.model_validate(quiet)) == []
    assert tree_candidates(RunSpec().speculative.arms[2]) == 6
    assert quantity_bytes("1.5Gi") == 1610612736 and quantity_bytes("100m") == Fraction(1, 10)


def test_tlt_validate_prints_warnings_and_still_succeeds(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "w"},
                "spec": {"verifier": {"resources": {"memory": "1m"}}},
            }
        )
    )
    assert main(["validate", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: spec.verifier.resources.memory" in err
