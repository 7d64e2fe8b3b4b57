"""`tlt bench engine --part vllm --quick`: the pinned vLLM workload's tiny policy through every variant
(vLLM plain eager and compiled, vLLM EAGLE, this engine plain and adaptive): every variant's greedy
tokens equal this engine's plain ones, and the JSON has a ratio and a goal check for every batch."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: this tier runs in .venv-vllm (make vllm-venv)")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from tlt.bench.vllm_compare import VARIANTS  # noqa: E402
from tlt.cli import main  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "vllm.json"
    assert main(["bench", "engine", "--part", "vllm", "--quick", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_variant_runs_at_every_batch(result):
    info = result["vllm"]
    ran = [v for v in VARIANTS if v != "vllm-plain-compiled" or info["vllm_compiled_error"] is None]
    fixed = [f"vllm-fixed-k{k}" for k in info["vllm_fixed_depths"]]
    assert info["vllm_fixed_depths"] == [2, 3]  # the workload's EAGLE arms' depths
    assert {(r["variant"], r["batch"]) for r in info["rows"]} == {(v, b) for v in ran + fixed for b in (1, 4)}
    for row in info["rows"]:
        assert len(row["seconds"]) == info["config"]["repeats"] and row["tokens_per_s"] > 0, row
        assert row["tokens"] and min(row["tokens"]) > 0, row
    assert set(info["start_seconds"]) == {*ran, "vllm-table"} - {"vllm-dynamic"}
    assert info["drafter"]["vllm_draft_tokens"] == 3  # the workload's deepest chain arm


def test_all_variants_give_the_same_greedy_tokens(result):
    mismatched = {
        (r["variant"], r["batch"]): r["first_mismatch"] for r in result["vllm"]["rows"] if r["mismatched_requests"]
    }
    assert not mismatched


def test_speculative_variants_report_their_accept_length(result):
    rows = {(r["variant"], r["batch"]): r for r in result["vllm"]["rows"]}
    for b in (1, 4):
        assert rows["vllm-eagle", b]["accept_length"] >= 1.0
        assert rows["vllm-fixed-k2", b]["arms_chosen"] == {
            "eagle-2": rows["vllm-fixed-k2", b]["arms_chosen"]["eagle-2"]
        }
        assert rows["vllm-dynamic", b]["accept_length"] is None or rows["vllm-dynamic", b]["accept_length"] >= 1.0
        assert rows["tlt-adaptive", b]["arms_chosen"]
        assert rows["tlt-plain", b]["accept_length"] is None


def test_ratios_and_the_goal_are_there_for_every_batch(result):
    for key in (
        "tlt_vs_vllm_plain",
        "tlt_vs_vllm_plain_range",
        "vllm_eagle_vs_plain",
        "vllm_plain_reference",
        "goal_met",
        "vllm_best_fixed",
        "vllm_dynamic_vs_best",
        "vllm_dynamic_vs_best_range",
        "dynamic_goal_met",
    ):
        assert set(result[key]) == {"1", "4"}, key
    assert all(low <= high for low, high in result["tlt_vs_vllm_plain_range"].values())
    cost = result["vllm"]["feature_forward"]
    assert (
        cost["batch"] == 4 and len(cost["seconds"]) == result["vllm"]["config"]["repeats"] and cost["over_generate"] > 0
    )
    threads = result["vllm"]["threads"]
    assert threads["torch_threads_after_vllm_start"] == threads["torch_threads"]
    assert set(result["load_average"]) == {"before", "after"}
