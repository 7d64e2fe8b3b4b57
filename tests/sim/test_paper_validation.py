"""The paper check of `tlt simulate --validate`: its setups, acceptance calibration and trend with scale."""

from __future__ import annotations

import pytest

from tlt.bench.cost_timing import amdahl
from tlt.sim.accept import accept_length, alpha_for_accept
from tlt.sim.accuracy_checks import (
    PAPER_ACCEPT,
    PAPER_SETUPS,
    implied_sd_share,
    paper_curve,
    paper_spec,
    paper_sweep,
    round_speedup,
)
from tlt.spec.run import ArmSpec


@pytest.mark.parametrize("arm", [ArmSpec(kind="chain", depth=4), ArmSpec(kind="tree", depth=8, topk=4)])
@pytest.mark.parametrize("target", [1.5, 3.0, 4.9])
def test_alpha_for_accept_inverts_accept_length(arm, target):
    alpha = alpha_for_accept(arm, target)
    assert 0.0 < alpha < 1.0
    assert accept_length(arm, alpha, 0.0) == pytest.approx(target, rel=1e-9)


def test_alpha_for_accept_rejects_what_the_arm_cannot_reach():
    with pytest.raises(ValueError, match="outside what a chain of depth 2"):
        alpha_for_accept(ArmSpec(kind="chain", depth=2), 3.5)
    with pytest.raises(ValueError, match="'ngram'"):
        alpha_for_accept(ArmSpec(kind="ngram", depth=4), 2.0)


def test_paper_curve_yields_the_published_accept_lengths():
    spec = paper_spec()
    curve = paper_curve(spec)
    assert accept_length(spec.arms[0], curve.alpha0, 0.0) == pytest.approx(PAPER_ACCEPT["static"])
    assert accept_length(spec.arms[0], curve.alpha_max, 0.0) == pytest.approx(PAPER_ACCEPT["adaptive"])
    assert spec.threshold == 32 and [a.verify_tokens for a in spec.arms] == [48, 32, 16, 8]


def test_amdahl():
    assert amdahl(0.5, 2.0) == pytest.approx(4 / 3)
    assert amdahl(0.0, 5.0) == 1.0 and amdahl(1.0, 5.0) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="share"):
        amdahl(1.5, 2.0)


def test_setups_fit_their_tensor_parallel_engines():
    for setup in PAPER_SETUPS:
        assert setup.gpus % setup.tp == 0 and setup.responses % (setup.gpus // setup.tp) == 0


def test_the_7b_speedup_rises_with_the_cluster_as_published():
    small, large = (s for s in PAPER_SETUPS if s.model == "qwen2.5-7b" and s.gpus in (8, 64))
    out = paper_sweep(steps=2, setups=(small, large))
    lo, hi = out["qwen2.5-7b@8"], out["qwen2.5-7b@64"]
    assert small.published < large.published
    assert 1.0 < lo["predicted"] < hi["predicted"]
    for row in (lo, hi):
        assert row["at_paper_rollout_share"] == pytest.approx(amdahl(0.85, row["rollout_speedup"]))
        assert 0.0 < row["vanilla_decode_share_sd_eligible"] < 1.0


def test_implied_sd_share_inverts_amdahl_twice():
    # 60% of the decode speculative at 3x per round: rollout 1 / (0.4 + 0.2) = 1.667x; at an 85% share the
    # step is amdahl(0.85, 1.667) faster, and that step speed-up implies the same 60% back
    step = amdahl(0.85, 1.0 / (0.4 + 0.6 / 3.0))
    assert implied_sd_share(step, 0.85, 3.0) == pytest.approx(0.6)
    assert implied_sd_share(1.0, 0.85, 3.0) == pytest.approx(0.0)
    assert implied_sd_share(10.0, 0.85, 3.0) == float("inf"), "past Amdahl's bound of 1 / 0.15"
    with pytest.raises(ValueError, match="round_speedup > 1"):
        implied_sd_share(1.5, 0.85, 1.0)


def test_round_speedup_follows_the_cost_model():
    class Flat:  # every forward 1 s, every drafter pass 0.1 s
        def target_seconds(self, batch, width, context):
            return 1.0

        def drafter_seconds(self, batch, context):
            return 0.1

    arm = ArmSpec(kind="tree", depth=8, topk=4, verify_tokens=48)
    assert round_speedup(Flat(), arm, 6.53, 2048) == pytest.approx(6.53 / (1.0 + 8 * 0.1))


def test_tlt_simulate_validate_writes_the_three_checks(tmp_path):
    import json

    from tlt.cli import main

    path = tmp_path / "val.json"
    assert main(["simulate", "--validate", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["local_error"] is None, "no run to compare without --calibrate-run and a costs JSON"
    assert result["h20_sd_off"] is True
    assert set(result["paper"]) == {f"{s.model}@{s.gpus}" for s in PAPER_SETUPS}
    for setup in PAPER_SETUPS:
        row = result["paper"][f"{setup.model}@{setup.gpus}"]
        assert row["published"] == setup.published and row["predicted"] > 1.0
        assert row["implied_sd_share"] == pytest.approx(
            implied_sd_share(setup.published, 0.85, row["round_speedup_batch1"])
        )
