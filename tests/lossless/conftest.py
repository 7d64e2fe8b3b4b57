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
from _engine_cases import generate, requests
from transformers import PreTrainedModel

from tlt.models.tiny import tiny_model
from tlt.rollout.types import Completion


@pytest.fixture
def fresh_graphs():
    """Dynamo forgets every graph compiled so far in this process (as in a new process; inductor's on-disk
    cache stays)."""
    torch._dynamo.reset()
    yield


@pytest.fixture(scope="module")
def model64() -> PreTrainedModel:
    return tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)


@pytest.fixture(scope="module")
def plain64(model64: PreTrainedModel) -> list[Completion]:
    return generate(model64, requests(), None)[0]


@pytest.fixture(scope="module")
def qwen3_64() -> PreTrainedModel:
    """Qwen3: q/k norms before RoPE, heads x head_dim = 2 x hidden_size (as in Qwen3-0.6B)."""
    return tiny_model("qwen3", dtype=torch.float64, vocab_size=32, seed=11)
