"""The demo's side-by-side comparison: totals, ratios and per-step rows from two metric histories."""

from __future__ import annotations

import json

import pytest

from tlt.runtime.demo_report import compare, write_demo_report


def _steps(rollout: list[float], reward: list[float], accept=None) -> list[dict]:
    return [
        {
            "step": i + 1,
            "rollout_seconds": r,
            "step_seconds": r + 1.0,
            "update_seconds": 1.0,
            "generated_tokens": 100,
            "reward_mean": w,
            "accept_length": None if accept is None else accept[i],
            "idle_seconds": 2.0,
            "harvested_seconds": 1.5 if accept else 0.0,
            "sd_arms": {"history-d4": 3},
            "sd_by_position": {"0": [4, 4 * i], "64": [2, 1]} if accept else {},
        }
        for i, (r, w) in enumerate(zip(rollout, reward))
    ]


def test_compare_sums_ratios_and_pairs_steps():
    c = compare(_steps([4.0, 4.0, 4.0], [0.5, 0.6, 0.7]), _steps([2.0, 2.0], [0.5, 0.8], accept=[3.0, 4.0]))
    assert c["steps"] == 2  # the shorter run sets the steps compared
    assert c["rollout_seconds"] == {"vanilla": 8.0, "tlt": 4.0} and c["rollout_speedup"] == 2.0
    assert c["step_speedup"] == pytest.approx(10.0 / 6.0)
    assert c["reward"]["tlt"] == {"first": 0.5, "last": 0.8}
    assert c["accept_length_mean"] == 3.5 and c["harvested_seconds"] == 3.0
    # both steps pooled: 8 row-steps from position 0 accepting 0 then 4 drafts, 4 from 64 accepting 2
    assert c["accept_by_position"] == {
        "0": {"accept_length": 1.5, "row_steps": 8},
        "64": {"accept_length": 1.5, "row_steps": 4},
    }
    assert [r["tlt_rollout"] for r in c["per_step"]] == [2.0, 2.0]


def test_compare_refuses_an_empty_run():
    with pytest.raises(ValueError, match="at least one step"):
        compare([], _steps([1.0], [0.1]))


def test_report_is_written_beside_both_runs(tmp_path):
    for name, steps in (("vanilla", _steps([4.0], [0.5])), ("tlt", _steps([2.0], [0.6], accept=[3.0]))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    path, c = write_demo_report(tmp_path, tmp_path / "vanilla", tmp_path / "tlt", machine="AMD EPYC, 2 usable CPUs")
    text = path.read_text()
    assert "| rollout seconds | 4.0 | 2.0 | 2.00x |" in text and (tmp_path / "side_by_side.png").stat().st_size > 0
    assert "Measured on: AMD EPYC, 2 usable CPUs." in text
    assert (
        "Accept length by response position (tokens generated before the step): 0+ 1.00 (4 row-steps), "
        "64+ 1.50 (2 row-steps)." in text
    )


@pytest.mark.parametrize("tlt_reward, same", [(0.5, True), (0.6, False)])
def test_report_says_whether_the_samples_matched(tmp_path, tlt_reward, same):
    for name, steps in (("vanilla", _steps([4.0], [0.5])), ("tlt", _steps([2.0], [tlt_reward], accept=[3.0]))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    text = write_demo_report(tmp_path, tmp_path / "vanilla", tmp_path / "tlt")[0].read_text()
    assert ("TLT generated what vanilla generated, step for step" in text) is same
    assert ("here some samples differ" in text) is not same


def test_held_out_accuracy_is_shown_for_both_runs(tmp_path):
    for name, accuracy in (("vanilla", [0.25, 0.5]), ("tlt", [0.25, 0.5])):
        steps = _steps([4.0, 4.0], [0.5, 0.6])
        for step, value in zip(steps, accuracy):
            step.update(eval_accuracy=value, eval_reward_mean=value, eval_samples=8, eval_seconds=1.0)
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    path, c = write_demo_report(tmp_path, tmp_path / "vanilla", tmp_path / "tlt")
    assert c["heldout"]["tlt"] == [(1, 0.25), (2, 0.5)]
    assert (
        "| held-out accuracy, by step | step 1: 0.250 -> step 2: 0.500 | step 1: 0.250 -> step 2: 0.500 | |"
        in path.read_text()
    )
