"""`tlt bench run` on a time-to-accuracy workload: the pinned file, its refusals in one line, the summary's
arithmetic on made-up runs (never timings), and the `--quick` pipeline through the Ray loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from tlt.bench.accuracy import is_accuracy_workload, load_accuracy_workload, variant_run
from tlt.bench.accuracy_summary import accuracy_at, curve, summarize, time_to

WORKLOAD = Path(__file__).resolve().parents[2] / "bench" / "time-to-accuracy-v1.yaml"


def test_the_pinned_workload_runs_four_variants_with_a_target():
    assert is_accuracy_workload(WORKLOAD)
    workload = load_accuracy_workload(WORKLOAD)
    assert list(workload.variants) == ["vanilla", "tlt", "partial", "partial+tlt"] and len(workload.seeds) == 3
    assert 0 < workload.target <= 1
    runs = {v: variant_run(workload, v, 0).spec for v in workload.variants}
    assert [s.algorithm.rollout.mode for s in runs.values()] == ["sync", "sync", "partial", "partial"]
    assert [s.speculative.mode for s in runs.values()] == ["off", "tlt", "off", "tlt"]
    assert variant_run(workload, "tlt", 2).spec.algorithm.seed == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("target: 1.5", "target must be a held-out accuracy in (0, 1]"),
        ("seeds: []", "seeds must be a non-empty list"),
        ("  partial:\n    algorithm: {rollout: {overProvision: 0.5}}", "variants.partial"),
    ],
)
def test_a_bad_workload_is_refused_in_one_line(tmp_path, change, message):
    text = WORKLOAD.read_text()
    key = change.split(":")[0]
    if key.strip() == "partial":
        text = text.replace("variants:\n", "variants:\n" + change + "\n", 1).replace(
            "  partial:\n    speculative", "  partial-old:\n    speculative", 1
        )
    else:
        text = "\n".join(change if line.startswith(key + ":") else line for line in text.splitlines())
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_accuracy_workload(bad)


def _run(variant, seed, accuracies, seconds=10.0, off_policy=0.0):
    steps = [
        {
            "step": i + 1,
            "step_seconds": seconds,
            "rollout_seconds": seconds / 2,
            "samples": 64,
            "eval_accuracy": a,
            "off_policy_fraction": off_policy,
        }
        for i, a in enumerate(accuracies)
    ]
    return {"variant": variant, "seed": seed, "steps": steps}


def test_curves_times_and_equal_time_accuracy():
    points = curve(_run("vanilla", 0, [None, 0.2, None, 0.5])["steps"])
    assert points == [(2, 20.0, 128, 0.2), (4, 40.0, 256, 0.5)]
    assert time_to(points, 0.5) == 40.0 and time_to(points, 0.6) is None
    assert accuracy_at(points, 39.0) == 0.2 and accuracy_at(points, 10.0) is None


def test_the_summary_compares_each_variant_with_vanilla_seed_by_seed():
    runs = [
        _run("vanilla", 0, [None, 0.2, None, 0.5]),
        _run("vanilla", 1, [None, 0.3, None, 0.4]),
        _run("tlt", 0, [None, 0.2, None, 0.5], seconds=8.0),
        _run("tlt", 1, [None, 0.3, None, 0.4], seconds=8.0),
        _run("partial", 0, [None, 0.5, None, 0.5], seconds=5.0, off_policy=0.25),
        _run("partial", 1, [None, 0.1, None, 0.3], seconds=5.0, off_policy=0.25),
    ]
    report = summarize(runs, target=0.5, variants=["vanilla", "tlt", "partial"])
    assert report["equal_seconds"] == 20.0, "partial's median run: 4 steps of 5 s"
    v, t, p = (report["variants"][n] for n in ("vanilla", "tlt", "partial"))
    assert v["reached"] == 1 and v["seconds_to_target"]["median"] == 40.0
    assert p["seconds_to_target_by_seed"] == {0: 10.0, 1: None}
    assert report["ratios_to_vanilla"]["partial"]["time_to_target_speedup"]["median"] == 4.0
    assert report["ratios_to_vanilla"]["tlt"]["run_speedup"]["median"] == pytest.approx(1.25)
    assert p["accuracy_at_equal_seconds"]["median"] == pytest.approx(0.4), "0.5 and 0.3 after 4 steps of 5 s"
    assert v["accuracy_at_equal_seconds"]["median"] == pytest.approx(0.25), "0.2 and 0.3 after 2 steps of 10 s"
    assert p["accuracy_by_step"]["2"] == {"median": 0.3, "min": 0.1, "max": 0.5, "n": 2}
    assert p["off_policy_fraction"]["median"] == 0.25
    assert report["identical_curves"] == {"tlt = vanilla": {"0": True, "1": True}}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_accuracy_bench_runs_every_variant_through_the_rl_loop(tmp_path):
    from tlt.bench.accuracy import plot_accuracy, print_accuracy_report, run_accuracy_bench

    workload = load_accuracy_workload(WORKLOAD, quick=True)
    report = run_accuracy_bench(workload, work_dir=tmp_path)
    assert len(report["runs"]) == len(workload.variants) * len(workload.seeds)
    for run in report["runs"]:
        assert [s["step"] for s in run["steps"]] == [1, 2] and all(s["eval_accuracy"] is not None for s in run["steps"])
        partial = run["variant"].startswith("partial")
        assert all((s["off_policy_fraction"] > 0) == (partial and s["step"] > 1) or not partial for s in run["steps"])
    assert all(report["identical_curves"][pair]["0"] for pair in ("tlt = vanilla", "partial+tlt = partial"))
    lines: list[str] = []
    print_accuracy_report(report, lines.append)
    assert any(line.startswith("partial+tlt |") for line in lines)
    assert plot_accuracy(report, tmp_path / "accuracy.png").stat().st_size > 0
    assert len(report["workload"]["warmstart_weights_sha256"]) == 64
