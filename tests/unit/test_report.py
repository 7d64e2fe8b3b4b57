"""The end-of-run report: step-time split, stop-latency percentiles, idle seconds, files written."""

from __future__ import annotations

import json

import pytest

from tlt.runtime.report import percentile, step_split, summarize, write_report


def step(n: int, *, acks: list[tuple[float, float]] = (), agreement: float | None = 0.3) -> dict:
    return {
        "step": n,
        "reward_mean": 0.1 * n,
        "rollout_seconds": 4.0,
        "tail_seconds": 1.5,
        "update_seconds": 2.0,
        "step_seconds": 7.0,
        "idle_seconds": 3.0,
        "harvested_seconds": 2.5,
        "drafter_updates": 4,
        "drafter_agreement": agreement,
        "response_lengths": [3, 5, 40],
        "trainer_acks": [{"requested_at": r, "acked_at": a} for r, a in acks],
    }


def test_step_time_splits_into_rollout_tail_update_other():
    assert step_split(step(1)) == {"rollout": 2.5, "tail": 1.5, "update": 2.0, "other": 1.0}


def test_percentiles_by_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([], 50) is None


def test_summary_collects_stop_latencies_idle_time_and_restarts():
    history = [step(1, acks=[(10.0, 10.01), (10.0, 10.03)]), step(2, acks=[(20.0, 20.02)], agreement=0.6)]
    events = [{"type": "restart", "failed_step": 2, "resumed_step": 1, "error": "ActorDiedError"}]
    s = summarize(history, events)
    assert s["stop_latency"]["count"] == 3
    assert s["stop_latency"]["p50"] == pytest.approx(0.02)
    assert s["stop_latency"]["max"] == pytest.approx(0.03)
    assert s["idle_seconds"] == 6.0 and s["harvested_seconds"] == 5.0
    assert s["drafter_first"] == 0.3 and s["drafter_last"] == 0.6
    assert len(s["restarts"]) == 1


def test_write_report_draws_every_plot_and_links_it(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(step(n)) + "\n" for n in (1, 2, 3)))
    report = write_report(tmp_path, title="demo")
    text = report.read_text()
    for name in ("step_time.png", "reward_drafter.png", "lengths.png", "idle.png"):
        assert (tmp_path / name).stat().st_size > 1000
        assert f"({name})" in text
    assert "| 3 | 0.300 |" in text


def test_report_without_steps_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no steps"):
        write_report(tmp_path)
