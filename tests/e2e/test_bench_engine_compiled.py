"""`tlt bench engine --part compiled --quick`: the pipeline runs and its steady state is what the engine
promises: no recompiles and no full guard checks in the timed rounds, every top-level key present."""

from __future__ import annotations

import json

import torch

from tlt.cli import main


def test_compiled_part_quick_reports_a_warm_steady_state(tmp_path):
    path = tmp_path / "compiled.json"
    threads = torch.get_num_threads()
    try:
        assert main(["bench", "engine", "--part", "compiled", "--quick", "--json", str(path)]) == 0
    finally:
        torch.set_num_threads(threads)  # the bench sets the process's threads
    report = json.loads(path.read_text())
    for key in ("compiled_vs_eager", "compiled_vs_hf", "bound_ratio", "host_overhead_fraction", "recompiles"):
        assert key in report, key
    shape = report["compiled"]["shapes"][0]
    assert shape["recompiles"] == 0 and report["recompiles"] == 0
    assert shape["full_guard_calls_timed"] == 0, "a warm step skips the full guard check"
    assert report["compiled"]["config"]["calls"] == 5
    assert set(report["compiled_vs_eager"]) == {"1", "2"}
