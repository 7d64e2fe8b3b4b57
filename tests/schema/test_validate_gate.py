"""`tlt validate` never crashes or hangs on a hostile file: each input gets one clear line (or a warning)
in well under 5 s, and what kubectl and the API server accept or refuse, it accepts or refuses too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tlt.cli import main
from tlt.spec.manifest_io import MAX_OBJECT_BYTES

HEAD = "apiVersion: tlt.dev/v1alpha1\nkind: TLTTrainingRun\nmetadata:\n  name: gate\n"


def _validate(tmp_path: Path, body: str | bytes, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    path = tmp_path / "run.yaml"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    start = time.perf_counter()
    code = main(["validate", str(path)])
    assert time.perf_counter() - start < 5.0, "the gate must answer within 5 s"
    out, err = capsys.readouterr()
    return code, out, err


def test_a_memory_quantity_of_any_size_is_no_crash(tmp_path, capsys):
    code, out, err = _validate(
        tmp_path, HEAD + "spec:\n  rollout:\n    resources:\n      memory: '" + "9" * 40 + ".5'\n", capsys
    )
    assert code == 0 and ": ok (" in out
    assert "rollout.resources.memory" in err and "fraction of a byte" in err


def test_bytes_that_are_not_utf8_name_their_offset(tmp_path, capsys):
    code, _, err = _validate(tmp_path, HEAD.encode() + b"spec:\n  suspend: \xff\xfe\n", capsys)
    assert code == 1 and f"not UTF-8: byte 0xff at offset {len(HEAD) + 17}" in err
    assert "Traceback" not in err


def test_a_file_over_the_servers_object_limit_is_refused_fast(tmp_path, capsys):
    arms = "".join("  - {kind: chain, depth: 2}\n" for _ in range(100_000))
    body = HEAD + "spec:\n  speculative:\n    arms:\n" + arms
    assert len(body) > MAX_OBJECT_BYTES
    code, _, err = _validate(tmp_path, body, capsys)
    assert code == 1 and "the API server stores objects of at most" in err


def test_a_large_file_under_the_limit_is_parsed_fast(tmp_path, capsys):
    arms = "".join("      - {kind: chain, depth: 2}\n" for _ in range(20_000))  # ~0.7 MB
    code, _, err = _validate(tmp_path, HEAD + "spec:\n  speculative:\n    arms:\n" + arms, capsys)
    assert code == 1 and "spec.speculative.arms: Too many: 20000: must have at most 32 items" in err


def test_yaml_merge_keys_are_merged_as_kubectl_does(tmp_path, capsys):
    body = HEAD + (
        "spec:\n  policy: &role\n    replicas: 1\n    resources: {cpu: '2', memory: 4Gi}\n"
        "  rollout:\n    <<: *role\n    replicas: 3\n"
    )
    code, out, _ = _validate(tmp_path, body, capsys)
    assert code == 0 and ": ok (" in out
    from tlt.spec.manifest_io import load_run

    spec = load_run(tmp_path / "run.yaml").spec
    assert spec.rollout.replicas == 3 and spec.rollout.resources.cpu == "2"


def test_duplicate_keys_are_still_refused(tmp_path, capsys):
    code, _, err = _validate(tmp_path, HEAD + "spec:\n  suspend: true\n  suspend: false\n", capsys)
    assert code == 1 and "duplicate key 'suspend'" in err


def test_generate_name_is_shown_as_the_server_will_complete_it(tmp_path, capsys):
    body = HEAD.replace("  name: gate\n", "  generateName: sweep-\n") + "spec: {}\n"
    code, out, _ = _validate(tmp_path, body, capsys)
    assert code == 0 and "ok (TLTTrainingRun sweep-* (generateName" in out


def test_a_manifest_without_name_or_generate_name_is_refused_as_the_server_does(tmp_path, capsys):
    code, _, err = _validate(
        tmp_path, HEAD.replace("metadata:\n  name: gate\n", "metadata: {}\n") + "spec: {}\n", capsys
    )
    assert code == 1 and "metadata.name: Required value: name or generateName is required" in err


def test_annotations_over_the_servers_limit_are_refused(tmp_path, capsys):
    big = {
        "apiVersion": "tlt.dev/v1alpha1",
        "kind": "TLTTrainingRun",
        "metadata": {"name": "gate", "annotations": {f"note-{i}": "x" * 1000 for i in range(300)}},
        "spec": {},
    }
    code, _, err = _validate(tmp_path, yaml.safe_dump(big), capsys)
    assert code == 1 and "metadata.annotations: Too long: may not be more than 262144 bytes" in err


def test_duplicate_arms_are_warned(tmp_path, capsys):
    body = HEAD + "spec:\n  speculative:\n    arms:\n    - {kind: chain, depth: 2}\n    - {kind: chain, depth: 2}\n"
    code, out, err = _validate(tmp_path, body, capsys)
    assert code == 0 and ": ok (" in out
    assert "spec.speculative.arms[1]: the same arm as arms[0]" in err


def test_a_reference_to_another_runs_secret_is_refused_unless_the_admin_shares_it(tmp_path, capsys, monkeypatch):
    body = HEAD + (
        "spec:\n  rollout:\n    podTemplate:\n      env:\n      - name: RAY_TOKEN\n"
        "        secretKeyRef: {name: victim-ray-token-ab12c, key: token}\n"
    )
    code, _, err = _validate(tmp_path, body, capsys)
    assert code == 1 and "spec.rollout.podTemplate.env[0].secretKeyRef.name: Secret 'victim-ray-token-ab12c'" in err
    monkeypatch.setenv("TLT_OPERATOR_SHARED_SECRETS", "victim-ray-token-ab12c")
    code, out, _ = _validate(tmp_path, body, capsys)
    assert code == 0 and ": ok (" in out
