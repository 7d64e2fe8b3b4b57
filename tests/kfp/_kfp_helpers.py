"""Helpers of the KFP local-runner tests: the runner, a run's outputs, the cached warm start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kfp import local

from tlt.tasks.warmstart import reduced_config, warm_start


def init_local_runner(root: Path) -> None:
    """KFP's subprocess runner in this environment (components import the installed `tlt`)."""
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)


def cached_warm_start() -> Path:
    """The reduced warm-started policy, from $TLT_CACHE_DIR (trained once, seconds, then cached)."""
    return warm_start(reduced_config())


def task_dir(root: Path, task: str) -> Path:
    """The folder of `task` in the only pipeline run under `root`."""
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, f"expected one pipeline run under {root}, found {runs}"
    return runs[0] / task


def task_outputs(root: Path, task: str) -> dict[str, Any]:
    """The executor output of `task`: {"parameters": ..., "artifacts": {name: metadata}}."""
    output = json.loads((task_dir(root, task) / "executor_output.json").read_text())
    artifacts = {name: entry["artifacts"][0].get("metadata", {}) for name, entry in output.get("artifacts", {}).items()}
    return {"parameters": output.get("parameterValues", {}), "artifacts": artifacts}


def small_run_spec(policy: Path, mode: str) -> dict[str, Any]:
    """Two GRPO steps on the built-in task from the cached warm start, float32, short responses."""
    return {
        "model": {"path": str(policy), "dtype": "float32", "maxContext": 256},
        "dataset": {"builtin": {"numTrain": 64, "numEval": 16}},
        "algorithm": {"steps": 2, "promptsPerStep": 2, "groupSize": 2, "maxNewTokens": 48},
        "rollout": {"replicas": 1},
        "verifier": {"replicas": 1},
        "speculative": {"mode": mode},
    }
