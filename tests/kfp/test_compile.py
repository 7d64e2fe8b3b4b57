"""The compiled pipeline: checked in, free of drift, typed inputs, and no parameter in a shell."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tlt_components.common import BASE_IMAGE
from tlt_components.pipeline import PIPELINE_FILE, compile_pipeline

STAGES = ("prepare-data", "train", "export-drafter", "evaluate-drafter")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_checked_in_yaml_matches_the_pipeline_code(tmp_path: Path):
    fresh = compile_pipeline(tmp_path / "pipeline.yaml").read_text()
    assert PIPELINE_FILE.is_file(), f"{PIPELINE_FILE} is missing: run `python -m tlt_components.pipeline`"
    assert PIPELINE_FILE.read_text() == fresh, (
        f"{PIPELINE_FILE} drifted from tlt_components/pipeline.py: run `python -m tlt_components.pipeline`"
    )


def test_pipeline_chains_the_four_components_in_order():
    spec = load(PIPELINE_FILE)
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == set(STAGES)
    assert tasks["train"]["dependentTasks"] == ["prepare-data"]
    assert tasks["export-drafter"]["dependentTasks"] == ["train"]
    assert sorted(tasks["evaluate-drafter"]["dependentTasks"]) == ["export-drafter", "prepare-data", "train"]


def test_inputs_are_typed():
    spec = load(PIPELINE_FILE)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["run_spec"]["parameterType"] == "STRUCT"
    assert params["mode"]["parameterType"] == "STRING" and "defaultValue" not in params["mode"], "mode is explicit"
    assert params["eval_prompts"]["parameterType"] == "NUMBER_INTEGER"
    assert params["timeout_seconds"]["parameterType"] == "NUMBER_DOUBLE"
    train_io = spec["components"]["comp-train"]
    assert set(train_io["outputDefinitions"]["artifacts"]) == {"policy", "drafter", "metrics"}
    assert train_io["outputDefinitions"]["artifacts"]["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    assert train_io["inputDefinitions"]["artifacts"]["data"]["artifactType"]["schemaTitle"] == "system.Dataset"


def test_no_parameter_reaches_a_shell():
    """Every executor runs a fixed script; parameters travel only inside the executor input ({{$}})."""
    executors = load(PIPELINE_FILE)["deploymentSpec"]["executors"]
    assert len(executors) == len(STAGES)
    for name, executor in executors.items():
        container = executor["container"]
        assert container["image"] == BASE_IMAGE
        script = container["command"][2]
        assert container["command"][:2] == ["sh", "-ec"], name
        assert "{{" not in script and "pip install" not in script, f"{name}: the shell script must be fixed"
        placeholders = re.findall(r"\{\{[^}]*\}\}", yaml.safe_dump(container))
        assert set(placeholders) == {"{{$}}"}, f"{name}: only the executor input may be substituted"
        assert container["args"][:2] == ["--executor_input", "{{$}}"], name
