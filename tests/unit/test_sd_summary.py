"""The sd bench's per-batch summaries: `block_vs_best_chain` and `history_summary` (never checks timings),
on hand-made rows and on rows the bench's own engines produce with a tiny model."""

from __future__ import annotations

import pytest
import torch

from tlt.bench.engine_sd import SdBenchConfig, SdRow, _sd_runner, sd_engine
from tlt.bench.sd_summary import (
    block_vs_best_chain,
    drafting_fraction,
    feature_keeping,
    history_summary,
    wide_vs_final_norm_block,
)
from tlt.models.block_drafter import new_block_drafter
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout.types import Request, SamplingParams


def _row(variant: str, batch: int, tokens_per_s: float, temperature: float = 1.0, accept: float = 1.0) -> dict:
    return {
        "variant": variant,
        "batch": batch,
        "temperature": temperature,
        "tokens_per_s": tokens_per_s,
        "accept_length": accept,
    }


def test_block_vs_best_chain_divides_the_best_block_by_the_best_chain_per_batch():
    rows = [
        _row("chain-2", 1, 100.0),
        _row("chain-4-argmax", 1, 120.0),
        _row("block-2", 1, 90.0),
        _row("block-8", 1, 150.0),
        _row("chain-2", 4, 80.0),
        _row("block-4", 4, 40.0),
        _row("block-8", 1, 999.0, temperature=0.0),
        _row("tree-k2-d4-b8", 1, 500.0),
        _row("chain-2", 8, 10.0),
    ]
    assert block_vs_best_chain(rows, (1, 4, 8), 1.0) == {"1": pytest.approx(150 / 120), "4": pytest.approx(0.5)}


def test_wide_vs_final_norm_block_divides_the_best_wide_block_by_the_best_final_norm_block():
    rows = [
        _row("block-2", 1, 100.0),
        _row("block-4", 1, 120.0),
        _row("block-2-wide", 1, 90.0),
        _row("block-4-wide", 1, 150.0),
        _row("chain-4", 1, 999.0),
        _row("block-4", 4, 80.0),
    ]
    assert wide_vs_final_norm_block(rows, (1, 4), 1.0) == {"1": pytest.approx(150 / 120)}
    assert block_vs_best_chain(rows, (1,), 1.0) == {"1": pytest.approx(150 / 999)}


def test_history_summary_ratios_per_batch():
    rows = [
        _row("ngram-4", 1, 50.0, accept=2.0),
        _row("history-4", 1, 60.0, accept=3.0),
        _row("chain-2", 1, 80.0),
        _row("mixed-4", 1, 100.0),
    ]
    out = history_summary(rows, ["ngram-4", "history-4", "chain-2", "mixed-4"], (1,), 1.0, 4, 4)
    assert out == {"history_vs_ngram_accept": {"1": 1.5}, "mixed_vs_best_single": {"1": 1.25}}


def test_feature_keeping_divides_each_kept_kind_by_plain_per_batch():
    rows = [_row("plain", 1, 100.0), _row("plain-hidden", 1, 95.0), _row("plain-wide", 1, 80.0)]
    rows += [_row("plain", 4, 200.0), _row("plain-wide", 4, 150.0), _row("plain-wide", 4, 1.0, temperature=0.0)]
    assert feature_keeping(rows, (1, 4, 16), 1.0) == {
        "1": {"hidden": pytest.approx(0.95), "wide": pytest.approx(0.8)},
        "4": {"wide": pytest.approx(0.75)},
    }


def test_drafting_fraction_divides_each_drafter_graph_by_plain_decodings_target_step():
    def split(row: dict, **parts: float) -> dict:
        return {**row, "split": {"steps": 10, **parts}}

    rows = [
        split(_row("plain", 1, 100.0), target_forward=3.0, lm_head=1.0, total=5.0),
        split(_row("block-4-wide", 1, 150.0), target_forward=4.0, lm_head=1.0, draft_graph=0.5),
        split(_row("chain-4", 1, 120.0), target_forward=4.0, lm_head=1.0, draft_graph=2.0),
        split(_row("ngram-4", 1, 110.0), target_forward=4.0, lm_head=1.0),
        split(_row("block-4-wide", 4, 150.0), draft_graph=0.5),  # no plain row at batch 4
    ]
    assert drafting_fraction(rows, (1, 4), 1.0) == {"block-4-wide": {"1": 0.125}, "chain-4": {"1": 0.5}}


def test_bench_block_rows_on_a_tiny_model_feed_block_vs_best_chain():
    """The bench's own engines (plain, an EAGLE chain, block drafts) on a tiny model: the block rows are
    plain decoding's tokens, and the summary has a ratio for the batch."""
    policy = tiny_model("qwen2", vocab_size=32, seed=2)
    torch.manual_seed(0)
    eagle = EagleDrafter(drafter_config_from_target(policy.config))
    eagle.bind_policy(policy)
    block = new_block_drafter(policy, block_size=4)
    cfg = SdBenchConfig(chain_depths=(2,), block_depths=(2, 4), repeats=1)
    requests = [
        Request(f"r{i}", [3 + i, 4, 5], SamplingParams(temperature=1.0, max_new_tokens=12, seed=i)) for i in range(2)
    ]
    rows = []
    wide = new_block_drafter(policy, block_size=4, feature_layers=(0,))
    for variant in ("plain", "chain-2", "block-2", "block-4", "block-4-wide", "plain-hidden", "plain-wide"):
        row = SdRow(variant, 2, 1.0, len(requests))
        engine = sd_engine(variant, cfg, policy, eagle, 2, 32, block, wide)
        row.seconds.append(_sd_runner(row, engine, requests, cfg, [])())
        rows.append(row)
    assert all(r.outputs == rows[0].outputs for r in rows), "every variant samples plain decoding's tokens"
    dicts = [r.as_dict() for r in rows]
    ratio = block_vs_best_chain(dicts, (2,), 1.0)["2"]
    best_block = max(d["tokens_per_s"] for d in dicts if d["variant"].startswith("block-"))
    assert ratio == pytest.approx(best_block / dicts[1]["tokens_per_s"])
