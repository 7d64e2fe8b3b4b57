"""StepSplit: a decode step's wall time by part, counted around the engine's own calls; undone on exit."""

from __future__ import annotations

import pytest

from tlt.models.block_drafter import new_block_drafter
from tlt.models.tiny import tiny_model
from tlt.rollout.block import BlockChainDrafter
from tlt.rollout.decode_step import PlainStepper
from tlt.rollout.drafting import NgramDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.runner import ModelRunner
from tlt.rollout.speculative import SpeculativeStepper
from tlt.rollout.step_timing import StepSplit, merge_tables, pool_ranges, range_of, seconds_by_range
from tlt.rollout.types import Request, SamplingParams


def _requests(n: int, new: int) -> list[Request]:
    return [
        Request(f"r{i}", [3, 4, 5, 3, 4, 5, 3, 4], SamplingParams(temperature=0.0, max_new_tokens=new))
        for i in range(n)
    ]


def test_every_decode_step_is_counted_once_with_its_parts_and_the_patches_are_undone():
    model = tiny_model(seed=0)
    originals = (PlainStepper.step, SpeculativeStepper.step, ModelRunner.forward)
    engine = Engine(model, max_batch_size=2, max_context=64)
    steps = []
    with StepSplit() as split:
        split.label = "plain/"
        engine.generate(_requests(2, 6), on_step=steps.append)
        engine.stepper = SpeculativeStepper(engine.runner, NgramDrafter(3, 1, 3))
        split.label = "sd/"
        engine.generate(_requests(1, 6), on_step=steps.append)
    assert (PlainStepper.step, SpeculativeStepper.step, ModelRunner.forward) == originals
    table = split.table()
    assert set(table) == {"plain/plain", "sd/sd:NgramDrafter3"}
    decode = [m for m in steps if m.step > 0]
    assert sum(c["steps"] for r in table.values() for c in r.values()) == len(decode)
    plain = table["plain/plain"]["2-4"]
    assert {"target_forward", "lm_head", "sample", "commit", "mask", "host"} <= set(plain)
    assert 0 < plain["target_forward"] < plain["total"]
    assert plain["host"] == pytest.approx(plain["total"] - plain["target_forward"] - plain["lm_head"])
    sd = table["sd/sd:NgramDrafter3"]["1"]
    assert {"propose", "verify", "sample", "target_forward"} <= set(sd)
    # outside the context manager nothing is counted any more
    engine.generate(_requests(1, 3))
    assert split.table() == table


def test_a_fallback_plain_step_counts_inside_its_speculative_step():
    model = tiny_model(seed=0)
    engine = Engine(model, max_batch_size=1, max_context=16)  # 8-token prompt: drafts stop fitting soon
    engine.stepper = SpeculativeStepper(engine.runner, NgramDrafter(4, 1, 3))
    with StepSplit() as split:
        engine.generate(_requests(1, 7))
    assert engine.stepper.stats.plain_fallbacks > 0
    assert list(split.table()) == ["sd:NgramDrafter4"]


def test_range_of_names_the_running_batch_range():
    assert [range_of(n) for n in (1, 2, 4, 5, 16, 17, 300)] == ["1", "2-4", "2-4", "5-8", "9-16", "17+", "17+"]
    with pytest.raises(ValueError, match="rows must be >= 1"):
        range_of(0)


def test_seconds_by_range_sums_each_running_batch_into_its_range():
    assert seconds_by_range({1: 1.0, 3: 0.5, 4: 0.25, 16: 2.0, 40: 1.0}) == {
        "1": 1.0,
        "2-4": 0.75,
        "5-8": 0,
        "9-16": 2.0,
        "17+": 1.0,
    }


def test_merge_tables_weights_each_part_by_its_steps():
    a = {"plain": {"1": {"steps": 1, "total": 3.0, "host": 1.0}}}
    b = {"plain": {"1": {"steps": 3, "total": 1.0, "host": 0.5}, "2-4": {"steps": 2, "total": 4.0}}}
    assert merge_tables([a, b]) == {
        "plain": {"1": {"steps": 4, "host": 0.625, "total": 1.5}, "2-4": {"steps": 2, "total": 4.0}}
    }
    assert merge_tables([]) == {}


def test_a_block_step_counts_its_drafter_graph_inside_its_proposal():
    model = tiny_model(seed=0)
    engine = Engine(model, max_batch_size=1, max_context=64, return_hidden=True)
    engine.stepper = SpeculativeStepper(engine.runner, BlockChainDrafter(new_block_drafter(model, block_size=3), 3))
    with StepSplit() as split:
        engine.generate(_requests(1, 6))
    (cell,) = split.table()["sd:BlockChainDrafter3"].values()
    assert 0 < cell["draft_graph"] <= cell["propose"] < cell["total"]
    assert cell["host"] == pytest.approx(cell["total"] - cell["target_forward"] - cell["lm_head"] - cell["draft_graph"])


def test_pool_ranges_weights_each_range_by_its_steps():
    ranges = {"1": {"steps": 1, "total": 4.0, "draft_graph": 1.0}, "2-4": {"steps": 3, "total": 8.0}}
    assert pool_ranges(ranges) == {"steps": 4, "total": pytest.approx(7.0), "draft_graph": pytest.approx(0.25)}
