"""Reports as KFP Markdown artifacts, rendered in the KFP UI beside the run's `Metrics`.

`run_report` is the runtime's end-of-run report (`tlt.runtime.report.write_report`: a summary,
a per-step table and four plots) made self-contained: each plot is inlined as a base64 PNG data
URI, since an artifact is one file. `metrics_report` is a headline table of flat metrics, for the
steps that have no run folder (a cluster run followed from outside, the drafter evaluation).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from tlt.runtime.report import write_report

_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)")


def inline_images(markdown: str, folder: Path) -> str:
    """`markdown` with every `![alt](name.png)` whose file is in `folder` replaced by a data URI;
    ValueError naming the image when a referenced file is missing."""

    def inline(match: re.Match[str]) -> str:
        path = folder / match.group(2)
        if not path.is_file():
            raise ValueError(f"the report refers to {match.group(2)!r}, which is not in {folder}")
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"![{match.group(1)}](data:image/png;base64,{data})"

    return _IMAGE.sub(inline, markdown)


def run_report(run_dir: str | Path, title: str) -> str:
    """Write the end-of-run report of the run in `run_dir` (needs its metrics.jsonl) and return it as
    one self-contained Markdown document."""
    path = write_report(run_dir, title=title)
    return inline_images(path.read_text(), path.parent)


def _format(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def metrics_report(title: str, metrics: Mapping[str, float], headline: Sequence[str] = (), note: str = "") -> str:
    """A Markdown table of `metrics`: the `headline` keys first (those present, in that order), then
    the rest sorted by name; `note` is a paragraph under the title."""
    first = [k for k in headline if k in metrics]
    rest = sorted(k for k in metrics if k not in first)
    lines = [f"# {title}", ""] + ([note, ""] if note else [])
    lines += ["| metric | value |", "|---|---:|"]
    lines += [f"| {k} | {_format(metrics[k])} |" for k in first + rest]
    return "\n".join(lines) + "\n"
