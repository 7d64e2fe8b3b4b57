"""`tlt train --local` on GSM8K-format records with a chat template, a held-out eval file and a plug-in reward.

All local: a BPE tokenizer trained here on GSM8K text with a ChatML-style template, a tiny Qwen2 policy, the
reward plug-in from tests/fixtures on sys.path. Two of the four training records make the plug-in raise:
their samples score 0, the run goes on, and every failure is in reward_errors.jsonl and the metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from chat_tokenizer import GSM8K, chat_tokenizer, gsm8k_records  # noqa: E402

from tlt import cli  # noqa: E402
from tlt.models.loading import save_policy  # noqa: E402
from tlt.models.tiny import tiny_model  # noqa: E402
from tlt.spec.manifest_io import load_run  # noqa: E402
from tlt.tasks.datasets import load_problems  # noqa: E402
from tlt.tasks.prompt_format import encode_prompt  # noqa: E402

pytestmark = pytest.mark.skipif(not GSM8K.is_file(), reason=f"GSM8K test split not at {GSM8K}")
TEMPLATE = '{question}\nLet\'s think step by step and output the final answer after "####".'
GROUP = 4


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _run_file(root: Path) -> Path:
    tokenizer = chat_tokenizer()
    save_policy(
        tiny_model("qwen2", vocab_size=len(tokenizer) + 16, seed=3, tie_word_embeddings=True), tokenizer, root / "init"
    )
    train = [{**r, "crash": i % 2 == 1} for i, r in enumerate(gsm8k_records(4))]
    spec = {
        "metadata": {"name": "gsm8k-chat"},
        "spec": {
            "model": {"path": str(root / "init"), "dtype": "float32"},
            "dataset": {
                "source": "file",
                "path": str(_write_jsonl(root / "train.jsonl", train)),
                "evalPath": str(_write_jsonl(root / "eval.jsonl", gsm8k_records(2, start=100))),
                "answerFormat": "gsm8k",
                "prompt": TEMPLATE,
                "chat": True,
                "system": "Be brief.",
            },
            "verifier": {"reward": "reward_plugin:graded"},
            "algorithm": {"steps": 2, "promptsPerStep": 2, "groupSize": GROUP, "maxNewTokens": 12},
            "speculative": {"mode": "off"},
            "checkpoint": {"intervalSteps": 2, "keep": 1},
        },
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_chat_template_eval_file_and_plugin_reward_end_to_end(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    run_file = _run_file(tmp_path)
    spec = load_run(run_file).spec

    assert cli.main(["validate", str(run_file), "--show-prompt", "2"]) == 0
    shown = capsys.readouterr().out
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "init", local_files_only=True)  # what the run loads
    assert tokenizer.chat_template
    first = load_problems(spec.dataset, "train")[0]
    assert f"ids: {encode_prompt(tokenizer, first)}" in shown
    assert "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nJanet" in shown
    assert 'after "####".<|im_end|>\n<|im_start|>assistant\n' in shown

    held_out = load_problems(spec.dataset, "eval")
    assert [p.record["question"] for p in held_out] == [r["question"] for r in gsm8k_records(2, start=100)]

    import reward_plugin

    reward_plugin.CALLS.clear()
    out = tmp_path / "out"
    assert cli.main(["train", str(run_file), "--out", str(out), "--local"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # 2 steps x 2 prompts walk the 4 training records once: the 2 crashing ones fail GROUP samples each
    assert sum(r["reward_errors"] for r in rows) == 2 * GROUP
    errors = [json.loads(line) for line in (out / "reward_errors.jsonl").read_text().splitlines()]
    assert len(errors) == 2 * GROUP and all("RuntimeError: boom on" in e["error"] for e in errors)
    assert {e["step"] for e in errors} <= {1, 2} and all(e["sample"].startswith("s") for e in errors)
    # the eval file is evaluated once, after the last step (evalEvery unset): its 2 problems, greedy
    assert [("eval_accuracy" in r) for r in rows] == [False, True]
    train_prompts = {TEMPLATE.format(question=r["question"]) for r in gsm8k_records(4)}
    trained = [c for c in reward_plugin.CALLS if c[0] in train_prompts]
    assert len(trained) == 4 * GROUP, "every training sample was scored"
    held = {TEMPLATE.format(question=r["question"]) for r in gsm8k_records(2, start=100)}
    assert {c[0] for c in reward_plugin.CALLS} - train_prompts == held, "and the held-out ones only in evaluation"
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    assert (out / "policy").is_dir()


def test_validate_refuses_a_reward_that_does_not_import(tmp_path: Path, capsys):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump({"spec": {"verifier": {"reward": "no_such_reward_module:score"}}}))
    assert cli.main(["validate", str(run_file)]) == 1
    assert "cannot import module 'no_such_reward_module'" in capsys.readouterr().err


def test_ray_verifiers_score_with_the_plugin_and_return_its_failures(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    from tlt.workers.services import VerifierWorker

    plugin = VerifierWorker("gsm8k", reward="reward_plugin:graded")
    record = {"question": "q", "answer": "#### 18"}
    assert plugin.score("so 18", "#### 18", "p", record, "s1-p0-g0") == (1.0, None)
    value, error = plugin.score("so 18", "#### 18", "p", {**record, "crash": True}, "s1-p0-g1")
    assert value == 0.0 and error.sample == "s1-p0-g1" and "RuntimeError: boom" in error.error
    assert VerifierWorker("gsm8k").score("so 18", "#### 18") == (0.0, None), "gsm8k wants ####"


@pytest.mark.slow
def test_ray_runtime_scores_with_the_plugin_and_records_its_failures(tmp_path: Path, monkeypatch):
    import ray

    from tlt.runtime.ray_executor import ray_trainer
    from tlt.spec.run import TLTTrainingRun

    monkeypatch.syspath_prepend(str(FIXTURES))
    # no PYTHONPATH for the actors: the runtime passes the folder the driver imports the plug-in from
    monkeypatch.delenv("PYTHONPATH", raising=False)
    run = TLTTrainingRun.model_validate(yaml.safe_load(_run_file(tmp_path).read_text()))
    out = tmp_path / "out"
    try:
        history = ray_trainer(run, out, num_cpus=2).train()
    finally:
        ray.shutdown()
    assert [r["step"] for r in history] == [1, 2]
    assert sum(r["reward_errors"] for r in history) == 2 * GROUP
    errors = [json.loads(line) for line in (out / "reward_errors.jsonl").read_text().splitlines()]
    assert len(errors) == 2 * GROUP and all("RuntimeError: boom on" in e["error"] for e in errors)
