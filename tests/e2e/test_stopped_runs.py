"""SIGTERM to a real `tlt train` process, in both runtimes: it finishes the step under way, writes its
checkpoint, says so in one line and in events.jsonl, and exits 0; rerun, it resumes there and ends with
bitwise the same policy and the same metrics as an undisturbed run. A second signal stops it at once
(exit 143), the last checkpoint intact.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from _train_runs import (
    assert_same_weights,
    deterministic,
    events,
    metrics,
    start,
    tlt,
    train_args,
    wait_for_steps,
    write_run,
)

from tlt.checkpoint.store import LATEST, load_latest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LOCAL_STEPS = 24  # ~0.15 s a step here: long enough that the run is still going when the signal lands
RAY_STEPS = 6


def _stop_with_sigterm(args: list[str], out, log, after_steps: int, timeout: float = 600) -> int:
    proc = start(args, log)
    try:
        wait_for_steps(proc, out, after_steps, timeout)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _assert_stopped_with_checkpoint(out, log, code: int) -> int:
    """The stopped run's promises; returns the step it stopped after."""
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    stopped = [e for e in events(out) if e["type"] == "stop"]
    assert len(stopped) == 1 and stopped[0]["signal"] == "SIGTERM", events(out)
    step = len(metrics(out))
    assert stopped[0]["checkpoint"] == str(out / "checkpoints" / f"step-{step:08d}")
    assert (out / "checkpoints" / LATEST).read_text() == f"step-{step:08d}"
    assert load_latest(out / "checkpoints").step == step
    assert f"on SIGTERM after step {step}/" in text and "rerun the same command to resume" in text
    assert not (out / "policy").exists(), "a stopped run wrote the final policy"
    return step


def test_sigterm_stops_a_local_run_with_a_checkpoint_and_resume_matches(tmp_path):
    run = write_run(tmp_path, "local", LOCAL_STEPS)
    reference = tmp_path / "undisturbed"
    assert tlt(train_args(run, reference)).returncode == 0
    out, log = tmp_path / "stopped", tmp_path / "stopped.log"
    step = _assert_stopped_with_checkpoint(out, log, _stop_with_sigterm(train_args(run, out), out, log, 2))
    assert 2 <= step < LOCAL_STEPS
    done = tlt(train_args(run, out))
    assert done.returncode == 0, done.stderr
    assert f"resuming resume-test at step {step}/{LOCAL_STEPS}" in done.stderr
    assert_same_weights(out, reference)
    assert [m["step"] for m in metrics(out)] == list(range(1, LOCAL_STEPS + 1))
    assert deterministic(metrics(out)) == deterministic(metrics(reference))


def test_a_second_signal_stops_at_once_and_the_last_checkpoint_stands(tmp_path):
    """The first SIGTERM asks for the stop; a second, once the first was taken, ends the process at once with
    143, in the middle of the step. The reward plug-in `_slow_reward` makes a step last ~1.6 s."""
    run = write_run(tmp_path, "twice", LOCAL_STEPS, verifier={"reward": "_slow_reward:reward"})
    out, log = tmp_path / "twice", tmp_path / "twice.log"
    proc = start(train_args(run, out), log)
    try:
        wait_for_steps(proc, out, 2)
        time.sleep(0.3)  # past step 2's checkpoint: in step 3's rollout or rewards
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while "SIGTERM received" not in log.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text(errors="replace")
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "second SIGTERM: stopping now, without a checkpoint" in text
    assert len(metrics(out)) == 2, "step 3 was finished: the second signal did not stop the run at once"
    assert load_latest(out / "checkpoints").step == 2
    lines = (out / "events.jsonl").read_text().splitlines() if (out / "events.jsonl").exists() else []
    stops = [e for e in map(json.loads, lines) if e["type"] == "stop"]
    assert not stops, "the stop was not at once: it reached the stop event"


def test_sigterm_stops_a_ray_run_with_a_checkpoint_and_resume_matches(tmp_path):
    """Ray mode: the driver's handler is the run's, not Ray's (which aborted the process with SIGABRT, no
    checkpoint); the trainer actors stop, the checkpoint is written, Ray is shut down, exit 0."""
    run = write_run(tmp_path, "ray", RAY_STEPS, rollout={"replicas": 1}, verifier={"replicas": 1})
    out, log = tmp_path / "stopped", tmp_path / "stopped.log"
    step = _assert_stopped_with_checkpoint(out, log, _stop_with_sigterm(train_args(run, out, local=False), out, log, 2))
    assert step < RAY_STEPS
    done = tlt(train_args(run, out, local=False))
    assert done.returncode == 0, done.stderr[-3000:]
    reference = tmp_path / "undisturbed"
    undisturbed = tlt(train_args(run, reference, local=False))
    assert undisturbed.returncode == 0, undisturbed.stderr[-3000:]
    assert_same_weights(out, reference)
    assert [m["step"] for m in metrics(out)] == list(range(1, RAY_STEPS + 1))
    assert deterministic(metrics(out)) == deterministic(metrics(reference))
