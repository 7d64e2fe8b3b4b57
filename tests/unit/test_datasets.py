"""Dataset loading: built-in task and JSONL / Parquet files with configurable keys, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tlt.rl.rewards import gsm8k_match
from tlt.spec.run import DatasetSpec
from tlt.tasks.datasets import DatasetError, held_out_indices, load_problems

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def _file_spec(path: Path, **kw) -> DatasetSpec:
    """A file dataset; no held-out fraction unless asked, so the train split is the whole file."""
    return DatasetSpec(source="file", path=str(path), **{"eval_fraction": 0.0, **kw})


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
    assert problems[0].record["question"] == problems[0].prompt
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


def _numbered(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(count)))
    return path


def test_without_eval_path_a_seeded_fraction_is_held_out_and_never_trained_on(tmp_path):
    path = _numbered(tmp_path / "d.jsonl", 40)
    spec = DatasetSpec(source="file", path=str(path))  # the default: evalFraction 0.1, splitSeed 0
    train, held_out = load_problems(spec, "train"), load_problems(spec, "eval")
    assert len(train) == 36 and len(held_out) == 4
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert {p.prompt for p in train} | {p.prompt for p in held_out} == {f"q{i}" for i in range(40)}
    assert load_problems(spec, "eval") == held_out, "the split is a function of the seed alone"
    other = load_problems(spec.model_copy(update={"split_seed": 1}), "eval")
    assert [p.prompt for p in other] != [p.prompt for p in held_out]


def test_eval_path_is_the_eval_split_and_train_reads_all_of_path(tmp_path):
    train_file, eval_file = _numbered(tmp_path / "train.jsonl", 5), tmp_path / "eval.parquet"
    pq.write_table(pa.table({"question": ["e0", "e1"], "answer": ["7", "8"]}), eval_file)
    spec = DatasetSpec.model_validate({"source": "file", "path": str(train_file), "evalPath": str(eval_file)})
    assert [p.prompt for p in load_problems(spec, "train")] == [f"q{i}" for i in range(5)]
    assert [(p.prompt, p.answer) for p in load_problems(spec, "eval")] == [("e0", "7"), ("e1", "8")]


def test_eval_fraction_zero_without_eval_path_disables_held_out_evaluation(tmp_path):
    spec = _file_spec(_numbered(tmp_path / "d.jsonl", 10))
    assert len(load_problems(spec, "train")) == 10
    with pytest.raises(DatasetError, match=r"no held-out evaluation .*evalPath"):
        load_problems(spec, "eval")


def test_held_out_indices_bounds():
    assert held_out_indices(1, 0.5, 0) == [] and held_out_indices(10, 0.0, 0) == []
    assert len(held_out_indices(3, 0.01, 0)) == 1, "a positive fraction holds out at least one record"
    assert len(held_out_indices(3, 0.99, 0)) == 2, "training keeps at least one record"
    with pytest.raises(ValueError, match="fraction"):
        held_out_indices(10, 1.0, 0)


def test_prompt_template_chat_and_system_reach_every_problem(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "2+2?", "answer": "#### 4", "topic": "sums"}) + "\n")
    spec = _file_spec(path, prompt="[{topic}] {question}\nAnswer after ####.", chat=True, system="Be brief.")
    (problem,) = load_problems(spec)
    assert problem.prompt == "[sums] 2+2?\nAnswer after ####." and problem.answer == "#### 4"
    assert problem.chat and problem.system == "Be brief." and problem.record["topic"] == "sums"


def test_a_template_field_the_record_lacks_names_field_and_record(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "a", "answer": "1"}) + "\n" + json.dumps({"answer": "2"}) + "\n")
    with pytest.raises(DatasetError, match=r"d.jsonl:2: dataset.prompt names field 'question'"):
        load_problems(_file_spec(path, prompt="{question}\nThink."))


def test_system_without_chat_is_refused():
    with pytest.raises(ValueError, match="dataset.system needs dataset.chat"):
        DatasetSpec(system="x")
