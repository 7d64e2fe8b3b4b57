"""The project's front door: a short README, documentation links that resolve, and text that speaks of the
project itself rather than of how it was developed.

- README.md stays under 8,000 characters (what, why, how to start, where to read on).
- Every relative link in README.md and docs/ (Markdown `[text](target)` and `![alt](target)`) names a file
  that exists, and a `#fragment` names a heading of that file (GitHub's anchor rule).
- No file of the working tree (outside git's folder, virtualenvs, caches and build metadata) mentions a
  development session or issue by number: history lives in git and in docs/measurements-history.md by date.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_LIMIT = 8000
MAX_TEXT_BYTES = 10_000_000
SKIPPED_DIRS = {".git", ".venv", ".venv-vllm", "__pycache__", ".pytest_cache", "node_modules"}
HISTORY = re.compile(rb"session [0-9]|issue [0-9]", re.IGNORECASE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation other than `-` and `_` dropped,
    each space a hyphen (so "A (b, c)" -> "a-b-c" and "x + y" -> "x--y")."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps only its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a Markdown text, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        out.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return out


def relative_links(markdown: str) -> list[str]:
    """Link targets of a Markdown text that point into the repository (no scheme, not mail), outside code."""
    prose = INLINE_CODE.sub("", FENCE.sub("", markdown))
    return [t for t in LINK.findall(prose) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def broken_links(doc: Path) -> list[str]:
    """`doc: target (why)` for each relative link of `doc` whose file or heading does not exist."""
    broken = []
    for target in relative_links(doc.read_text(encoding="utf-8")):
        path_part, _, fragment = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{doc.relative_to(ROOT)}: {target} (no heading with that anchor)")
    return broken


def working_tree_files() -> list[Path]:
    """The repository's files as a reader sees them: tracked and untracked-not-ignored when git is there,
    else every file outside the skipped folders (a copy without .git)."""
    if (ROOT / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
        return [ROOT / n for n in names if not set(Path(n).parts) & SKIPPED_DIRS and (ROOT / n).is_file()]
    files = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        files.extend(Path(folder) / n for n in names)
    return files


def history_lines(data: bytes) -> list[tuple[int, str]]:
    """(line number, text) of each line of a file's bytes that names a development session or issue by number."""
    return [
        (number, line.decode(errors="replace").strip()[:120])
        for number, line in enumerate(data.splitlines(), start=1)
        if HISTORY.search(line)
    ]


def history_mentions(paths: list[Path]) -> list[str]:
    """`path:line: text` for every such line of the given repository files. Files over MAX_TEXT_BYTES are
    skipped: text that size is model weights or run output, not something a person wrote."""
    return [
        f"{path.relative_to(ROOT)}:{number}: {text}"
        for path in paths
        if not any(part.endswith(".egg-info") for part in path.parts) and path.stat().st_size <= MAX_TEXT_BYTES
        for number, text in history_lines(path.read_bytes())
    ]


def test_github_slug_follows_githubs_anchor_rule():
    assert (
        github_slug("Host work under 15% of a forward (2026-11-26, a4b5899 + 931479a)")
        == "host-work-under-15-of-a-forward-2026-11-26-a4b5899--931479a"
    )
    assert github_slug("`tlt bench drafter` (9c5e9ff)") == "tlt-bench-drafter-9c5e9ff"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_relative_links_skip_urls_and_code():
    text = "[a](docs/x.md#y) ![b](img.svg) [c](https://e.org) `[d](no.md)`\n```\n[e](no.md)\n```\n"
    assert relative_links(text) == ["docs/x.md#y", "img.svg"]


def test_history_lines_finds_numbered_sessions_and_issues():
    session, issue = b"Session " + b"12", b"issue " + b"4"  # split so this file passes its own check
    data = b"measured in " + session + b"\nsee " + issue + b"\nsessions of work\nan issue with it\n"
    assert history_lines(data) == [(1, "measured in " + session.decode()), (2, "see " + issue.decode())]


def test_readme_is_under_8000_characters():
    size = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert size < README_LIMIT, f"README.md has {size} characters; keep it under {README_LIMIT} (move detail to docs/)"


@pytest.mark.parametrize(
    "doc", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_relative_link_resolves(doc):
    assert broken_links(doc) == []


def test_no_development_history_by_number_in_the_tree():
    hits = history_mentions(working_tree_files())
    assert hits == [], "name the date or commit, or state the fact, instead:\n" + "\n".join(hits)
