"""Compiled-step tests share model shapes, so that inductor compiles each kernel once per run.

A cold compile (inductor's C++ kernels) costs seconds per graph; a graph whose code and input shapes
an earlier test already compiled loads from inductor's on-disk cache in a fraction of that. The
compiled tests therefore build their targets from the same few configs (Qwen2, vocab 32, the
default width and depth of `tiny_model`, float32 or float64) unless the test is about another shape
(Qwen3's q/k norms, a vocabulary small enough to enumerate). A test that counts what it compiles
starts from dynamo's empty state (`fresh_graphs`): its counts cannot be served by an earlier test's
graphs, while the kernels still come from the disk cache.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def fresh_graphs():
    """Dynamo forgets every graph compiled so far in this process (as in a new process; inductor's on-disk
    cache stays)."""
    torch._dynamo.reset()
    yield
