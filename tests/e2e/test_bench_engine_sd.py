"""`tlt bench engine --quick` writes a complete, internally consistent JSON (never checks timings).

One CLI run on the reduced warm-started policy and a tiny random model: engine-vs-generate rows for
every (engine, dtype, batch), speculative rows for every (variant, batch, temperature) with accept
lengths a draft of that shape can reach, ratios against the matching plain row, and the cost curve.
"""

from __future__ import annotations

import json

import pytest
import torch

from tlt.bench.engine_vs_generate import EngineBenchConfig
from tlt.bench.sd_config import PLAIN_VARIANTS, SdBenchConfig
from tlt.cli import main

# One quick CLI run (a tiny engine-vs-generate bench, a drafter trained a few steps, 20 SD engines):
# ~3 min on the shared 2-core machine, so it sits in the slow tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("bench") / "engine.json"
    assert main(["bench", "engine", "--quick", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_engine_rows_cover_every_engine_dtype_and_batch(report):
    cfg = EngineBenchConfig.quick()
    keys = {(r["engine"], r["dtype"], r["batch"]) for r in report["rows"]}
    assert keys == {(e, d, b) for e in ("hf-generate", "tlt") for d in cfg.dtypes for b in cfg.batches}
    assert all(r["tokens_per_s"] > 0 and r["tokens"] == r["batch"] * cfg.new_tokens for r in report["rows"])
    assert {(r["dtype"], r["batch"]) for r in report["ratios"]} == {(d, b) for d in cfg.dtypes for b in cfg.batches}
    for ratio in report["ratios"]:
        low, high = ratio["tlt_over_hf_range"]
        assert 0 < low <= high and ratio["tlt_over_hf_cpu"] > 0


def test_sd_rows_cover_every_variant_batch_and_temperature(report):
    cfg = SdBenchConfig.quick()
    sd = report["sd"]
    keys = [(r["variant"], r["batch"], r["temperature"]) for r in sd["rows"]]
    expected = {(v, b, t) for v in cfg.variants() for b in cfg.batches for t in cfg.temperatures}
    assert len(keys) == len(expected) and set(keys) == expected
    assert [(r["variant"], r["batch"], r["temperature"]) for r in sd["ratios"]] == keys


def test_accept_lengths_are_reachable_by_each_draft_shape(report):
    cfg = SdBenchConfig.quick()
    most = {f"chain-{d}": d + 1 for d in cfg.chain_depths}
    most[f"chain-{max(cfg.chain_depths)}-argmax"] = max(cfg.chain_depths) + 1
    topk, depth, budget = cfg.tree
    most[f"tree-k{topk}-d{depth}-b{budget}"] = depth + 1  # tree: at most depth drafts plus the next token
    most[f"ngram-{cfg.ngram[0]}"] = cfg.ngram[0] + 1
    most[f"history-{cfg.history[0]}"] = most[f"mixed-{cfg.history[0]}"] = cfg.history[0] + 1
    most.update({f"block-{d}{wide}": d + 1 for d in cfg.block_depths for wide in ("", "-wide")})
    assert set(most) | set(PLAIN_VARIANTS) == set(cfg.variants())
    for row in report["sd"]["rows"]:
        if row["variant"] in PLAIN_VARIANTS:
            assert row["accept_length"] == 1.0
        else:
            assert 1.0 <= row["accept_length"] <= most[row["variant"]], row
        assert row["tokens"] > 0 and row["tokens_per_s"] > 0
        assert row["tokens_per_s_range"][0] <= row["tokens_per_s"] <= row["tokens_per_s_range"][1]
        assert 0 < row["mean_running"] <= row["batch"]


def test_ratios_compare_against_the_matching_plain_row(report):
    rows = {(r["variant"], r["batch"], r["temperature"]): r for r in report["sd"]["rows"]}
    for ratio in report["sd"]["ratios"]:
        row = rows[ratio["variant"], ratio["batch"], ratio["temperature"]]
        plain = rows["plain", ratio["batch"], ratio["temperature"]]
        assert ratio["over_plain"] == pytest.approx(row["tokens_per_s"] / plain["tokens_per_s"])
        low, high = ratio["over_plain_range"]
        assert low <= high
        if ratio["variant"] == "plain":
            assert ratio["over_plain"] == 1.0 and ratio["outputs_equal_plain"]
        if ratio["variant"] in PLAIN_VARIANTS:  # keeping features changes no token
            assert ratio["outputs_equal_plain"], ratio
    t = max(SdBenchConfig.quick().temperatures)
    for b, kinds in report["feature_keeping"].items():
        for kind, value in kinds.items():
            want = rows[f"plain-{kind}", int(b), t]["tokens_per_s"] / rows["plain", int(b), t]["tokens_per_s"]
            assert value == pytest.approx(want)
    assert set(report["feature_keeping"]) == {str(b) for b in SdBenchConfig.quick().batches}
    for row in report["sd"]["rows"]:  # every timed round's decode steps, split by part
        assert row["split"]["steps"] > 0 and 0 < row["split"]["target_forward"] < row["split"]["total"]
    drafting = report["drafting_fraction"]
    assert {v for v in drafting if v.startswith(("block-", "chain-"))} == {
        v for v in SdBenchConfig.quick().variants() if v.startswith(("block-", "chain-"))
    }
    assert all(value > 0 for by_batch in drafting.values() for value in by_batch.values())


def test_costs_cover_every_batch_and_verify_width(report):
    cfg = SdBenchConfig.quick()
    costs = report["costs"]
    widths = sorted({1, *cfg.cost_widths})
    assert [(p["batch"], p["width"]) for p in costs["verify"]] == [(b, w) for b in cfg.batches for w in widths]
    for point in costs["verify"]:
        assert point["seconds"] > 0
        assert point["ratio_min"] <= point["ratio_max"]
        if point["width"] == 1:
            assert point["ratio"] == 1.0
    assert [p["batch"] for p in costs["drafter_step"]] == list(cfg.batches)
    assert all(0 < p["seconds"] <= p["seconds_median"] for p in costs["drafter_step"])
    assert [(p["batch"], p["block"]) for p in costs["block_step"]] == [
        (b, k) for b in cfg.batches for k in cfg.block_depths
    ]
    assert all(0 < p["seconds"] <= p["seconds_median"] for p in costs["block_step"])
    step = {p["batch"]: p["seconds"] for p in costs["verify"] if p["width"] == 1}
    assert report["block_cost_fraction"] == {
        str(k): {
            str(b): next(p["seconds"] for p in costs["block_step"] if (p["batch"], p["block"]) == (b, k)) / step[b]
            for b in cfg.batches
        }
        for k in cfg.block_depths
    }
    assert [(p["batch"], p["block"]) for p in costs["block_step_wide"]] == [
        (b, k) for b in cfg.batches for k in cfg.block_depths
    ]
    assert set(report["block_cost_fraction_wide"]) == {str(k) for k in cfg.block_depths}


def test_drafter_was_trained_on_the_policys_outputs(report):
    drafter = report["sd"]["drafter"]
    assert drafter["settings"]["policy"] == report["sd"]["policy"]["folder"].rstrip("/").rsplit("/", 1)[-1]
    assert drafter["settings"]["steps"] == SdBenchConfig.quick().drafter_steps
    assert 0.0 <= drafter["train_top1_agreement"] <= 1.0


def test_history_summary_has_a_ratio_per_batch_at_the_sampling_temperature(report):
    cfg = SdBenchConfig.quick()
    rows = {(r["variant"], r["batch"], r["temperature"]): r for r in report["sd"]["rows"]}
    t = max(cfg.temperatures)
    for b in cfg.batches:
        ratio = report["history_vs_ngram_accept"][str(b)]
        assert ratio == pytest.approx(
            rows[f"history-{cfg.history[0]}", b, t]["accept_length"]
            / rows[f"ngram-{cfg.ngram[0]}", b, t]["accept_length"]
        )
        assert report["mixed_vs_best_single"][str(b)] > 0
        mixed = rows[f"mixed-{cfg.history[0]}", b, t]
        assert sum(mixed["sources"][k] for k in ("history", "eagle", "none")) > 0


def test_block_drafts_have_a_ratio_per_batch_against_the_best_chain(report):
    cfg = SdBenchConfig.quick()
    rows = {(r["variant"], r["batch"], r["temperature"]): r for r in report["sd"]["rows"]}
    t = max(cfg.temperatures)
    assert set(report["block_vs_best_chain"]) == {str(b) for b in cfg.batches}
    for b in cfg.batches:
        best = {
            kind: max(rows[v, b, t]["tokens_per_s"] for v in cfg.variants() if v.startswith(kind))
            for kind in ("block-", "chain-")
        }
        assert report["block_vs_best_chain"][str(b)] == pytest.approx(best["block-"] / best["chain-"])
    block = report["sd"]["block_drafter"]
    assert block["settings"]["block_size"] == max(cfg.block_depths)
    assert len(block["train_agreement_by_offset"]) == max(cfg.block_depths)


WORKLOAD = """\
name: sd-part-test
warmstart: reduced
drafterWarmstart: {prompts: 8, steps: 3, batch: 8, learningRate: 3.0e-3, maxNewTokens: 16, seed: 0}
spec:
  model: {maxContext: 256}
  algorithm: {temperature: 0.9, maxNewTokens: 12, groupSize: 2}
  rollout: {compile: "off"}
variants: {vanilla: {}, static: {}, tlt: {}, tlt-shadow: {}}
repeats: 1
heldout: {prompts: 2, depth: 2, maxNewTokens: 16}
costs: {batches: [1], widths: [1], context: 16, repeats: 1}
"""


def test_sd_part_on_a_workload_uses_its_policy_drafter_and_sampling(tmp_path):
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    path = tmp_path / "sd.json"
    threads = torch.get_num_threads()
    try:
        assert (
            main(
                [
                    "bench",
                    "engine",
                    "--part",
                    "sd",
                    "--quick",
                    "--workload",
                    str(workload),
                    "--threads",
                    "1",
                    "--json",
                    str(path),
                ]
            )
            == 0
        )
    finally:
        torch.set_num_threads(threads)  # the bench sets the process's threads
    sd = json.loads(path.read_text())["sd"]
    assert sd["drafter"]["workload"] == "sd-part-test"
    assert sd["config"]["threads"] == 1, "--threads reaches the sd part"
    assert sd["config"]["temperatures"] == [0.9] and sd["config"]["compile"] is False
    assert sd["config"]["max_new_tokens"] == 12 and sd["config"]["group_size"] == 2
    assert {r["temperature"] for r in sd["rows"]} == {0.9}
    assert all(r["tokens"] > 0 for r in sd["rows"])


def test_workload_and_warmstart_together_are_refused(tmp_path, capsys):
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    assert main(["bench", "engine", "--part", "sd", "--workload", str(workload), "--warmstart", "deep"]) == 2
    assert "--workload and --warmstart" in capsys.readouterr().out
    assert main(["bench", "engine", "--part", "sd", "--workload", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().out
    assert main(["bench", "engine", "--part", "sd", "--threads", "0"]) == 2
    assert "--threads must be >= 1, got 0" in capsys.readouterr().out
