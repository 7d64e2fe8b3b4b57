"""`tlt bench drafter --quick` writes every (step shape, learning rate) curve from one warm drafter.

Structure only (the quick config measures little): each curve starts from the same warm drafter on
the same held-out positions, records the steps and update counts it was asked for, and agreements are
fractions; the JSON and the table come out of one CLI run.
"""

from __future__ import annotations

import json

from tlt.bench.online_drafter import OnlineDrafterBenchConfig
from tlt.cli import main


def test_bench_drafter_quick_writes_a_curve_per_shape_and_rate(tmp_path, capsys):
    path = tmp_path / "drafter.json"
    assert main(["bench", "drafter", "--quick", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "grpo-2x2" in printed and "distinct-4x1" in printed
    result = json.loads(path.read_text())["online_drafter"]
    cfg = OnlineDrafterBenchConfig.quick()
    assert [(r["shape"], r["learning_rate"]) for r in result["rows"]] == [
        (shape, lr) for shape in cfg.shapes for lr in cfg.learning_rates
    ]
    assert result["heldout_positions"] > 0
    for row in result["rows"]:
        prompts, samples = cfg.shapes[row["shape"]]
        assert (row["prompts_per_step"], row["samples_per_prompt"]) == (prompts, samples)
        assert [p["step"] for p in row["curve"]] == [0, *cfg.report_after]
        assert [p["updates"] for p in row["curve"]] == [0, *(s * cfg.updates_per_step for s in cfg.report_after)]
        assert all(0.0 <= p["agreement"] <= 1.0 for p in row["curve"])
    assert len({row["curve"][0]["agreement"] for row in result["rows"]}) == 1, "curves start from different drafters"
