"""`tlt generate` reads .jsonl and .txt prompts, loads a saved policy, writes one JSON line per prompt in
order (greedy output equal to the engine's), and refuses a bad prompts file; `tlt bench engine --quick`
writes rows and ratios."""

from __future__ import annotations

import json

import pytest

from tlt.cli import main
from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.tasks.tokenizer import build_task_tokenizer


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy")
    tokenizer = build_task_tokenizer()
    save_policy(tiny_model("qwen2", vocab_size=max(64, len(tokenizer))), tokenizer, folder)
    return folder


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_generate_writes_one_line_per_prompt_in_order(policy_dir, tmp_path, suffix):
    prompts = ["1+2=", "3*4=", "10-7="]
    src = tmp_path / f"prompts{suffix}"
    src.write_text("\n".join(json.dumps({"prompt": p}) if suffix == ".jsonl" else p for p in prompts) + "\n")
    out = tmp_path / "out.jsonl"
    argv = [
        "generate",
        "--model",
        str(policy_dir),
        "--prompts",
        str(src),
        "--temperature",
        "0",
        "--max-new-tokens",
        "5",
        "--batch-size",
        "2",
        "--dtype",
        "float32",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in records] == prompts
    assert all(1 <= len(r["token_ids"]) <= 5 and r["finish_reason"] in ("stop", "length") for r in records)


def test_generate_refuses_prompts_without_prompt_field(policy_dir, tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps({"question": "x"}) + "\n")
    assert main(["generate", "--model", str(policy_dir), "--prompts", str(src)]) == 2


@pytest.mark.slow
def test_bench_engine_quick_writes_rows_and_ratios(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "engine", "--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {(r["engine"], r["dtype"], r["batch"]) for r in result["rows"]} == {
        (e, d, b) for e in ("hf-generate", "tlt") for d in ("bf16", "fp32") for b in (1, 4, 32)
    }
    assert all(r["tokens_per_s"] > 0 for r in result["rows"]) and len(result["ratios"]) == 6
    assert result["machine"]["usable_cpus"] >= 1, "the result names the machine it was measured on"
