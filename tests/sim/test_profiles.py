"""Hardware profiles: the roofline's memory-bound decode, the measured bench costs, the data files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tlt.sim.measured import MeasuredCost
from tlt.sim.profiles import builtin_gpus, builtin_models, load_cost_model

FIXTURE = Path(__file__).parent / "fixtures" / "bench_costs_tiny.json"


def test_every_builtin_gpu_and_model_loads():
    assert builtin_gpus() == ["a100", "h100", "h20", "h200"]
    assert builtin_models() == ["llama-3.3-70b", "qwen2.5-32b", "qwen2.5-7b"]
    for gpu in builtin_gpus():
        for model in builtin_models():
            cost = load_cost_model(gpu, model=model)
            assert 0 < cost.target_seconds(1, 1, 1024) < cost.target_seconds(256, 1, 1024)


def test_verify_is_nearly_free_at_batch_1_on_h100_but_not_at_batch_32_on_h20():
    h100, h20 = load_cost_model("h100"), load_cost_model("h20")
    assert h100.target_seconds(1, 5, 1000) / h100.target_seconds(1, 1, 1000) < 1.01
    assert h100.target_seconds(32, 5, 1000) / h100.target_seconds(32, 1, 1000) < 1.2
    assert h20.target_seconds(32, 5, 1000) / h20.target_seconds(32, 1, 1000) > 2.0


def test_higher_bandwidth_decodes_faster_and_tp_splits_the_weights():
    assert load_cost_model("h200").target_seconds(8, 1, 1000) < load_cost_model("h100").target_seconds(8, 1, 1000)
    one = load_cost_model("h100", model="llama-3.3-70b")
    eight = load_cost_model("h100", model="llama-3.3-70b", tp=8)
    assert eight.target_seconds(1, 1, 1000) < one.target_seconds(1, 1, 1000) / 4


def test_measured_profile_reproduces_its_points_and_extends_past_them():
    bench = json.loads(FIXTURE.read_text())
    cost = MeasuredCost.from_bench(bench, update_seconds_per_token=1e-3, sync_seconds=0.2)
    plain = {p["batch"]: p["seconds"] for p in bench["costs"]["verify"] if p["width"] == 1}
    for batch, seconds in plain.items():
        assert cost.target_seconds(batch, 1, 64) == pytest.approx(seconds)
    wide = next(p for p in bench["costs"]["verify"] if p["batch"] == 4 and p["width"] == 8)
    assert cost.target_seconds(4, 8, 64) == pytest.approx(wide["seconds"], rel=1e-6)
    assert cost.target_seconds(64, 1, 64) > cost.target_seconds(16, 1, 64)
    assert cost.target_seconds(4, 64, 64) == pytest.approx(8 * cost.target_seconds(4, 8, 64))
    first = bench["costs"]["drafter_step"][0]
    assert cost.drafter_seconds(first["batch"], 64) == pytest.approx(first["seconds"])
    assert cost.update_seconds(1000, 2) == pytest.approx(0.5)
    assert cost.sync_seconds() == 0.2


def test_a_bench_json_needs_the_update_cost_and_its_costs_section(tmp_path):
    with pytest.raises(ValueError, match="--calibrate-run"):
        load_cost_model(str(FIXTURE))
    empty = tmp_path / "bench.json"
    empty.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="--part sd"):
        load_cost_model(str(empty), update_cost=(1e-3, 0.0))


def test_a_measured_profile_yaml_points_at_its_bench(tmp_path):
    (tmp_path / "bench.json").write_text(FIXTURE.read_text())
    (tmp_path / "local.yaml").write_text(
        "kind: measured\nbench: bench.json\nupdate_seconds_per_token: 2.0e-3\nsync_seconds: 0.1\n"
    )
    cost = load_cost_model(str(tmp_path / "local.yaml"))
    assert cost.update_seconds(10, 1) == pytest.approx(0.02)
    (tmp_path / "bad.yaml").write_text("kind: roofline\nname: x\n")
    with pytest.raises(ValueError, match="missing"):
        load_cost_model(str(tmp_path / "bad.yaml"))
    with pytest.raises(ValueError, match="neither a built-in gpu"):
        load_cost_model("b200")


def test_bench_run_costs_json_reads_like_the_engine_bench(tmp_path):
    costs = json.loads(FIXTURE.read_text())["costs"]
    run_costs = tmp_path / "costs.json"
    run_costs.write_text(
        json.dumps({"verify": costs["verify"], "drafter": [{**d, "ratio": 0.2} for d in costs["drafter_step"]]})
    )
    a = load_cost_model(str(FIXTURE), update_cost=(1e-3, 0.0))
    b = load_cost_model(str(run_costs), update_cost=(1e-3, 0.0))
    assert [a.target_seconds(8, 3, 64), a.drafter_seconds(8, 64)] == [
        b.target_seconds(8, 3, 64),
        b.drafter_seconds(8, 64),
    ]
