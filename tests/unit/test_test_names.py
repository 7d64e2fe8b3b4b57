"""Test modules are imported by their basename (no packages under tests/, pytest's rootdir imports), so two
modules of one name in different tiers stop the whole collection: every basename is unique."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique():
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py" and "__pycache__" not in p.parts)
    assert not [name for name, n in names.items() if n > 1], "test modules sharing a name: rename one"
