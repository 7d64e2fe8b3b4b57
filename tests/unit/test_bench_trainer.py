"""`tlt bench trainer`: the on / off summary's arithmetic, the config's and flags' refusals, and a quick run of
the real bench (a spot-trainer process beside a decode loop; never checks timings)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tlt.bench.trainer_beside import TrainerBesideConfig, beside_summary
from tlt.commands.bench_trainer import arms

WORKLOAD = Path("bench/workload.yaml")


def rec(arm, batch, round_, state, seconds, tokens=100):
    return {"arm": arm, "batch": batch, "round": round_, "state": state, "tokens": tokens, "seconds": seconds}


def test_summary_pairs_rounds_and_reports_medians_and_ranges():
    records = [
        rec("plain", 1, 0, "off", 1.0),
        rec("plain", 1, 0, "on", 1.25),  # on / off 0.8
        rec("plain", 1, 1, "on", 1.0),
        rec("plain", 1, 1, "off", 1.0),  # 1.0
        rec("plain", 1, 2, "off", 2.0),
        rec("plain", 1, 2, "on", 2.5),  # 0.8, both slow
        rec("chain-3", 4, 0, "off", 0.5),
        rec("chain-3", 4, 0, "on", 0.5),
    ]
    plain, chain = beside_summary(records)
    assert (plain["arm"], plain["batch"], plain["rounds"]) == ("plain", 1, 3)
    assert plain["on_over_off"] == pytest.approx(0.8) and plain["on_over_off_range"] == pytest.approx([0.8, 1.0])
    assert plain["tokens_per_s_off"] == pytest.approx(100.0) and plain["tokens_per_s_on"] == pytest.approx(80.0)
    # paired by round: a slow round (2) slows both states and leaves its ratio alone
    assert chain["on_over_off"] == pytest.approx(1.0) and chain["tokens_per_s_on"] == pytest.approx(200.0)


def test_summary_refuses_unpaired_rounds_bad_states_and_times():
    with pytest.raises(ValueError, match="rounds \\[1\\] lack"):
        beside_summary([rec("plain", 1, 0, "off", 1.0), rec("plain", 1, 0, "on", 1.0), rec("plain", 1, 1, "on", 1.0)])
    with pytest.raises(ValueError, match="state must be one of"):
        beside_summary([rec("plain", 1, 0, "maybe", 1.0)])
    with pytest.raises(ValueError, match="seconds must be > 0"):
        beside_summary([rec("plain", 1, 0, "off", 0.0)])


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("rounds", 0, "rounds must be >= 1"),
        ("requests", 0, "requests must be >= 1"),
        ("threads", 0, "threads must be >= 1"),
        ("batches", (0,), "batches must be >= 1"),
        ("arms", ("chain-0",), "is not plain or chain-<k>"),
        ("arms", ("tree",), "is not plain or chain-<k>"),
        ("arms", (), "at least one arm"),
        ("settle_seconds", -1.0, "settle_seconds must be >= 0"),
    ],
)
def test_config_refuses_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainerBesideConfig(workload=WORKLOAD, **{field: value})


def test_compute_probe_counts_its_products():
    from tlt.bench.trainer_beside import compute_probe

    products, seconds = compute_probe(products=3, size=8)
    assert products == 3 and seconds > 0


def test_arms_flag_parses_and_refuses():
    assert arms("plain, chain-3") == ("plain", "chain-3")
    for bad in ("", "chain-", "chain-0", "plain,tree-2"):
        with pytest.raises(argparse.ArgumentTypeError, match="--arms"):
            arms(bad)


def test_quick_bench_decodes_beside_a_training_process():
    from tlt.bench.trainer_beside import run_trainer_beside

    cfg = TrainerBesideConfig(
        workload=WORKLOAD,
        quick=True,
        rounds=2,
        requests=2,
        batches=(1, 2),
        arms=("plain", "chain-2"),
        settle_seconds=0.1,
    )
    result = run_trainer_beside(cfg)
    rows = {(r["arm"], r["batch"]) for r in result["rows"]}
    assert rows == {("plain", 1), ("chain-2", 1), ("plain", 2), ("chain-2", 2), ("compute-probe", 0)}
    assert all(r["rounds"] == 2 and r["tokens_per_s_on"] > 0 and r["tokens_per_s_off"] > 0 for r in result["rows"])
    assert result["trainer_tokens_per_s"] > 0, "the trainer process trained while it was on"
    # coupled sampling: the same tokens with the trainer on and off, only the time they take differs
    tokens = {
        (r["arm"], r["batch"], r["round"], r["state"]): r["tokens"]
        for r in result["records"]
        if r["arm"] != "compute-probe"
    }
    assert all(tokens[(a, b, k, "on")] == tokens[(a, b, k, "off")] for a, b, k, _ in tokens)
    assert result["config"]["trainer_rows"] >= 1


def test_a_trainer_process_that_dies_fails_the_bench(monkeypatch):
    """No "on" round is timed without a trainer: a process that exits before it trains is an error, not a result."""
    import functools
    import sys

    import tlt.bench.trainer_beside as beside

    # a picklable target the spawned child can run: it exits at once (sys.exit refuses the extra arguments)
    monkeypatch.setattr(beside, "_train_beside", functools.partial(sys.exit, 3))
    cfg = TrainerBesideConfig(workload=WORKLOAD, quick=True, rounds=1, requests=1, arms=("plain",), settle_seconds=0.0)
    with pytest.raises(RuntimeError, match="exited .* before it started training"):
        beside.run_trainer_beside(cfg)
