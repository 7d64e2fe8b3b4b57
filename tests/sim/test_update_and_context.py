"""The update's padded-token cost, its fixed + per-token fit, and context-dependent measured costs (timing-free)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tlt.sim.calibrate import fit_update
from tlt.sim.measured import MeasuredCost, context_points
from tlt.sim.step import ClusterConfig, Variant, simulate_step, update_tokens

FIXTURE = Path(__file__).parent / "fixtures" / "bench_costs_tiny.json"


def test_update_tokens_pad_each_sorted_micro_batch_to_its_longest():
    lengths = [10, 1, 30, 5]
    # sorted by length: [30, 10] then [5, 1]; + prompt 2 -> rows padded to 32 and 7
    assert update_tokens(lengths, 2, micro_batch_size=2, layout="sorted") == 2 * 32 + 2 * 7
    # batch order: [10, 1] then [30, 5] -> padded to 12 and 32
    assert update_tokens(lengths, 2, micro_batch_size=2, layout="padded") == 2 * 12 + 2 * 32
    assert update_tokens(lengths, 2, micro_batch_size=2, layout="packed") == sum(lengths) + 4 * 2
    assert update_tokens(lengths, 2) == sum(lengths) + 4 * 2  # micro_batch_size 0: unpadded


def test_step_update_uses_the_cluster_micro_batches(linear_cost):
    lengths = [10, 1, 30, 5]
    plain = simulate_step(lengths, Variant("vanilla"), linear_cost, ClusterConfig(prompt_len=2), [None])
    padded = simulate_step(
        lengths, Variant("vanilla"), linear_cost, ClusterConfig(prompt_len=2, micro_batch_size=2), [None]
    )
    assert plain.update_seconds == pytest.approx(linear_cost.update_per_token * 54)
    assert padded.update_seconds == pytest.approx(linear_cost.update_per_token * 78)


def test_cluster_rejects_unknown_update_layout():
    with pytest.raises(ValueError, match="update_layout"):
        ClusterConfig(update_layout="zigzag")


@pytest.mark.parametrize(
    ("tokens", "seconds", "expected"),
    [
        ([100, 200, 300], [3.0, 5.0, 7.0], (1.0, 0.02)),  # exact line
        ([100, 200], [4.0, 3.0], (3.5, 0.0)),  # negative slope -> the mean, no per-token term
        ([100, 200], [0.5, 2.5], (0.0, 3.0 / 300)),  # negative intercept -> proportional
        ([100, 100], [2.0, 4.0], (3.0, 0.0)),  # one token count: fixed only
    ],
)
def test_fit_update_is_a_nonnegative_least_squares_line(tokens, seconds, expected):
    fixed, per_token = fit_update(tokens, seconds)
    assert fixed == pytest.approx(expected[0])
    assert per_token == pytest.approx(expected[1])


def test_fit_update_needs_matching_lists():
    with pytest.raises(ValueError):
        fit_update([], [])


def _with_contexts(bench: dict, scales: dict[int, float]) -> dict:
    """The fixture's costs, plus a contexts section whose width-1 and drafter costs are the fixture's x scale."""
    costs = dict(bench["costs"])
    costs["contexts"] = {
        str(c): {
            "verify": [{**p, "seconds": p["seconds"] * k} for p in costs["verify"]],
            "drafter": [{**d, "seconds": d["seconds"] * k} for d in costs["drafter_step"]],
        }
        for c, k in scales.items()
    }
    return costs


def test_measured_cost_interpolates_in_context():
    bench = json.loads(FIXTURE.read_text())
    flat = MeasuredCost.from_bench(bench, 0.0, 0.0)
    ctx = MeasuredCost.from_bench(_with_contexts(bench, {32: 1.0, 128: 2.0}), 0.0, 0.0)
    assert [c for c, _, _ in ctx.contexts] == [32, 128]
    for batch in (1, 3):
        base = flat.target_seconds(batch, 1, 64)
        assert ctx.target_seconds(batch, 1, 32) == pytest.approx(base)
        assert ctx.target_seconds(batch, 1, 80) == pytest.approx(1.5 * base)
        assert ctx.target_seconds(batch, 1, 224) == pytest.approx(3.0 * base)  # past 128: the outer slope
        assert ctx.target_seconds(batch, 2, 80) == pytest.approx(1.5 * flat.target_seconds(batch, 2, 64))
        assert ctx.drafter_seconds(batch, 128) == pytest.approx(2.0 * flat.drafter_seconds(batch, 64))
    assert flat.target_seconds(2, 1, 10) == flat.target_seconds(2, 1, 1000)  # no contexts: context-free


def test_context_points_need_both_curves():
    assert context_points({"verify": []}) == ()
    with pytest.raises(ValueError, match="contexts"):
        context_points({"contexts": {"64": {"verify": [], "drafter": []}}})


def test_compare_run_recovers_slowdown_overhead_and_fixed_update():
    """Steps built with decode costs x 1.5, a 0.3 s rollout overhead and a 2 s + 1e-3 s/token update are
    predicted exactly from the first half's fit."""
    from dataclasses import replace

    from tlt.sim.accept import AcceptCurve
    from tlt.sim.calibrate import compare_run
    from tlt.spec.run import RunSpec

    bench = json.loads(FIXTURE.read_text())
    cluster = ClusterConfig(replicas=2, prompt_len=6, micro_batch_size=2)
    base = MeasuredCost.from_bench(bench, 1e-3, 2.0)
    slow = replace(
        base,
        verify=tuple(replace(p, seconds=p.seconds * 1.5) for p in base.verify),
        drafter=tuple((b, s * 1.5) for b, s in base.drafter),
    )
    lengths = [[5, 9, 20, 3], [7, 7, 30, 1], [12, 4, 4, 16], [2, 25, 6, 8], [40, 3, 3, 9], [11, 11, 2, 50]]
    history = []
    for step, lens in enumerate(lengths, 1):
        r = simulate_step(lens, Variant("vanilla"), slow, cluster, [None, None])
        history.append(
            {
                "step": step,
                "response_lengths": lens,
                "update_seconds": r.update_seconds + r.sync_seconds,
                "generate_seconds": r.rollout_seconds,
                "rollout_overhead_seconds": 0.3,
                "rollout_seconds": r.rollout_seconds + 0.3,
                "step_seconds": r.step_seconds + 0.3,
            }
        )
    spec = RunSpec.model_validate({"speculative": {"mode": "off"}})
    out = compare_run(history, bench, spec, cluster, AcceptCurve())
    assert out["decode_slowdown"] == pytest.approx(1.5)
    assert out["update_fixed_seconds"] == pytest.approx(2.0)
    assert out["update_seconds_per_token"] == pytest.approx(1e-3)
    assert out["rollout_overhead_seconds"] == pytest.approx(0.3)
    assert out["error"] == pytest.approx(0.0, abs=1e-9)
    assert compare_run(history, bench, spec, cluster, AcceptCurve(), fit_slowdown=False)["error"] > 1e-3


def test_simulate_cli_fits_fixed_and_padded_update_from_a_run(tmp_path):
    from tlt.cli import main

    run = tmp_path / "run"
    run.mkdir()
    steps = [
        {"step": i, "response_lengths": lens, "update_seconds": 1.0 + 0.01 * update_tokens(lens, 4, 16, "sorted")}
        for i, lens in enumerate([[3, 9, 27], [50, 2, 2], [10, 10, 10]], 1)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    out = tmp_path / "sim.json"
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(run),
                "--hardware",
                str(FIXTURE),
                "--calibrate-run",
                str(run),
                "--prompt-len",
                "4",
                "--variants",
                "vanilla",
                "--steps",
                "3",
                "--png",
                str(tmp_path / "x.png"),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    got = json.loads(out.read_text())["steps"]["vanilla"]
    assert [s["update_seconds"] + s["sync_seconds"] for s in got] == pytest.approx([s["update_seconds"] for s in steps])
