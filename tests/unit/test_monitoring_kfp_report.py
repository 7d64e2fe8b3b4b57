"""The KFP reports (tlt_components.report): the end-of-run report as one self-contained Markdown file
(plots inlined as PNG data URIs) and a headline-first metrics table. The train component writing a
real run's report under KFP's runner: tests/kfp/test_local_runner.py."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from tlt_components.report import inline_images, metrics_report, run_report

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


def test_inline_images_embeds_referenced_pngs(tmp_path: Path):
    (tmp_path / "a.png").write_bytes(PNG)
    text = inline_images("x ![a plot](a.png) y [link](a.png)", tmp_path)
    (uri,) = re.findall(r"!\[a plot\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", text)
    assert base64.b64decode(uri) == PNG and text.endswith("y [link](a.png)"), "only images are inlined"
    with pytest.raises(ValueError, match="'b.png'"):
        inline_images("![b](b.png)", tmp_path)


def test_metrics_report_puts_headline_first():
    text = metrics_report(
        "Eval",
        {"zeta": 1.0, "speedup": 1.23456, "alpha": 2.0, "prompts": 16.0},
        ["prompts", "speedup", "absent"],
        note="held-out",
    )
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["metric", "prompts", "speedup", "alpha", "zeta"]
    assert "| prompts | 16 |" in text and "| speedup | 1.235 |" in text and "held-out" in text


def _history(tmp_path: Path) -> Path:
    rows = [
        {
            "step": s,
            "reward_mean": 0.1 * s,
            "rollout_seconds": 1.0,
            "tail_seconds": 0.2,
            "update_seconds": 0.5,
            "step_seconds": 1.6,
            "response_length_mean": 10.0,
            "response_length_p50": 9,
            "response_length_p90": 14,
            "response_length_max": 16,
            "tokens_per_second": 100.0,
        }
        for s in (1, 2)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_run_report_is_self_contained(tmp_path: Path):
    text = run_report(_history(tmp_path), title="TLT run demo")
    assert text.startswith("# TLT run demo") and "| 2 | 0.200 |" in text
    assert len(re.findall(r"!\[[^\]]*\]\(data:image/png;base64,", text)) == 4
    assert not re.search(r"\]\([a-z_]+\.png\)", text), "no image left pointing at a file"
