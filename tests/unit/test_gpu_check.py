"""`tlt.bench.gpu_check`: the checks of the GPU measurement script (bench/gpu/run.sh) that run on any machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tlt.bench import gpu_check

WORKLOAD = Path(__file__).resolve().parents[2] / "bench" / "workload-gpu-v1.yaml"


def test_distribution_names_compare_as_pip_compares_them(tmp_path):
    assert gpu_check.normalize("Typing_Inspection") == gpu_check.normalize("typing.inspection") == "typing-inspection"
    wheel = tmp_path / "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl"
    assert gpu_check.wheel_distribution(wheel) == "pydantic-core"
    device = tmp_path / "device.txt"
    device.write_text("# the image\nPyYAML\n\ntorch\n")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / wheel.name).write_bytes(b"")
    assert gpu_check.allowed_distributions(device, tmp_path / "wheels") == {"pyyaml", "torch", "pydantic-core"}


def _foreign(modules: list[str], allowed: set[str]) -> dict[str, list[str]]:
    """foreign_distributions in a fresh process (it sees only the imports it makes itself)."""
    code = (
        "import json, sys\nfrom tlt.bench import gpu_check as g\n"
        f"seen = g.recorded_imports(lambda: g.collect_and_import([], {modules!r}))\n"
        f"print(json.dumps(g.foreign_distributions(seen, set({sorted(allowed)!r}))))"
    )
    return json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        ).stdout.splitlines()[-1]
    )


def test_foreign_distributions_are_what_the_project_needs_and_the_device_lacks():
    # tlt.spec.run imports pydantic; pydantic imports pydantic_core, annotated_types, typing_inspection
    lacking = _foreign(["tlt.spec.run"], set())
    assert lacking["pydantic"] == ["pydantic"]
    assert {"pydantic-core", "annotated-types"} <= set(lacking), "what a needed module imports is needed too"
    # a package the device has brings its own needs: they are its affair, not the project's
    assert not {"pydantic-core", "annotated-types", "typing-inspection"} & set(_foreign(["tlt.spec.run"], {"pydantic"}))


def test_warm_starts_are_missing_until_policy_and_drafter_are_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TLT_CACHE_DIR", str(tmp_path))
    expected = gpu_check.expected_warm_starts(WORKLOAD)
    assert [e["version"] for e in expected] == ["full", "quick"]
    assert len(gpu_check.missing_warm_starts(WORKLOAD)) == 2
    for entry in expected:
        folder = entry["folder"]
        (folder / "bench-drafter-x").mkdir(parents=True)
        (folder / "warmstart.json").write_text("{}")
        (folder / "bench-drafter-x" / "bench.json").write_text(json.dumps({"settings": {"other": 1}}))
    missing = gpu_check.missing_warm_starts(WORKLOAD)
    assert len(missing) == 2 and all("warm drafter" in m for m in missing), missing
    for entry in expected:
        path = entry["folder"] / "bench-drafter-x" / "bench.json"
        path.write_text(json.dumps({"settings": entry["drafter_settings"]}))
    assert gpu_check.missing_warm_starts(WORKLOAD) == []
    full = expected[0]["drafter_settings"]  # the workload's drafterWarmstart, as drafter_warm_start trains it
    assert full == {
        "policy": expected[0]["folder"].name,
        "prompts": 256,
        "steps": 150,
        "batch": 32,
        "lr": 3.0e-3,
        "max_new_tokens": 256,
        "seed": 0,
    }


def test_tree_bytes_counts_tracked_and_untracked_files_but_not_ignored_ones(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("carry/\n")
    (tmp_path / "tracked.txt").write_text("x" * 100)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt", ".gitignore"], check=True)
    (tmp_path / "untracked.txt").write_text("y" * 10)
    (tmp_path / "carry").mkdir()
    (tmp_path / "carry" / "big.bin").write_bytes(b"z" * 1000)
    assert gpu_check.tree_bytes(tmp_path) == 100 + 10 + len("carry/\n")
    assert gpu_check.folder_bytes(tmp_path / "carry") == 1000
    assert gpu_check.folder_bytes(tmp_path / "none") == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_the_problem_says_so():
    problem = gpu_check.cuda_problem(20)
    assert problem is not None and "sees no CUDA device" in problem
    assert gpu_check.main(["cuda"]) == 1
