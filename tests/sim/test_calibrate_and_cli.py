"""Prediction vs a run's measured steps, the H20 check, and the `tlt simulate` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tlt.cli import main
from tlt.sim.accept import AcceptCurve
from tlt.sim.accuracy_checks import h20_check
from tlt.sim.calibrate import compare_run, update_cost
from tlt.sim.measured import MeasuredCost
from tlt.sim.step import ClusterConfig, Variant, simulate_step
from tlt.spec.run import RunSpec

FIXTURE = Path(__file__).parent / "fixtures" / "bench_costs_tiny.json"


def _history(per_token: float, prompt_len: int, held_scale: float, bench: dict) -> list[dict]:
    lengths = [[5, 9, 20, 3], [7, 7, 30, 1], [12, 4, 4, 16], [2, 25, 6, 8]]
    cost = MeasuredCost.from_bench(bench, per_token, 0.0)
    cluster = ClusterConfig(prompt_len=prompt_len)
    history = []
    for step, lens in enumerate(lengths, 1):
        update = per_token * (sum(lens) + prompt_len * len(lens))
        predicted = simulate_step(lens, Variant("vanilla"), cost, cluster, [None]).step_seconds
        history.append(
            {"step": step, "response_lengths": lens, "update_seconds": update, "step_seconds": predicted * held_scale}
        )
    return history


def test_update_cost_is_seconds_per_prompt_or_response_token():
    history = [{"response_lengths": [10, 30], "update_seconds": 1.0}, {"response_lengths": [20], "update_seconds": 2.0}]
    assert update_cost(history, prompt_len=10) == pytest.approx(3.0 / (40 + 20 + 30))


@pytest.mark.parametrize("scale", [1.0, 1.25])
def test_compare_run_fits_the_update_on_the_first_half_and_scores_the_second(scale):
    bench = json.loads(FIXTURE.read_text())
    spec = RunSpec.model_validate({"speculative": {"mode": "off"}})
    history = _history(2e-3, 16, scale, bench)
    out = compare_run(history, bench, spec, ClusterConfig(prompt_len=16), AcceptCurve())
    assert out["variant"] == "vanilla"
    assert out["update_seconds_per_token"] == pytest.approx(2e-3)
    assert [s["step"] for s in out["steps"]] == [3, 4]
    assert out["error"] == pytest.approx(abs(1 - scale) / scale)


def test_compare_run_needs_recorded_lengths():
    bench = json.loads(FIXTURE.read_text())
    with pytest.raises(ValueError, match="without --local"):
        compare_run(
            [{"step": 1, "update_seconds": 1.0, "step_seconds": 2.0}] * 3,
            bench,
            RunSpec(),
            ClusterConfig(),
            AcceptCurve(),
        )


def test_h20_switches_sd_off_at_large_batches_and_h100_keeps_drafting():
    h20 = h20_check("h20", steps=2)
    h100 = h20_check("h100", steps=2)
    assert h20["sd_off"] is True
    assert h20["adaptive"]["speedup"] >= h20["forced"]["speedup"]
    assert h100["adaptive"]["plain_share_batch_ge_32"] < 0.3 < h20["adaptive"]["plain_share_batch_ge_32"]


def test_tlt_simulate_writes_the_table_png_and_json(tmp_path):
    out_json, png = tmp_path / "sim.json", tmp_path / "step.png"
    rc = main(
        [
            "simulate",
            "--trace",
            "lognormal:median=300,sigma=1,n=64,max=4096",
            "--hardware",
            "h20",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--steps",
            "2",
            "--png",
            str(png),
            "--json",
            str(out_json),
            "--accept",
            "alpha0=0.6,tau=50",
        ]
    )
    assert rc == 0
    result = json.loads(out_json.read_text())
    assert set(result["summary"]) == {"vanilla", "static", "tlt"}
    assert result["cluster"]["replicas"] == 4 and result["cluster"]["update_gpus"] == 8
    assert result["summary"]["static"]["final_alpha"] == 0.6
    assert len(result["steps"]["tlt"]) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tlt_simulate_rejects_bad_arguments_by_name(tmp_path, capsys):
    assert (
        main(
            [
                "simulate",
                "--trace",
                "lognormal:median=300,sigma=1,n=8",
                "--gpus",
                "6",
                "--tp",
                "4",
                "--png",
                str(tmp_path / "x.png"),
            ]
        )
        == 2
    )
    assert "--gpus must be a positive multiple" in capsys.readouterr().out
    assert (
        main(
            [
                "simulate",
                "--trace",
                "lognormal:median=300,sigma=1,n=8",
                "--accept",
                "beta=1",
                "--png",
                str(tmp_path / "x.png"),
            ]
        )
        == 2
    )
    assert "--accept keys are" in capsys.readouterr().out
