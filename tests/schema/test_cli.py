"""`tlt validate` and `tlt crd` from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tlt.cli import main
from tlt.spec.crd import crd_yaml
from tlt.spec.rollout_mode import MSG_OVER_PROVISION, MSG_STALENESS
from tlt.spec.run import MSG_PARTIAL_VLLM

ROOT = Path(__file__).resolve().parents[2]


def test_validate_good_file_exits_zero(capsys):
    assert main(["validate", str(ROOT / "examples" / "run.yaml")]) == 0
    assert "ok (TLTTrainingRun tlt-demo)" in capsys.readouterr().out


def test_validate_bad_file_lists_every_error_with_its_path(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "bad"},
                "spec": {
                    "algorithm": {"steps": 0, "groupSize": 1},
                    "drafter": {"minTrainers": 5, "maxTrainers": 1},
                    "speculative": {"arms": [{"kind": "beam"}]},
                    "rollut": {"replicas": 2},
                },
            }
        )
    )
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "5 error(s)" in err
    for path in (
        "spec.algorithm.steps:",
        "spec.algorithm.groupSize:",
        "spec.speculative.arms.0.kind:",
        "spec.rollut: unknown field",
        "spec.drafter: drafter.minTrainers must be <= drafter.maxTrainers",
    ):
        assert path in err, f"{path} missing from:\n{err}"


def test_validate_bare_spec_works(tmp_path, capsys):
    bare = tmp_path / "bare.yaml"
    bare.write_text("algorithm:\n  steps: 3\nspeculative:\n  mode: ngram\n")
    assert main(["validate", str(bare)]) == 0
    assert "ok (TLTTrainingRun tlt-run)" in capsys.readouterr().out


def test_validate_several_files_fails_if_any_fails(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("drafter:\n  placement: sidecar\n")
    assert main(["validate", str(ROOT / "examples" / "run.yaml"), str(bad)]) == 1
    assert "spec.drafter: drafter.deviceClassName is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ({"algorithm": {"rollout": {"overProvision": 0.5}}}, f"spec.algorithm.rollout: {MSG_OVER_PROVISION}"),
        (
            {"algorithm": {"rollout": {"mode": "partial", "maxStaleness": 0}}},
            f"spec.algorithm.rollout: {MSG_STALENESS}",
        ),
        ({"algorithm": {"rollout": {"mode": "partial"}}, "rollout": {"engine": "vllm"}}, f"spec: {MSG_PARTIAL_VLLM}"),
    ],
    ids=["over-provision in sync", "no staleness in partial", "partial on vllm"],
)
def test_validate_refuses_a_partial_rollout_mismatch_in_one_line(tmp_path, capsys, spec, line):
    bad = tmp_path / "bad.yaml"
    run = {"apiVersion": "tlt.dev/v1alpha1", "kind": "TLTTrainingRun", "metadata": {"name": "p"}, "spec": spec}
    bad.write_text(yaml.safe_dump(run))
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "1 error(s)" in err and f"  {line}\n" in err


def test_validate_missing_file_and_bad_yaml(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    assert main(["validate", str(tmp_path / "nope.yaml"), str(broken)]) == 1
    err = capsys.readouterr().err
    assert "file not found" in err and "not valid YAML" in err


def test_crd_to_stdout(capsys):
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == crd_yaml()


def test_crd_to_file(tmp_path):
    out = tmp_path / "crds" / "crd.yaml"
    assert main(["crd", "--out", str(out)]) == 0
    assert out.read_text() == crd_yaml()
    assert yaml.safe_load(out.read_text())["kind"] == "CustomResourceDefinition"
