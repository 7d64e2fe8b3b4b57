"""vLLM's sleep mode on a GPU with a served EAGLE drafter: level 1 between rollouts, woken by the next one, and
the drafter still drafts as before (same greedy tokens, same accept length from vLLM's own counters). Skipped
without a CUDA device or without vLLM (the bare GPU machine has no vLLM wheel; its CPU build has no sleep: the
driver's sleep path is tests/unit/test_vllm_sleep.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() False)"),
]
pytest.importorskip("vllm", reason="vLLM is not installed on this machine")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm_tier"))

from eagle_world import eagle_world, exact_drafter  # noqa: E402
from test_vllm_dynamic_sd import MEMORY, ROWS  # noqa: E402

from tlt.rollout.types import Request, SamplingParams  # noqa: E402
from tlt.rollout.vllm.spec_table import k_table  # noqa: E402
from tlt.rollout.vllm.vllm_engine import EagleSetup, VllmEngine, sleep_supported  # noqa: E402


def test_sleep_level_one_then_wake_keeps_the_drafters_acceptance(tmp_path):
    if not sleep_supported():
        pytest.skip("this vLLM platform has no sleep mode")
    policy, _ = eagle_world(tmp_path, silent_layers=True)
    table = tuple(k_table(8, [1, 2, 4, 8], [3, 3, 3, 3], ROWS))
    memory = {**MEMORY, "memory_fraction": 0.1, "kv_cache_bytes": None}
    engine = VllmEngine(tmp_path / "policy", **memory, eagle=EagleSetup(str(tmp_path / "eagle"), 3, table=table))
    assert engine.releases_memory
    engine.load_drafter(exact_drafter(policy))
    requests = [Request(f"r{i}", [1, 5 + i, 7], SamplingParams(temperature=0.0, max_new_tokens=24)) for i in range(4)]

    def accept_and_tokens():
        drafts, (_, accepted) = engine.speculative_drafts(), engine.speculative_counts()
        out = engine.generate(requests)
        n = engine.speculative_drafts() - drafts
        return 1 + (engine.speculative_counts()[1] - accepted) / n, [c.token_ids for c in out]

    before, tokens = accept_and_tokens()
    engine.release()
    assert engine.asleep
    after, again = accept_and_tokens()
    assert not engine.asleep and again == tokens
    assert after == pytest.approx(before) and before > 3.5
    with pytest.raises(ValueError, match="level 2"):
        engine.release(level=2)
