"""The KFP train component on SIGTERM (a pod evicted, a run cancelled): the step under way finishes with a
checkpoint and the task fails with 143, so a retry on the same work folder resumes there."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from _kfp_helpers import cached_warm_start, small_run_spec

from tlt.runtime.trainer import Trainer
from tlt.spec.run import ObjectMeta, RunSpec, TLTTrainingRun
from tlt_components.train import train_local


def test_sigterm_checkpoints_the_step_and_fails_the_task_with_143(tmp_path: Path, monkeypatch):
    spec = small_run_spec(cached_warm_start(), "off")
    spec["algorithm"]["steps"] = 3
    run = TLTTrainingRun(metadata=ObjectMeta(name="stop"), spec=RunSpec.model_validate(spec))
    first_step = Trainer.train_step

    def step_then_sigterm(self):
        metrics = first_step(self)
        if metrics["step"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # as the kubelet does; the component's handler takes it
        return metrics

    monkeypatch.setattr(Trainer, "train_step", step_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        train_local(run, "local", tmp_path / "work", tmp_path / "policy", tmp_path / "drafter")
    assert stopped.value.code == 143
    assert (tmp_path / "work" / "checkpoints" / "LATEST").read_text() == "step-00000001"
    assert signal.getsignal(signal.SIGTERM) == before, "the previous handler is back"
