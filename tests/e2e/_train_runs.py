"""`tlt train` as a subprocess on the tiny policy: the run file, the environment, the outputs to compare.

The run: a 2-layer Qwen2-shaped policy built from a config (`tiny_model`, seed 11), the built-in task,
float32, SD off, a checkpoint every step: CPU with fixed seeds, so an interrupted and resumed run can be
compared with an undisturbed one bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file

from tlt import cli
from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.tasks.tokenizer import build_task_tokenizer

# Metrics that are clocks or wall times, of either loop (the rest must match an undisturbed run exactly)
TIMING_KEYS = {
    "bookkeeping_wait_seconds",
    "generate_seconds",
    "idle_seconds",
    "pre_update_seconds",
    "rollout_dispatched_at",
    "rollout_overhead_parts",
    "rollout_overhead_seconds",
    "rollout_seconds",
    "seconds_by_running",
    "step_seconds",
    "tail_fraction",
    "tail_seconds",
    "tokens_per_second",
    "update_seconds",
    "update_started_at",
    "worker_states",
}


def tiny_policy(root: Path) -> Path:
    """The tiny policy folder under `root` (written once)."""
    folder = root / "policy-init"
    if not folder.exists():
        tokenizer = build_task_tokenizer()
        save_policy(tiny_model("qwen2", vocab_size=len(tokenizer), seed=11), tokenizer, folder)
    return folder


def write_run(root: Path, name: str, steps: int, **sections: Any) -> Path:
    """`<root>/<name>.yaml`: the tiny run of `steps` steps, with `sections` replacing spec sections."""
    spec = {
        "model": {"path": str(tiny_policy(root)), "dtype": "float32"},
        "dataset": {"builtin": {"numTrain": 64}},
        "algorithm": {
            "steps": steps,
            "promptsPerStep": 4,
            "groupSize": 4,
            "maxNewTokens": 16,
            "learningRate": 1e-2,
            "seed": 3,
        },
        "speculative": {"mode": "off"},
        "checkpoint": {"intervalSteps": 1, "keep": 2},
        **sections,
    }
    path = root / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "resume-test"},
                "spec": spec,
            }
        )
    )
    return path


def env() -> dict[str, str]:
    """The subprocess environment: one thread per process, this checkout's `tlt` first on the path, then this
    folder (for the test plug-ins)."""
    out = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    out["PYTHONPATH"] = os.pathsep.join(
        [str(Path(cli.__file__).parents[1]), str(Path(__file__).parent), out.get("PYTHONPATH", "")]
    )
    out.pop("RAY_ADDRESS", None)
    return out


def train_args(run_file: Path, out: Path, local: bool = True) -> list[str]:
    return ["train", str(run_file), "--out", str(out), *(["--local"] if local else [])]


def tlt(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tlt.cli", *args], env=env(), capture_output=True, text=True, timeout=timeout
    )


def start(args: list[str], log: Path) -> subprocess.Popen:
    """`tlt ARGS` in the background, stdout and stderr to `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tlt.cli", *args], env=env(), stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def wait_for_steps(proc: subprocess.Popen, out: Path, steps: int, timeout: float = 600) -> None:
    """Until `out`'s metrics.jsonl lists `steps` steps; fails when the run ends first."""
    deadline = time.monotonic() + timeout
    while len(metrics(out)) < steps:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before step {steps}: lengthen it"
        assert time.monotonic() < deadline, f"no step {steps} within {timeout} s"
        time.sleep(0.05)


def deterministic(rows: list[dict], timing: set[str] = TIMING_KEYS) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in timing} for row in rows]


def assert_same_weights(got: Path, want: Path) -> None:
    a = load_file(str(got / "policy" / "model.safetensors"))
    b = load_file(str(want / "policy" / "model.safetensors"))
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"weights differ bitwise after resume: {differ[:5]}"


def ray_train(run: Any, out: Path, holder: dict, on_event: Any, **options: Any) -> tuple[Any, list[dict], list[dict]]:
    """Train `run` into `out` with `ray_trainer` in this process (the warm-start policy, Ray shut down after),
    calling `on_event` on each event; `holder["trainer"]` is the trainer from before its first step. Returns
    (trainer, metrics, events). `options`: ray_trainer's (num_cpus, stop_trainers_at, ...)."""
    import ray

    from tlt.runtime.ray_executor import ray_trainer
    from tlt.tasks.warmstart import reduced_config

    try:
        trainer = ray_trainer(run, out, warmstart=reduced_config(), on_event=on_event, **options)
        holder["trainer"] = trainer
        history = trainer.train()
    finally:
        ray.shutdown()
    return trainer, history, events(out)
