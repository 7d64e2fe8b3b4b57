"""Data preparation (the `prepare_data` component): the run's prompts and answers, validated, as a Dataset.

The source is the run spec's `dataset` section: the built-in task, or a JSONL / Parquet file read
with its `prompt` template or `promptKey`, and its `answerKey`. A missing file, a record without one of the keys, an
empty
prompt or answer, or no records at all fails the component with the file, record and field named.
The artifact is a folder:

    train.jsonl     {"prompt", "answer", "chat", "system"} per line, the training problems (template applied;
                    the chat template is the tokenizer's, applied by `encode_prompt` where the ids are made)
    eval.jsonl      the held-out problems: `evalPath`, else the `evalFraction` of the file held out
                    (no record in both; empty when a file run disables held-out evaluation)
    dataset.json    the dataset section it was made from and the statistics below

Artifact metadata: counts, prompt / answer length statistics in characters (p50 / p90 / p99 /
max / mean), whether eval shares records with train (never), and the sha256 of train.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from tlt.tasks.datasets import DatasetError, load_problems, read_records
from tlt.tasks.evaluate import length_stats
from tlt.tasks.problem import Problem
from tlt_components.common import parse_run_spec

log = logging.getLogger(__name__)

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
INFO_FILE = "dataset.json"


def _write_jsonl(path: Path, problems: list[Problem]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for problem in problems:
            row = {"prompt": problem.prompt, "answer": problem.answer, "chat": problem.chat, "system": problem.system}
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def check_problems(problems: list[Problem], where: str) -> None:
    """Raise DatasetError for no problems or an empty prompt / answer (naming the record's file and line,
    else its 1-based number)."""
    if not problems:
        raise DatasetError(f"{where}: no problems")
    for number, problem in enumerate(problems, start=1):
        for field in ("prompt", "answer"):
            if not getattr(problem, field).strip():
                raise DatasetError(f"{problem.source or f'{where} problem {number}'}: {field} is empty")


def prepare_dataset(run_spec: dict[str, Any], out_dir: str | Path) -> dict[str, Any]:
    """Validate the run spec's dataset, write the artifact folder, return its metadata."""
    dataset = parse_run_spec(run_spec).spec.dataset
    where = "built-in task" if dataset.source == "builtin" else f"dataset file {dataset.path}"
    eval_disabled = dataset.source == "file" and dataset.eval_path is None and dataset.eval_fraction == 0
    train = load_problems(dataset, "train")
    check_problems(train, where)
    held_out = [] if eval_disabled else load_problems(dataset, "eval")
    if not eval_disabled:
        check_problems(held_out, where)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / TRAIN_FILE, train)
    _write_jsonl(out / EVAL_FILE, held_out)
    metadata = {
        "source": dataset.source,
        "num_train": len(train),
        "num_eval": len(held_out),
        "eval_is_train": False,
        "prompt_chars": length_stats([len(p.prompt) for p in train]),
        "answer_chars": length_stats([len(p.answer) for p in train]),
        "sha256": hashlib.sha256((out / TRAIN_FILE).read_bytes()).hexdigest(),
        "dataset": dataset.model_dump(mode="json", by_alias=True),
    }
    (out / INFO_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True))
    log.info("prepared %d train / %d eval problems from the %s", len(train), len(held_out), where)
    return metadata


def read_problems(data_dir: str | Path, split: str) -> list[Problem]:
    """The problems of a prepared Dataset folder; split is `train` or `eval`."""
    files = {"train": TRAIN_FILE, "eval": EVAL_FILE}
    if split not in files:
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    records = read_records(Path(data_dir) / files[split])
    return [Problem(r["prompt"], r["answer"], chat=bool(r.get("chat")), system=r.get("system")) for r in records]


def read_info(data_dir: str | Path) -> dict[str, Any]:
    """The dataset.json of a prepared Dataset folder."""
    path = Path(data_dir) / INFO_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{data_dir} is not a prepared dataset (no {INFO_FILE}); produce it with prepare_data")
    return json.loads(path.read_text())
