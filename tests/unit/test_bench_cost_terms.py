"""`tlt bench costs`: shapes, bad input, the break-even arithmetic, and a tiny CPU run through the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tlt.bench.cost_terms import SHAPES, CostsConfig, break_even, costs_table, model_config, run_costs
from tlt.bench.cost_timing import _clock_for, cost_ratio, drafter_ratio
from tlt.cli import main
from tlt.models.tiny import tiny_config


@pytest.mark.parametrize(
    ("shape", "billions"), [("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.544), ("qwen2.5-7b", 7.616)]
)
def test_shapes_have_the_published_parameter_counts(shape, billions):
    """Built on the meta device (no memory): the counts the model cards publish."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(CostsConfig(shape=shape)))
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.001)


def test_bad_input_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="--shape must be one of"):
        model_config(CostsConfig(shape="gpt-5"))
    with pytest.raises(ValueError, match="exactly one of --shape"):
        model_config(CostsConfig(shape=None, config=None))
    with pytest.raises(ValueError, match="--config: .* does not exist"):
        model_config(CostsConfig(shape=None, config=tmp_path / "nope.json"))
    with pytest.raises(ValueError, match="--batches and --depths"):
        run_costs(CostsConfig(batches=(0,)))
    with pytest.raises(ValueError, match="--device must be a torch device"):
        run_costs(CostsConfig(device="gpu0"))
    with pytest.raises(ValueError, match="--device must be cpu or cuda"):
        run_costs(CostsConfig(device="meta"))
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        run_costs(CostsConfig(dtype="int8"))  # refused before any model is built


def test_only_the_wall_clock_times_a_cuda_device():
    with pytest.raises(ValueError, match="cannot time a CUDA device"):
        _clock_for("cpu", torch.device("cuda"))
    with pytest.raises(ValueError, match="clock must be one of"):
        _clock_for("sundial", torch.device("cpu"))
    now, _ = _clock_for("wall", torch.device("cuda"))  # no device touched until sync is called
    assert now() > 0


@pytest.fixture
def tiny_config_file(tmp_path):
    tiny_config(
        "qwen2", vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64
    ).save_pretrained(tmp_path)
    return tmp_path / "config.json"


def test_run_costs_on_a_tiny_config(tiny_config_file):
    cfg = CostsConfig(
        shape=None, config=tiny_config_file, dtype="float32", batches=(1, 2), depths=(1, 3), context=8, repeats=1
    )
    result = run_costs(cfg)
    assert result["layers"] == 2 and result["device_name"] is None and result["clock"] == "cpu"
    assert {(p["batch"], p["width"]) for p in result["verify"]} == {(b, w) for b in (1, 2) for w in (1, 2, 4)}
    from tlt.bench.cost_timing import CostPoint, DrafterCost

    verify = [CostPoint(**p) for p in result["verify"]]
    drafter = [DrafterCost(**d) for d in result["drafter"]]
    for row in result["break_even"]:
        b, d = row["batch"], row["depth"]
        assert row["accept_length"] == pytest.approx(cost_ratio(verify, b, d + 1) + d * drafter_ratio(drafter, b))
        assert row["accept_length"] == pytest.approx(break_even(verify, drafter, b, d))
    assert costs_table(result).row_count == 2


def test_cli_writes_json_and_refuses_bad_input(tiny_config_file, tmp_path, capsys):
    out = tmp_path / "costs.json"
    assert (
        main(
            [
                "bench",
                "costs",
                "--config",
                str(tiny_config_file),
                "--dtype",
                "float32",
                "--batches",
                "1",
                "--depths",
                "2",
                "--context",
                "8",
                "--repeats",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    saved = json.loads(out.read_text())
    assert saved["break_even"][0]["depth"] == 2 and "machine" in saved
    assert main(["bench", "costs", "--shape", "nope"]) == 2
    assert "--shape must be one of" in capsys.readouterr().out
    assert set(SHAPES) >= {"qwen2.5-0.5b", "qwen2.5-7b"}
