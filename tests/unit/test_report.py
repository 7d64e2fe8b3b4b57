"""The end-of-run report: step-time split, stop-latency percentiles, idle seconds, the rollout mode and
partial rollouts' off-policy share, files written."""

from __future__ import annotations

import json

import pytest

from tlt.runtime.report import percentile, rollout_summary, step_split, summarize, write_report


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


def partial_step(n: int, share: float, staleness: dict[str, int]) -> dict:
    return step(n) | {
        "rollout_mode": "partial",
        "off_policy_fraction": share,
        "staleness_tokens": staleness,
        "groups_trained": 8,
        "groups_kept": 2,
        "groups_dropped": n - 1,
        "groups_continued": 2 if n > 1 else 0,
    }


def test_partial_summary_sums_staleness_and_lists_each_steps_groups():
    history = [partial_step(1, 0.0, {"0": 900}), partial_step(2, 0.25, {"0": 600, "1": 200}), partial_step(3, 0.5, {})]
    r = rollout_summary(history)
    assert r["mode"] == "partial"
    assert r["staleness_tokens"] == {0: 1500, 1: 200}
    assert r["steps"][1] == (2, 0.25, 8, 2, 1, 2)


def test_a_run_from_before_partial_rollouts_reads_as_sync():
    assert rollout_summary([step(1), step(2)]) == {"mode": "sync", "steps": [], "staleness_tokens": {}}
    sync = step(1) | {"rollout_mode": "sync", "off_policy_fraction": 0.0}
    assert rollout_summary([sync])["mode"] == "sync"


def test_report_of_a_partial_run_shows_off_policy_share_and_groups(tmp_path):
    history = [partial_step(1, 0.0, {"0": 900}), partial_step(2, 0.5, {"0": 400, "2": 400})]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))
    text = write_report(tmp_path).read_text()
    assert "Rollout mode: partial." in text
    assert "off-policy share of trained tokens mean 0.250, max 0.500" in text
    assert "trained tokens by staleness in steps: 0: 1300, 2: 400." in text
    assert "| 2 | 0.500 | 8 | 2 | 1 | 2 |" in text


def test_report_of_a_sync_run_has_no_partial_section(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(step(1)) + "\n")
    text = write_report(tmp_path).read_text()
    assert "Rollout mode: sync." in text and "Partial rollouts" not in text
