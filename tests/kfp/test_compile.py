"""The compiled pipelines: checked in, free of drift, typed inputs, no parameter in a shell, and in
tlt-cluster the run's checkpoint claim mounted on exactly the steps that read the run's outputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tlt_components.common import BASE_IMAGE, CHECKPOINT_MOUNT
from tlt_components.pipeline import CLUSTER_FILE, COMPONENTS_DIR, LOCAL_FILE, compile_pipelines

STAGES = ("prepare-data", "train", "export-drafter", "evaluate-drafter")
FILES = (LOCAL_FILE, CLUSTER_FILE)


def load(name: str) -> list[dict]:
    """The YAML documents of a checked-in pipeline: the pipeline spec, then its platform spec if any."""
    return list(yaml.safe_load_all((COMPONENTS_DIR / name).read_text()))


def test_checked_in_yaml_matches_the_pipeline_code(tmp_path: Path):
    fresh = compile_pipelines(tmp_path)
    assert sorted(path.name for path in fresh) == sorted(FILES)
    for path in fresh:
        checked_in = COMPONENTS_DIR / path.name
        assert checked_in.is_file(), f"{checked_in} is missing: run `python -m tlt_components.pipeline`"
        assert checked_in.read_text() == path.read_text(), (
            f"{checked_in} drifted from tlt_components/pipeline.py: run `python -m tlt_components.pipeline`"
        )


@pytest.mark.parametrize("name", FILES)
def test_pipeline_chains_the_four_components_in_order(name: str):
    tasks = load(name)[0]["root"]["dag"]["tasks"]
    assert set(tasks) == set(STAGES)
    assert tasks["train"]["dependentTasks"] == ["prepare-data"]
    assert tasks["export-drafter"]["dependentTasks"] == ["train"]
    assert sorted(tasks["evaluate-drafter"]["dependentTasks"]) == ["export-drafter", "prepare-data", "train"]


@pytest.mark.parametrize(("name", "mode"), [(LOCAL_FILE, "local"), (CLUSTER_FILE, "cluster")])
def test_each_pipeline_trains_in_its_own_mode(name: str, mode: str):
    spec = load(name)[0]
    assert "mode" not in spec["root"]["inputDefinitions"]["parameters"], "the pipeline fixes the mode"
    assert spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]["mode"] == {"runtimeValue": {"constant": mode}}


def test_inputs_are_typed():
    local, cluster = load(LOCAL_FILE)[0], load(CLUSTER_FILE)[0]
    params = local["root"]["inputDefinitions"]["parameters"]
    assert params["run_spec"]["parameterType"] == "STRUCT"
    assert params["eval_prompts"]["parameterType"] == "NUMBER_INTEGER"
    assert "checkpoint_claim" not in params, "a local run has no claim to ask for"
    params = cluster["root"]["inputDefinitions"]["parameters"]
    assert params["checkpoint_claim"] == {"parameterType": "STRING"}, "the claim is required, without a default"
    assert params["timeout_seconds"]["parameterType"] == "NUMBER_DOUBLE"
    assert not {"local_runtime", "work_dir"} & set(params), "a cluster run has no local runtime or work folder"
    train_io = cluster["components"]["comp-train"]
    assert set(train_io["outputDefinitions"]["artifacts"]) == {"policy", "drafter", "metrics", "report"}
    assert train_io["outputDefinitions"]["artifacts"]["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    evaluate_io = cluster["components"]["comp-evaluate-drafter"]["outputDefinitions"]["artifacts"]
    for outputs in (train_io["outputDefinitions"]["artifacts"], evaluate_io):
        assert outputs["report"]["artifactType"]["schemaTitle"] == "system.Markdown", "the KFP UI renders it"
    assert train_io["inputDefinitions"]["artifacts"]["data"]["artifactType"]["schemaTitle"] == "system.Dataset"


def test_cluster_pipeline_mounts_the_checkpoint_claim_where_the_outputs_are_read():
    docs = load(CLUSTER_FILE)
    assert len(docs) == 2, "the platform spec (PVC mounts) follows the pipeline spec"
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == {"exec-export-drafter", "exec-evaluate-drafter"}, "train and prepare mount nothing"
    for name, config in executors.items():
        (mount,) = config["pvcMount"]
        assert mount["mountPath"] == CHECKPOINT_MOUNT, name
        assert mount["pvcNameParameter"] == {"componentInputParameter": "checkpoint_claim"}, name
    train = docs[0]["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    assert train["checkpoint_claim"] == {"componentInputParameter": "checkpoint_claim"}, "train checks the claim"


def test_local_pipeline_mounts_nothing():
    assert len(load(LOCAL_FILE)) == 1, "tlt-local has no platform spec"


@pytest.mark.parametrize("name", FILES)
def test_no_parameter_reaches_a_shell(name: str):
    """Every executor runs a fixed script; parameters travel only inside the executor input ({{$}})."""
    executors = load(name)[0]["deploymentSpec"]["executors"]
    assert len(executors) == len(STAGES)
    for executor_name, executor in executors.items():
        container = executor["container"]
        assert container["image"] == BASE_IMAGE
        script = container["command"][2]
        assert container["command"][:2] == ["sh", "-ec"], executor_name
        assert "{{" not in script and "pip install" not in script, f"{executor_name}: the shell script must be fixed"
        placeholders = re.findall(r"\{\{[^}]*\}\}", yaml.safe_dump(container))
        assert set(placeholders) == {"{{$}}"}, f"{executor_name}: only the executor input may be substituted"
        assert container["args"][:2] == ["--executor_input", "{{$}}"], executor_name
