"""`tlt bench policy-group --shape tiny`: every variant runs in fresh processes and the result has its ratios
(timings are reported, never asserted: the state per rank is a count, not a timing)."""

from __future__ import annotations

import json

import pytest

from tlt.cli import main

pytestmark = pytest.mark.slow


def test_the_policy_group_bench_reports_every_variant_and_their_ratios(tmp_path, capsys):
    out = tmp_path / "pg.json"
    assert main(["bench", "policy-group", "--shape", "tiny", "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["rounds"]) == {"1-rank", "2-ranks", "2-ranks-gathered"}
    assert result["variants"]["2-ranks-gathered"]["reshard_after_forward"] is False
    assert [len(r["state_bytes"]) for r in (result["rounds"]["1-rank"][0], result["rounds"]["2-ranks"][0])] == [1, 2]
    assert result["state_ratio_per_rank"]["max"] <= 0.55, "FSDP2 keeps about half the state on each of 2 ranks"
    assert {"median", "min", "max"} <= result["throughput_ratio"].keys()
    assert result["gathered"]["state_ratio_per_rank"]["max"] <= 0.55, "the state at rest is sharded either way"
    assert "round 1/1 2-ranks" in capsys.readouterr().err, "a line per variant and round while it runs"


def test_a_batch_that_cannot_feed_two_ranks_is_refused(tmp_path, capsys):
    assert main(["bench", "policy-group", "--shape", "tiny", "--seqs", "1"]) == 2
    assert "seqs >= 2" in capsys.readouterr().out
