"""`python -m tlt.sim.measure`: measures each requested context and the workload's own, writes the
workload context's costs at the top level and the requested ones under `contexts`, names the machine; a
bad `--contexts` is refused before anything is measured. The measurement itself (`policy_costs`) is
`tlt bench run`'s, tested there; here it is replaced by a recorder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tlt.bench.run as bench_run
from tlt.sim.measure import main

WORKLOAD = Path(__file__).resolve().parents[2] / "bench" / "workload-deep-v1.yaml"


@pytest.fixture
def measured(monkeypatch) -> list[int]:
    contexts: list[int] = []

    def fake_costs(workload):
        context = int(workload.costs["context"])
        contexts.append(context)
        return [{"batch": 1, "width": 1, "seconds": context * 1e-5}], [{"batch": 1, "ratio": context * 1e-3}]

    monkeypatch.setattr(bench_run, "policy_costs", fake_costs)
    return contexts


def test_writes_the_workload_context_on_top_and_the_requested_ones_under_contexts(measured, tmp_path):
    out = tmp_path / "costs.json"
    assert main(["--workload", str(WORKLOAD), "--contexts", "320, 32,32", "--out", str(out)]) == 0
    assert measured == [32, 128, 320]  # each once, the workload's own 128 included
    doc = json.loads(out.read_text())
    assert doc["context"] == 128
    assert doc["verify"] == [{"batch": 1, "width": 1, "seconds": 128e-5}]
    assert doc["drafter"] == [{"batch": 1, "ratio": 128e-3}]
    assert sorted(doc["contexts"], key=int) == ["32", "320"]
    assert doc["contexts"]["320"]["verify"][0]["seconds"] == pytest.approx(320e-5)
    assert doc["machine"]["usable_cpus"] >= 1 and "load_average" in doc


@pytest.mark.parametrize("contexts", ["0,32", "abc", "", "-4"])
def test_bad_contexts_are_refused_before_measuring(measured, tmp_path, capsys, contexts):
    with pytest.raises(SystemExit) as exc:
        main(["--workload", str(WORKLOAD), "--contexts", contexts, "--out", str(tmp_path / "c.json")])
    assert exc.value.code == 2
    assert "--contexts must be positive integers" in capsys.readouterr().err
    assert measured == [] and not (tmp_path / "c.json").exists()
