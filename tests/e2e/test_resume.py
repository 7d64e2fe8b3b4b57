"""Whole-run checkpoint and resume of `tlt train`, killed with SIGKILL:

- killed inside a checkpoint write (files written, folder not yet renamed) and again at a random
  point, then resumed, the run ends with bitwise the same policy weights and the same metrics as an
  uninterrupted run (CPU, fixed seeds, SD off), and metrics.jsonl lists every step exactly once;
- a damaged newest checkpoint: by default (`checkpoint.onCorrupt: fallback`) the run resumes from the one
  before, says so loudly and ends as the uninterrupted run; with `fail` it stops with one line and leaves
  every checkpoint as it was;
- a checkpoint of a different run is refused, not overwritten.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _train_runs import assert_same_weights, deterministic, env, events, metrics, tlt, train_args, write_run

from tlt import cli

pytestmark = pytest.mark.slow

STEPS = 8
KILL_IN_SAVE_STEP = 2
HOOK = Path(__file__).with_name("_loop_kill_hook.py")


@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("resume"), "run", STEPS)


@pytest.fixture(scope="module")
def reference(run_file: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    done = tlt(train_args(run_file, out))
    assert done.returncode == 0, done.stderr
    return out


def _kill_at_random_point(run_file: Path, out: Path, rng: random.Random) -> None:
    """Start a resume, wait until it has finished a random number of further steps, sleep a random
    fraction of a step, SIGKILL it."""
    before = len(metrics(out))
    wait_for = before + rng.randint(1, 3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tlt.cli", *train_args(run_file, out)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        while len(metrics(out)) < wait_for and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.2))
        proc.send_signal(signal.SIGKILL)
    finally:
        code = proc.wait()
    assert code == -signal.SIGKILL, f"the run ended on its own (exit {code}) before the kill: lengthen it"


def test_killed_runs_resume_to_bitwise_equal_weights(run_file: Path, reference: Path, tmp_path: Path):
    out = tmp_path / "killed"
    in_save = subprocess.run(
        [sys.executable, str(HOOK), str(KILL_IN_SAVE_STEP), *train_args(run_file, out)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert in_save.returncode == -signal.SIGKILL, in_save.stderr
    ckpts = out / "checkpoints"
    partial = list(ckpts.glob(f".tmp-step-{KILL_IN_SAVE_STEP:08d}-*"))
    assert partial and (partial[0] / "manifest.json").is_file(), "the kill must land after the files were written"
    assert (ckpts / "LATEST").read_text() == f"step-{KILL_IN_SAVE_STEP - 1:08d}"
    assert len(metrics(out)) == KILL_IN_SAVE_STEP  # the step ran; its checkpoint did not land

    seed = int(os.environ.get("TLT_TEST_KILL_SEED", "20261122"))
    _kill_at_random_point(run_file, out, random.Random(seed))

    done = tlt(train_args(run_file, out))
    assert done.returncode == 0, done.stderr
    assert_same_weights(out, reference)
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), "metrics.jsonl must list each step once"
    assert deterministic(rows) == deterministic(metrics(reference))


def test_finished_run_rerun_changes_nothing(run_file: Path, reference: Path, tmp_path: Path):
    out = tmp_path / "again"
    shutil.copytree(reference, out)
    assert cli.main(train_args(run_file, out)) == 0
    assert_same_weights(out, reference)
    assert metrics(out) == metrics(reference)


def _damage_newest(reference: Path, out: Path) -> Path:
    """A copy of the finished run whose newest checkpoint's weights have one byte flipped; that file."""
    shutil.copytree(reference, out)
    weights = out / "checkpoints" / (out / "checkpoints" / "LATEST").read_text() / "policy.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[-1] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    return weights


def test_damaged_newest_checkpoint_falls_back_to_the_one_before(run_file: Path, reference: Path, tmp_path: Path):
    out = tmp_path / "fallback"
    _damage_newest(reference, out)
    done = tlt(train_args(run_file, out))
    assert done.returncode == 0, done.stderr
    assert (
        f"CHECKPOINT DAMAGED: {out / 'checkpoints' / f'step-{STEPS:08d}'}: policy.safetensors is corrupt" in done.stderr
        and f"resuming from the intact step-{STEPS - 1:08d}" in done.stderr
    )
    damaged = [e for e in events(out) if e["type"] == "checkpoint_damaged"]
    assert len(damaged) == 1 and damaged[0]["resumed_step"] == STEPS - 1
    assert damaged[0]["moved_to"] == f"corrupt-step-{STEPS:08d}"
    assert (out / "checkpoints" / f"corrupt-step-{STEPS:08d}" / "policy.safetensors").is_file()
    assert_same_weights(out, reference)  # step 8 redone from step 7, bit for bit
    assert deterministic(metrics(out)) == deterministic(metrics(reference))


def test_damaged_checkpoint_with_on_corrupt_fail_stops_with_one_line(
    run_file: Path, reference: Path, tmp_path: Path, capsys
):
    out = tmp_path / "corrupt"
    weights = _damage_newest(reference, out)
    damaged = weights.read_bytes()
    listing = sorted(p.name for p in (out / "checkpoints").iterdir())
    strict = yaml.safe_load(run_file.read_text())
    strict["spec"]["checkpoint"]["onCorrupt"] = "fail"
    strict_file = tmp_path / "strict.yaml"
    strict_file.write_text(yaml.safe_dump(strict))

    assert cli.main(train_args(strict_file, out)) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert "cannot resume" in err[0] and "policy.safetensors is corrupt" in err[0]
    assert weights.read_bytes() == damaged
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == listing


def test_checkpoint_of_another_run_is_refused(run_file: Path, reference: Path, tmp_path: Path, capsys):
    out = tmp_path / "other"
    shutil.copytree(reference, out)
    other = yaml.safe_load(run_file.read_text())
    other["spec"]["algorithm"]["seed"] = 4
    other_file = tmp_path / "other.yaml"
    other_file.write_text(yaml.safe_dump(other))
    assert cli.main(train_args(other_file, out)) == 1
    assert "algorithm.seed: checkpoint 3, run file 4" in capsys.readouterr().err
    assert metrics(out) == metrics(reference)


def test_a_full_disk_stops_the_run_with_one_line_and_the_last_checkpoint_intact(
    run_file: Path, tmp_path: Path, monkeypatch, capsys
):
    """The third checkpoint's write hits ENOSPC (injected into the weights writer): exit 1, one line naming
    checkpoint.path and the bytes needed, no partial folder, step 2 still the resume point."""
    from tlt.checkpoint import store as checkpoint

    real = checkpoint.save_file

    def full_on_third(tensors, path):
        if f"step-{3:08d}" in path:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tensors, path)

    monkeypatch.setattr(checkpoint, "save_file", full_on_third)
    out = tmp_path / "full"
    assert cli.main(train_args(run_file, out)) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and f"checkpoint.path {out / 'checkpoints'}" in err[0], err
    assert "No space left on device" in err[0] and "bytes" in err[0] and "step-00000002 is intact" in err[0]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["LATEST", "step-00000001", "step-00000002"]
