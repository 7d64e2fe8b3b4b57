"""Whole-run checkpoint and resume of `tlt train`, killed with SIGKILL:

- killed inside a checkpoint write (files written, folder not yet renamed) and again at a random
  point, then resumed, the run ends with bitwise the same policy weights and the same metrics as an
  uninterrupted run (CPU, fixed seeds, SD off), and metrics.jsonl lists every step exactly once;
- an unreadable checkpoint stops the run with a clear error and is left as it was;
- a checkpoint of a different run is refused, not overwritten.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tlt import cli
from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.tasks.tokenizer import build_task_tokenizer

pytestmark = pytest.mark.slow

STEPS = 8
KILL_IN_SAVE_STEP = 2
HOOK = Path(__file__).with_name("_loop_kill_hook.py")
TIMING_KEYS = {"rollout_seconds", "tail_seconds", "tail_fraction", "tokens_per_second", "update_seconds",
               "step_seconds"}


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(cli.__file__).parents[1]), env.get("PYTHONPATH", "")])
    return env


def _train_cmd(run_file: Path, out: Path) -> list[str]:
    return ["train", str(run_file), "--out", str(out), "--local"]


def _tlt(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tlt.cli", *args], env=_env(), capture_output=True, text=True,
                          timeout=600)


def _metrics(out: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _deterministic(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume")
    tokenizer = build_task_tokenizer()
    save_policy(tiny_model("qwen2", vocab_size=len(tokenizer), seed=11), tokenizer, root / "policy-init")
    spec = {
        "apiVersion": "tlt.dev/v1alpha1",
        "kind": "TLTTrainingRun",
        "metadata": {"name": "resume-test"},
        "spec": {
            "model": {"path": str(root / "policy-init"), "dtype": "float32"},
            "dataset": {"builtin": {"numTrain": 64}},
            "algorithm": {"steps": STEPS, "promptsPerStep": 4, "groupSize": 4, "maxNewTokens": 16,
                          "learningRate": 1e-2, "seed": 3},
            "speculative": {"mode": "off"},
            "checkpoint": {"intervalSteps": 1, "keep": 2},
        },
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def reference(run_file: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    done = _tlt(_train_cmd(run_file, out))
    assert done.returncode == 0, done.stderr
    return out


def _kill_at_random_point(run_file: Path, out: Path, rng: random.Random) -> None:
    """Start a resume, wait until it has finished a random number of further steps, sleep a random
    fraction of a step, SIGKILL it."""
    before = len(_metrics(out))
    wait_for = before + rng.randint(1, 3)
    proc = subprocess.Popen([sys.executable, "-m", "tlt.cli", *_train_cmd(run_file, out)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while len(_metrics(out)) < wait_for and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.2))
        proc.send_signal(signal.SIGKILL)
    finally:
        code = proc.wait()
    assert code == -signal.SIGKILL, f"the run ended on its own (exit {code}) before the kill: lengthen it"


def _assert_same_weights(got: Path, want: Path) -> None:
    a = load_file(str(got / "policy" / "model.safetensors"))
    b = load_file(str(want / "policy" / "model.safetensors"))
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"weights differ bitwise after resume: {differ[:5]}"


def test_killed_runs_resume_to_bitwise_equal_weights(run_file: Path, reference: Path, tmp_path: Path):
    out = tmp_path / "killed"
    in_save = subprocess.run([sys.executable, str(HOOK), str(KILL_IN_SAVE_STEP), *_train_cmd(run_file, out)],
                             env=_env(), capture_output=True, text=True, timeout=600)
    assert in_save.returncode == -signal.SIGKILL, in_save.stderr
    ckpts = out / "checkpoints"
    partial = list(ckpts.glob(f".tmp-step-{KILL_IN_SAVE_STEP:08d}-*"))
    assert partial and (partial[0] / "manifest.json").is_file(), "the kill must land after the files were written"
    assert (ckpts / "LATEST").read_text() == f"step-{KILL_IN_SAVE_STEP - 1:08d}"
    assert len(_metrics(out)) == KILL_IN_SAVE_STEP  # the step ran; its checkpoint did not land

    seed = int(os.environ.get("TLT_TEST_KILL_SEED", "20261122"))
    _kill_at_random_point(run_file, out, random.Random(seed))

    done = _tlt(_train_cmd(run_file, out))
    assert done.returncode == 0, done.stderr
    _assert_same_weights(out, reference)
    rows = _metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), "metrics.jsonl must list each step once"
    assert _deterministic(rows) == _deterministic(_metrics(reference))


def test_finished_run_rerun_changes_nothing(run_file: Path, reference: Path, tmp_path: Path):
    out = tmp_path / "again"
    shutil.copytree(reference, out)
    assert cli.main(_train_cmd(run_file, out)) == 0
    _assert_same_weights(out, reference)
    assert _metrics(out) == _metrics(reference)


def test_unreadable_checkpoint_is_reported_not_replaced(run_file: Path, reference: Path, tmp_path: Path, capsys):
    out = tmp_path / "corrupt"
    shutil.copytree(reference, out)
    latest = out / "checkpoints" / (out / "checkpoints" / "LATEST").read_text()
    weights = latest / "policy.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[-1] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    listing = sorted(p.name for p in (out / "checkpoints").iterdir())

    assert cli.main(_train_cmd(run_file, out)) == 1
    err = capsys.readouterr().err
    assert "policy.safetensors is corrupt" in err and "cannot resume" in err
    assert weights.read_bytes() == bytes(damaged)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == listing


def test_checkpoint_of_another_run_is_refused(run_file: Path, reference: Path, tmp_path: Path, capsys):
    out = tmp_path / "other"
    shutil.copytree(reference, out)
    other = yaml.safe_load(run_file.read_text())
    other["spec"]["algorithm"]["seed"] = 4
    other_file = tmp_path / "other.yaml"
    other_file.write_text(yaml.safe_dump(other))
    assert cli.main(_train_cmd(other_file, out)) == 1
    assert "algorithm.seed: checkpoint 3, run file 4" in capsys.readouterr().err
    assert _metrics(out) == _metrics(reference)
