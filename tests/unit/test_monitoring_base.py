"""The metrics interface: flat scalars from a step's dict, the SD on-fraction, the fan-out, jsonl always
on, and a backend whose library is missing fails at start with its pip command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tlt.monitoring import Loggers, MissingBackendError, build_loggers, scalars, sd_on_fraction
from tlt.spec.run import MonitoringSpec


def test_scalars_keep_finite_numbers_and_add_the_on_fraction():
    step = {
        "step": 3,
        "reward_mean": 0.5,
        "accept_length": None,
        "ok": True,
        "trace": [1, 2],
        "worker_states": {"a": 1},
        "loss": float("nan"),
        "sd_arms": {"plain": 1, "chain-d4": 3},
    }
    assert scalars(step) == {"step": 3.0, "reward_mean": 0.5, "sd_on_fraction": 0.75}


def test_sd_on_fraction_counts_steps_that_drafted():
    assert sd_on_fraction({"chain-d4": 2, "tree-d4k2v8": 2}) == 1.0
    assert sd_on_fraction({"plain": 4}) == 0.0
    assert sd_on_fraction({}) is None


class _Recorder:
    def __init__(self, calls: list[str], name: str):
        self.calls, self.name = calls, name

    def log_step(self, metrics):
        self.calls.append(f"{self.name}.step{metrics['step']}")

    def log_figures(self, figures, step):
        self.calls.append(f"{self.name}.figures{len(figures)}@{step}")

    def close(self):
        self.calls.append(f"{self.name}.close")


def test_loggers_fan_out_in_order():
    calls: list[str] = []
    loggers = Loggers([_Recorder(calls, "a"), _Recorder(calls, "b")])
    loggers.log_step({"step": 1})
    loggers.log_figures([Path("x.png")], 1)
    loggers.close()
    assert calls == ["a.step1", "b.step1", "a.figures1@1", "b.figures1@1", "a.close", "b.close"]


def test_jsonl_is_always_on(tmp_path: Path):
    loggers = build_loggers(MonitoringSpec(loggers=[]), tmp_path)
    loggers.log_step({"step": 1, "reward_mean": 0.25, "trace": [[0, 1]]})
    loggers.log_step({"step": 2, "reward_mean": 0.5})
    loggers.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"reward_mean": 0.25, "step": 1, "trace": [[0, 1]]}, {"reward_mean": 0.5, "step": 2}]


@pytest.mark.parametrize("backend", ["wandb", "mlflow", "tensorboard"])
def test_missing_library_fails_at_start_with_the_install_command(tmp_path: Path, monkeypatch, backend: str):
    monkeypatch.setitem(sys.modules, backend, None)  # `import backend` raises ImportError
    with pytest.raises(MissingBackendError, match=rf"pip install {backend}") as err:
        build_loggers(MonitoringSpec(loggers=["jsonl", backend]), tmp_path)
    assert f"monitoring.loggers includes {backend!r}" in str(err.value)


def test_spec_names_the_allowed_loggers():
    assert MonitoringSpec().loggers == ["jsonl"] and MonitoringSpec().metrics_port == 8080
    with pytest.raises(ValidationError, match="tensorboard"):
        MonitoringSpec.model_validate({"loggers": ["statsd"]})
    with pytest.raises(ValidationError, match="metricsPort"):
        MonitoringSpec.model_validate({"metricsPort": 80})
