"""One interface for problems: the built-in task or a JSONL / Parquet file.

`load_problems(spec, split)` returns `Problem(prompt, answer)` records for a `DatasetSpec`:
- `source: builtin` generates the countdown task (train and eval from different seeds);
- `source: file` reads `spec.path` (`.jsonl` / `.json` lines, or `.parquet`) and takes each
  record's `prompt_key` / `answer_key` fields; a GSM8K file (`question`, `answer` ending in
  `#### N`) works with the defaults. A file has one split: both splits read all of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from tlt.config import DatasetSpec
from tlt.tasks.countdown import CountdownTask, generate
from tlt.tasks.problem import Problem

Split = Literal["train", "eval"]
EVAL_SEED_OFFSET = 1_000_003


class DatasetError(ValueError):
    """A dataset file that cannot be used: missing, unreadable, wrong keys, or empty."""


def load_problems(spec: DatasetSpec, split: Split = "train") -> list[Problem]:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if spec.source == "builtin":
        task = CountdownTask()  # the distribution the default warm start is trained on
        if split == "train":
            return generate(spec.builtin.num_train, spec.builtin.seed, task)
        return generate(spec.builtin.num_eval, spec.builtin.seed + EVAL_SEED_OFFSET, task)
    if spec.path is None:
        raise DatasetError("dataset.path is required when dataset.source is 'file'")
    return read_problems(Path(spec.path), spec.prompt_key, spec.answer_key)


def read_records(path: Path) -> list[dict[str, Any]]:
    """All records of a JSONL (`.jsonl`, `.json`) or Parquet (`.parquet`) file."""
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        records = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:{number}: not a JSON object per line ({exc.msg})") from None
                if not isinstance(record, dict):
                    raise DatasetError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
                records.append(record)
        return records
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise DatasetError(f"dataset file {path} must end in .jsonl, .json or .parquet")


def _text(value: Any, key: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise DatasetError(f"{where}: field {key!r} must be a string or number, got {type(value).__name__}")


def read_problems(path: Path, prompt_key: str, answer_key: str) -> list[Problem]:
    """Problems from a file's `prompt_key` / `answer_key` fields; every record must have both."""
    records = read_records(path)
    if not records:
        raise DatasetError(f"dataset file {path} has no records")
    problems = []
    for index, record in enumerate(records):
        where = f"{path} record {index}"
        for key in (prompt_key, answer_key):
            if key not in record:
                raise DatasetError(
                    f"{where}: missing key {key!r}; keys present: {sorted(record)} "
                    f"(set dataset.promptKey / dataset.answerKey)"
                )
        problems.append(Problem(_text(record[prompt_key], prompt_key, where), _text(record[answer_key], answer_key, where)))
    return problems
