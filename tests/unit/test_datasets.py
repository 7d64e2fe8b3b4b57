"""Dataset loading: built-in task and JSONL / Parquet files with configurable keys, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tlt.config import DatasetSpec
from tlt.rl.rewards import gsm8k_match
from tlt.tasks.datasets import DatasetError, load_problems

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def _file_spec(path: Path, **kw) -> DatasetSpec:
    return DatasetSpec(source="file", path=str(path), **kw)


def test_builtin_train_and_eval_come_from_different_seeds():
    spec = DatasetSpec(builtin={"numTrain": 64, "numEval": 16, "seed": 7})
    train, held_out = load_problems(spec, "train"), load_problems(spec, "eval")
    assert len(train) == 64 and len(held_out) == 16
    assert load_problems(spec, "train") == train
    assert [p.prompt for p in held_out] != [p.prompt for p in train[:16]]


@pytest.mark.skipif(not GSM8K.is_file(), reason="GSM8K test file not present")
def test_gsm8k_file_loads_unchanged_with_default_keys():
    problems = load_problems(_file_spec(GSM8K, answer_format="gsm8k"))
    assert len(problems) == 1319
    assert problems[0].prompt.startswith("Janet")
    assert all("####" in p.answer for p in problems)
    assert gsm8k_match("She makes 18 dollars.\n#### 18", problems[0].answer) == 1.0


def test_jsonl_with_custom_keys_and_numeric_answers(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"{i}+1=", "a": i + 1}) for i in range(3)) + "\n\n")
    problems = load_problems(_file_spec(path, prompt_key="q", answer_key="a"))
    assert [(p.prompt, p.answer) for p in problems] == [("0+1=", "1"), ("1+1=", "2"), ("2+1=", "3")]


def test_parquet_file(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"problem": ["2+2=", "3+3="], "solution": ["#### 4", "#### 6"]}), path)
    problems = load_problems(_file_spec(path, prompt_key="problem", answer_key="solution"))
    assert [p.answer for p in problems] == ["#### 4", "#### 6"]


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DatasetError, match="not found: .*nope.jsonl"):
        load_problems(_file_spec(tmp_path / "nope.jsonl"))


def test_missing_key_names_the_key_and_the_keys_present(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "1+1=", "solution": "2"}) + "\n")
    with pytest.raises(DatasetError, match=r"missing key 'answer'.*\['question', 'solution'\]"):
        load_problems(_file_spec(path))


def test_empty_file_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n")
    with pytest.raises(DatasetError, match="no records"):
        load_problems(_file_spec(path))


def test_bad_lines_and_suffixes_are_refused(tmp_path):
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"question": "x", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"d.jsonl:2: expected a JSON object"):
        load_problems(_file_spec(bad))
    csv = tmp_path / "d.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(DatasetError, match=r"\.jsonl, \.json or \.parquet"):
        load_problems(_file_spec(csv))
