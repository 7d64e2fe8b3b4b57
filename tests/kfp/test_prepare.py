"""prepare_data: built-in task or a JSONL / Parquet file with configurable keys, validated, with
statistics; clear errors for a missing field or no data; KFP's double-typed numbers accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tlt.spec.manifest_io import SpecError
from tlt.tasks.datasets import DatasetError
from tlt_components.common import from_struct
from tlt_components.prepare import prepare_dataset, read_info, read_problems

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


def test_builtin_task_with_counts_and_length_statistics(tmp_path: Path):
    meta = prepare_dataset({"dataset": {"builtin": {"numTrain": 40, "numEval": 10, "seed": 3}}}, tmp_path / "data")
    assert (meta["source"], meta["num_train"], meta["num_eval"], meta["eval_is_train"]) == ("builtin", 40, 10, False)
    assert set(meta["prompt_chars"]) == {"p50", "p90", "p99", "max", "mean"}
    assert meta["prompt_chars"]["max"] >= meta["prompt_chars"]["p50"] > 0
    train, held_out = read_problems(tmp_path / "data", "train"), read_problems(tmp_path / "data", "eval")
    assert len(train) == 40 and len(held_out) == 10
    assert [p.prompt for p in held_out] != [p.prompt for p in train[:10]], "held-out problems come from another seed"
    assert read_info(tmp_path / "data")["dataset"]["builtin"]["numTrain"] == 40


def test_numbers_arrive_as_doubles_from_kfp(tmp_path: Path):
    """KFP carries a dict parameter as a protobuf Struct: 40 arrives as 40.0."""
    assert from_struct({"a": 40.0, "b": [1.0, 0.5], "c": {"d": 2.0}}) == {"a": 40, "b": [1, 0.5], "c": {"d": 2}}
    meta = prepare_dataset({"dataset": {"builtin": {"numTrain": 40.0, "numEval": 10.0}}}, tmp_path / "data")
    assert meta["num_train"] == 40


@pytest.mark.skipif(not GSM8K.is_file(), reason=f"GSM8K test split not at {GSM8K}")
def test_gsm8k_jsonl_file(tmp_path: Path):
    spec = {"dataset": {"source": "file", "path": str(GSM8K), "answerFormat": "gsm8k"}}
    meta = prepare_dataset(spec, tmp_path / "data")
    assert (meta["num_train"], meta["num_eval"], meta["eval_is_train"]) == (1187, 132, False)
    held_out = {p.prompt for p in read_problems(tmp_path / "data", "eval")}
    assert len(held_out) == 132 and not held_out & {p.prompt for p in read_problems(tmp_path / "data", "train")}
    first = read_problems(tmp_path / "data", "train")[0]
    assert first.prompt.startswith("Janet") and "####" in first.answer


def test_parquet_file_with_custom_keys(tmp_path: Path):
    table = pa.table({"q": ["1+1=", "2+3="], "a": ["2", "5"], "other": [1, 2]})
    pq.write_table(table, tmp_path / "d.parquet")
    spec = {
        "dataset": {
            "source": "file",
            "path": str(tmp_path / "d.parquet"),
            "promptKey": "q",
            "answerKey": "a",
            "evalFraction": 0,
        }
    }
    meta = prepare_dataset(spec, tmp_path / "data")
    assert meta["num_train"] == 2
    assert [(p.prompt, p.answer) for p in read_problems(tmp_path / "data", "train")] == [("1+1=", "2"), ("2+3=", "5")]


def test_a_missing_field_is_named(tmp_path: Path):
    rows = [{"question": "1+1=", "answer": "2"}, {"question": "2+2="}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=r"d.jsonl:2: missing key 'answer'"):
        prepare_dataset({"dataset": {"source": "file", "path": str(tmp_path / "d.jsonl")}}, tmp_path / "data")


@pytest.mark.parametrize(
    ("content", "message"),
    [("", "has no records"), ("\n\n", "has no records"), ('{"question": " ", "answer": "1"}\n', "prompt is empty")],
)
def test_empty_data_is_refused(tmp_path: Path, content: str, message: str):
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(DatasetError, match=message):
        prepare_dataset({"dataset": {"source": "file", "path": str(tmp_path / "d.jsonl")}}, tmp_path / "data")


def test_a_bad_spec_lists_its_field(tmp_path: Path):
    with pytest.raises(SpecError, match=r"spec\.dataset\.source"):
        prepare_dataset({"dataset": {"source": "hub"}}, tmp_path / "data")
    with pytest.raises(SpecError, match="dataset.path is required"):
        prepare_dataset({"dataset": {"source": "file"}}, tmp_path / "data")


def test_eval_file_template_and_chat_flag_survive_the_artifact(tmp_path: Path):
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(3)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "e.jsonl").write_text(json.dumps({"question": "9+1", "answer": "10"}) + "\n")
    spec = {
        "dataset": {
            "source": "file",
            "path": str(tmp_path / "t.jsonl"),
            "evalPath": str(tmp_path / "e.jsonl"),
            "prompt": "Q: {question}=",
            "chat": True,
            "system": "Be brief.",
        }
    }
    meta = prepare_dataset(spec, tmp_path / "data")
    assert (meta["num_train"], meta["num_eval"]) == (3, 1)
    (held_out,) = read_problems(tmp_path / "data", "eval")
    assert (held_out.prompt, held_out.answer, held_out.chat, held_out.system) == ("Q: 9+1=", "10", True, "Be brief.")


def test_eval_fraction_zero_prepares_no_held_out_set_and_evaluation_refuses_it(tmp_path: Path):
    from tlt_components.evaluate import evaluate_export

    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(4)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = prepare_dataset(
        {"dataset": {"source": "file", "path": str(tmp_path / "t.jsonl"), "evalFraction": 0}}, tmp_path / "data"
    )
    assert (meta["num_train"], meta["num_eval"]) == (4, 0)
    with pytest.raises(ValueError, match="no held-out problems"):
        evaluate_export(
            tmp_path / "eagle",
            tmp_path / "policy",
            tmp_path / "data",
            num_prompts=4,
            draft_tokens=2,
            max_new_tokens=4,
            batch_size=1,
            temperature=0.0,
            dtype="float32",
        )
