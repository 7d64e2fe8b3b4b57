"""`tlt demo` end to end (reduced policy, one step per run): two real RL runs on a local Ray cluster,
vanilla then TLT, and the side-by-side report over both."""

from __future__ import annotations

import pytest

from tlt.cli import main

pytestmark = pytest.mark.slow


def test_demo_runs_vanilla_and_tlt_and_compares_them(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--warmstart", "reduced", "--steps", "1", "--out", str(out)]) == 0
    for name in ("vanilla", "tlt"):
        assert (out / name / "metrics.jsonl").read_text().count("\n") == 1
        assert (out / name / "report.md").is_file()
    report = (out / "report.md").read_text()
    assert "| rollout seconds |" in report and "(off vs tlt)" in report
    assert (out / "side_by_side.png").stat().st_size > 0


def test_demo_refuses_bad_steps(tmp_path, capsys):
    assert main(["demo", "--steps", "0", "--out", str(tmp_path)]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
