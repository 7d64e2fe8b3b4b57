"""The sd bench's drafter costs: one block draft per (batch, depth), eager and compiled, and its fraction of
a target step (never checks timings)."""

from __future__ import annotations

import pytest

from tlt.bench.sd_costs import block_cost_fraction, block_step_costs
from tlt.models.block_drafter import new_block_drafter
from tlt.models.tiny import tiny_model


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_block_step_costs_time_every_batch_and_depth(compile):
    policy = tiny_model("qwen2", vocab_size=32, seed=2)
    block = new_block_drafter(policy, block_size=4, feature_layers=(0,))
    points = block_step_costs((1, 3), (2, 4), 1, block, policy, compile=compile)
    assert [(p["batch"], p["block"]) for p in points] == [(1, 2), (1, 4), (3, 2), (3, 4)]
    assert all(0 < p["seconds"] <= p["seconds_median"] for p in points)


def test_block_cost_fraction_divides_by_the_chosen_target_steps():
    costs = {
        "verify": [{"batch": 1, "width": 1, "seconds": 2.0}, {"batch": 1, "width": 4, "seconds": 3.0}],
        "verify_compiled": [{"batch": 1, "width": 1, "seconds": 1.0}],
        "block_step": [{"batch": 1, "block": 4, "seconds": 0.5}],
    }
    assert block_cost_fraction(costs) == {"4": {"1": 0.25}}
    assert block_cost_fraction(costs, "block_step", "verify_compiled") == {"4": {"1": 0.5}}
