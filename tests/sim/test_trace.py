"""Traces: parametric long tails, JSONL of lengths, a run's metrics.jsonl."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tlt.sim.trace import load_trace, parametric_trace


def test_lognormal_trace_has_the_asked_shape_median_and_cap():
    trace = parametric_trace("lognormal:median=500,sigma=1.0,n=4000,max=3000", steps=2, seed=1)
    assert len(trace) == 2 and all(len(step) == 4000 for step in trace)
    lengths = np.array(trace[0])
    assert 450 < np.median(lengths) < 550
    assert lengths.max() == 3000 and lengths.min() >= 1


def test_pareto_trace_starts_at_its_minimum_and_is_seeded():
    a = parametric_trace("pareto:min=100,alpha=1.5,n=500", steps=1, seed=3)
    assert min(a[0]) >= 100
    assert a == parametric_trace("pareto:min=100,alpha=1.5,n=500", steps=1, seed=3)
    assert a != parametric_trace("pareto:min=100,alpha=1.5,n=500", steps=1, seed=4)


@pytest.mark.parametrize(
    "text, message",
    [
        ("gamma:k=1", "trace kind must be one of"),
        ("lognormal:median=5,n=3", "needs sigma"),
        ("pareto:min=1,alpha=2,n=3,shape=4", "pareto trace takes min, alpha, n"),
        ("lognormal:median=-5,sigma=1,n=3", "must be > 0"),
    ],
)
def test_bad_parametric_traces_say_what_is_allowed(text, message):
    with pytest.raises(ValueError, match=message):
        parametric_trace(text, steps=1, seed=0)


def test_jsonl_of_lists_or_objects_and_a_run_folder(tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text(
        "[3, 4]\n\n" + json.dumps({"lengths": [5]}) + "\n" + json.dumps({"response_lengths": [6, 7]}) + "\n"
    )
    assert load_trace(str(path), steps=10) == [[3, 4], [5], [6, 7]]
    assert load_trace(str(path), steps=1) == [[3, 4]]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "response_lengths": [9, 1]}) + "\n")
    assert load_trace(str(run), steps=5) == [[9, 1]]


def test_a_step_without_lengths_names_its_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "response_length_mean": 4.0}) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: a step needs a non-empty list of lengths"):
        load_trace(str(path), steps=1)
