"""One interface for problems: the built-in task or a JSONL / Parquet file.

`load_problems(spec, split)` returns `Problem(prompt, answer)` records for a `DatasetSpec`:
- `source: builtin` generates the countdown task (train and eval from different seeds);
- `source: file` reads `spec.path` (`.jsonl` / `.json` lines, or `.parquet`) and takes each
  record's `answer_key` field and its prompt: the `prompt` template filled in from the record
  (`tlt.tasks.prompt_format.render_prompt`), else its `prompt_key` field; a GSM8K file (`question`,
  `answer` ending in `#### N`) works with the defaults. Every problem carries `chat` / `system`
  and its record (for reward plug-ins).

Splits of a file dataset: training and held-out evaluation never share a record.
- with `eval_path`: train reads all of `path`, eval all of `eval_path`;
- without it: `held_out_indices` holds out round(eval_fraction * N) records of `path` (at least one
  when the fraction is > 0 and N >= 2), chosen by `split_seed` alone; train reads the rest, eval those;
- `eval_fraction: 0` and no `eval_path`: train reads all of `path` and the eval split is an error
  (held-out evaluation is disabled; nothing silently evaluates on training records).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

from tlt.spec.run import DatasetSpec
from tlt.tasks.countdown import CountdownTask, generate
from tlt.tasks.problem import Problem
from tlt.tasks.prompt_format import PromptError, render_prompt

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
    if spec.eval_path is not None:
        return read_problems(Path(spec.path if split == "train" else spec.eval_path), spec)
    problems = read_problems(Path(spec.path), spec)
    held_out = set(held_out_indices(len(problems), spec.eval_fraction, spec.split_seed))
    if split == "eval" and not held_out:
        raise DatasetError(
            f"no held-out evaluation for {spec.path}: set dataset.evalPath, or dataset.evalFraction "
            f"> 0 with at least 2 records (training records are never evaluated on)"
        )
    return [p for i, p in enumerate(problems) if (i in held_out) == (split == "eval")]


def held_out_indices(num_records: int, fraction: float, seed: int) -> list[int]:
    """Sorted indices of the records held out for evaluation: round(fraction * N), at least 1 when
    fraction > 0 and N >= 2, at most N - 1 (training keeps one); a function of (N, fraction, seed) alone."""
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    if fraction == 0 or num_records < 2:
        return []
    count = min(max(round(fraction * num_records), 1), num_records - 1)
    return sorted(random.Random(f"tlt-split-{seed}").sample(range(num_records), count))


def located_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every record of a JSONL (`.jsonl`, `.json`) or Parquet (`.parquet`) file with where it is, 1-based:
    `data.jsonl:6` (its line; blank lines are skipped but counted) or `data.parquet row 6`. A file that
    is missing, unreadable, or has a line that is not a JSON object raises DatasetError naming it."""
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        records = []
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                where = f"{path}:{number}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DatasetError(
                        f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line)"
                    ) from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(
                        f"{where}: not a JSON object per line ({exc.msg} at column {exc.colno})"
                    ) from None
                if not isinstance(record, dict):
                    raise DatasetError(f"{where}: expected a JSON object, got {type(record).__name__}")
                records.append((where, record))
        return records
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
        return [(f"{path} row {number}", row) for number, row in enumerate(rows, start=1)]
    raise DatasetError(f"dataset file {path} must end in .jsonl, .json or .parquet")


def read_records(path: Path) -> list[dict[str, Any]]:
    """All records of a JSONL or Parquet file (`located_records` without the locations)."""
    return [record for _, record in located_records(path)]


def _text(value: Any, key: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise DatasetError(f"{where}: field {key!r} must be a string or number, got {type(value).__name__}")


def read_problems(path: Path, spec: DatasetSpec) -> list[Problem]:
    """Problems from a file: the prompt (`spec.prompt` template, else the `prompt_key` field) and the
    `answer_key` field of every record, each with `spec.chat` / `spec.system` and its record."""
    records = located_records(path)
    if not records:
        raise DatasetError(f"dataset file {path} has no records")
    keys = {spec.answer_key: "answerKey"}
    if not spec.prompt:
        keys = {spec.prompt_key: "promptKey", **keys}
    problems = []
    for where, record in records:
        for key, field in keys.items():
            if key not in record:
                raise DatasetError(f"{where}: missing key {key!r} (dataset.{field}); keys present: {sorted(record)}")
        if spec.prompt:
            try:
                prompt = render_prompt(spec.prompt, record, where)
            except PromptError as exc:
                raise DatasetError(str(exc)) from None
        else:
            prompt = _text(record[spec.prompt_key], spec.prompt_key, where)
        answer = _text(record[spec.answer_key], spec.answer_key, where)
        problems.append(Problem(prompt, answer, chat=spec.chat, system=spec.system, record=record, source=where))
    return problems
