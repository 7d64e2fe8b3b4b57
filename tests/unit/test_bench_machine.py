"""What a benchmark result records about where and from what it ran (`tlt.bench.machine`)."""

from __future__ import annotations

import hashlib

import torch
from safetensors.torch import save_file

from tlt.bench.machine import cpu_model, file_sha256, machine_info, weights_sha256
from tlt.bench.run_cli import machine_line


def test_cpu_model_reads_the_model_name_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t: avx2\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 7B13\n"
    )
    assert cpu_model(info) == "AMD EPYC 7B13"


def test_cpu_model_falls_back_without_cpuinfo(tmp_path, monkeypatch):
    monkeypatch.setattr("platform.processor", lambda: "arm")
    assert cpu_model(tmp_path / "missing") == "arm"
    monkeypatch.setattr("platform.processor", lambda: "")
    assert cpu_model(tmp_path / "missing") is None


def test_machine_info_names_this_host():
    info = machine_info()
    assert info["torch"] == torch.__version__
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert 1 <= info["usable_cpus"] <= info["logical_cpus"]


def test_weights_hash_is_the_files_sha256_and_changes_with_one_value(tmp_path):
    save_file({"w": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    first = weights_sha256(tmp_path)
    assert first == hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    assert file_sha256(tmp_path / "model.safetensors") == first
    save_file({"w": torch.tensor([0.0, 0.0, 0.0, 1e-7])}, str(tmp_path / "model.safetensors"))
    assert weights_sha256(tmp_path) != first
    assert weights_sha256(tmp_path / "empty") is None


def test_machine_line_names_cpu_and_weights():
    report = {
        "machine": {"cpu_model": "AMD EPYC", "usable_cpus": 2, "cpu_capability": "AVX2", "torch": "2.13.0"},
        "workload": {"warmstart": {"weights_sha256": "ab" * 32}, "drafter_warmstart": {"weights_sha256": "cd" * 32}},
    }
    line = machine_line(report)
    assert "AMD EPYC, 2 usable CPUs, AVX2 kernels" in line
    assert "sha256 abababababab, drafter cdcdcdcdcdcd" in line
    # a result written before machines were recorded still prints
    assert "unknown CPU" in machine_line({"workload": {"warmstart": {}, "drafter_warmstart": None}})
