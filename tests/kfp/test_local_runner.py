"""The components under KFP's local subprocess runner (the executor, artifacts and metadata as KFP
passes them): prepare_data and train(mode=local, single-process) in the pipeline, and
export_drafter -> evaluate_drafter on imported artifacts. The full pipeline with a drafter trained
on Ray is tests/kfp/test_pipeline_e2e.py. (No `from __future__ import annotations`: KFP reads the
test pipeline's annotations as types.)"""

import json
from pathlib import Path

import pytest
import torch
from _kfp_helpers import cached_warm_start, init_local_runner, small_run_spec, task_dir, task_outputs
from kfp import dsl
from kfp.dsl import Model
from transformers import AutoConfig

from tlt.models.drafter import EagleDrafter, drafter_config_from_target, save_drafter
from tlt.models.loading import read_model_config
from tlt_components.components import evaluate_drafter, export_drafter, prepare_data
from tlt_components.pipeline import tlt_local_pipeline

# Each component is a fresh Python process importing torch: minutes on 2 shared cores.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")]


def test_pipeline_trains_single_process_then_refuses_to_export_without_a_drafter(tmp_path: Path):
    """prepare -> train run under the runner (policy, metrics, step series); a run that trained no
    drafter stops the pipeline at export with the reason, instead of exporting nothing."""
    root = tmp_path / "root"
    init_local_runner(root)
    spec = small_run_spec(cached_warm_start(), "off")
    with pytest.raises(RuntimeError, match="finished with status"):
        tlt_local_pipeline(run_spec=spec, local_runtime="single-process", work_dir=str(tmp_path / "work"))

    data = task_outputs(root, "prepare-data")["artifacts"]["data"]
    assert (data["num_train"], data["num_eval"], data["source"]) == (64, 16, "builtin")
    trained = task_outputs(root, "train")["artifacts"]
    assert trained["metrics"]["steps"] == 2 and "step0002_reward_mean" in trained["metrics"]
    assert trained["drafter"] == {
        "location": "artifact",
        "trained": False,
        "runtime": "single-process",
        "speculative_mode": "off",
    }
    assert read_model_config(task_dir(root, "train") / "policy")["model_type"] == "qwen2"
    report = (task_dir(root, "train") / "report").read_text()
    assert report.startswith("# TLT run") and report.count("data:image/png;base64,") == 4, "the KFP UI's report"
    assert not (task_dir(root, "export-drafter") / "executor_output.json").exists()


@dsl.pipeline(name="export-evaluate")
def export_and_evaluate(run_spec: dict, policy_uri: str, drafter_uri: str):
    data = prepare_data(run_spec=run_spec)
    policy = dsl.importer(artifact_uri=policy_uri, artifact_class=Model, reimport=True)
    drafter = dsl.importer(artifact_uri=drafter_uri, artifact_class=Model, reimport=True)
    exported = export_drafter(drafter=drafter.output, policy=policy.output, dtype="float32")
    evaluate_drafter(
        eagle=exported.outputs["eagle"],
        policy=policy.output,
        data=data.outputs["data"],
        num_prompts=2,
        draft_tokens=3,
        max_new_tokens=16,
        batch_size=1,
        temperature=0.0,
        dtype="float32",
    )


def test_export_then_evaluate_a_drafter(tmp_path: Path):
    root = tmp_path / "root"
    init_local_runner(root)
    policy = cached_warm_start()
    torch.manual_seed(0)
    save_drafter(EagleDrafter(drafter_config_from_target(AutoConfig.from_pretrained(policy))), tmp_path / "drafter")
    export_and_evaluate(
        run_spec=small_run_spec(policy, "off"), policy_uri=str(policy), drafter_uri=str(tmp_path / "drafter")
    )

    eagle = task_outputs(root, "export-drafter")["artifacts"]["eagle"]
    assert eagle["format"] == "eagle" and eagle["tensors"] == 9 and eagle["dtype"] == "float32"
    config = json.loads((task_dir(root, "export-drafter") / "eagle" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    metrics = task_outputs(root, "evaluate-drafter")["artifacts"]["metrics"]
    assert metrics["prompts"] == 2 and metrics["draft_tokens"] == 3
    assert metrics["outputs_equal"] == 1.0, "greedy speculative decoding is lossless (float32)"
    assert 1.0 <= metrics["accept_length"] <= 4.0 and metrics["speedup"] > 0
    report = (task_dir(root, "evaluate-drafter") / "report").read_text()
    assert report.startswith("# Drafter evaluation") and "| accept_length |" in report
