"""The whole pipeline under KFP's local subprocess runner on the built-in task: prepare_data ->
train(mode=local, ray runtime, speculative.mode static: a drafter trained in idle time) ->
export_drafter -> evaluate_drafter. Starts from the cached reduced warm start; two RL steps.
(No `from __future__ import annotations`, as in every module that may define KFP pipelines.)"""

import json
from pathlib import Path

import pytest
from _kfp_helpers import cached_warm_start, init_local_runner, small_run_spec, task_dir, task_outputs
from safetensors import safe_open

from tlt.models.eagle_layout import EAGLE_WEIGHT_NAMES
from tlt_components.pipeline import tlt_local_pipeline

pytestmark = pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")


@pytest.mark.slow
def test_pipeline_end_to_end_on_the_builtin_task(tmp_path: Path):
    root = tmp_path / "root"
    init_local_runner(root)
    tlt_local_pipeline(
        run_spec=small_run_spec(cached_warm_start(), "static"),
        local_runtime="ray",
        work_dir=str(tmp_path / "work"),
        eval_prompts=2,
        eval_draft_tokens=3,
        eval_max_new_tokens=16,
        eval_dtype="float32",
    )

    data = task_outputs(root, "prepare-data")["artifacts"]["data"]
    assert data["num_train"] == 64 and data["num_eval"] == 16
    trained = task_outputs(root, "train")["artifacts"]
    assert trained["metrics"]["steps"] == 2
    assert trained["drafter"]["trained"] is True and trained["drafter"]["runtime"] == "ray"
    eagle = task_dir(root, "export-drafter") / "eagle"
    with safe_open(str(eagle / "model.safetensors"), framework="pt") as handle:
        assert set(handle.keys()) == set(EAGLE_WEIGHT_NAMES)
    assert json.loads((eagle / "config.json").read_text())["num_hidden_layers"] == 1
    metrics = task_outputs(root, "evaluate-drafter")["artifacts"]["metrics"]
    assert metrics["prompts"] == 2 and metrics["outputs_equal"] == 1.0
    assert 1.0 <= metrics["accept_length"] <= 4.0
