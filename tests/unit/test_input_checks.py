"""`tlt validate` reads what the run reads, offline: each bad model folder, dataset, prompt or port is one
line naming the field and the file, fast, with no traceback and no hub lookup; `tlt train` refuses the
same before anything starts."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
import yaml

from tlt.cli import main
from tlt.models.loading import model_folder_problems, save_policy, weights_problem
from tlt.models.tiny import tiny_model
from tlt.runtime.input_checks import input_problems, metrics_port_problem
from tlt.spec.run import RunSpec
from tlt.tasks.tokenizer import build_task_tokenizer

RECORDS = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(5)]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("policy") / "model"
    save_policy(tiny_model("qwen2"), build_task_tokenizer(), folder)
    return folder


@pytest.fixture
def model(saved_model: Path, tmp_path: Path) -> Path:
    """A copy of a tiny Qwen2 policy folder this test may break."""
    return Path(shutil.copytree(saved_model, tmp_path / "model"))


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _run_file(tmp_path: Path, model: Path | str, data: Path | None = None, **dataset) -> Path:
    data = data if data is not None else _jsonl(tmp_path / "d.jsonl", RECORDS)
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {"spec": {"model": {"path": str(model)}, "dataset": {"source": "file", "path": str(data), **dataset}}}
        )
    )
    return path


def _refused(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    """The one line `tlt validate` refuses `path` with (within 5 s, no traceback)."""
    start = time.perf_counter()
    code = main(["validate", str(path), *flags])
    assert time.perf_counter() - start < 5.0
    out, err = capsys.readouterr()
    assert code == 1 and not out and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: spec.")
    return lines[0]


def test_a_good_run_is_ok(tmp_path, model, capsys):
    assert main(["validate", str(_run_file(tmp_path, model))]) == 0
    assert ": ok (" in capsys.readouterr().out


def test_a_model_folder_that_does_not_exist_never_reaches_the_hub(tmp_path, capsys):
    line = _refused(_run_file(tmp_path, tmp_path / "no-such-model"), capsys)
    assert f"spec.model.path: model folder '{tmp_path / 'no-such-model'}' does not exist" in line
    assert "Repo id" not in line
    # the same with --show-prompt, which loads the tokenizer
    assert _refused(_run_file(tmp_path, "org/Model-7B"), capsys, "--show-prompt", "1").endswith(
        "model folder 'org/Model-7B' does not exist (a local folder is required; hub ids are not fetched)"
    )


@pytest.mark.parametrize(
    ("removed", "message"),
    [
        ("config.json", "has no config.json"),
        ("model.safetensors", "no weights in"),
        ("tokenizer.json", "no tokenizer in"),
    ],
)
def test_a_folder_without_config_weights_or_tokenizer_is_one_line(tmp_path, model, capsys, removed, message):
    (model / removed).unlink()
    line = _refused(_run_file(tmp_path, model), capsys)
    assert line.startswith(f"{tmp_path / 'run.yaml'}: spec.model.path: ") and message in line and str(model) in line


def test_an_empty_folder_has_one_line_per_missing_part(tmp_path):
    (tmp_path / "empty").mkdir()
    config, weights, tokenizer = model_folder_problems(tmp_path / "empty")
    assert "has no config.json" in config and "no weights in" in weights and "no tokenizer in" in tokenizer


def test_a_malformed_config_json_names_the_file_and_the_json_error(tmp_path, model, capsys):
    (model / "config.json").write_text('{"model_type": "qwen2",\n  "vocab_size": 64,,\n}')
    line = _refused(_run_file(tmp_path, model), capsys)
    assert f"{model / 'config.json'} is not a JSON file (Expecting property name" in line and "line 2" in line


def test_an_unsupported_model_type_names_the_allowed_ones(tmp_path, model, capsys):
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    line = _refused(_run_file(tmp_path, model), capsys)
    assert f"model_type 'gpt2' in {model / 'config.json'} is not supported; allowed: llama, qwen2, qwen3" in line


def test_weights_that_are_not_safetensors_or_a_shard_that_is_missing(tmp_path, model):
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    assert "model.safetensors is not a safetensors file" in weights_problem(model)
    (model / "model.safetensors").unlink()
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    assert "names shards that are not in the folder: model-00001-of-00002.safetensors" in weights_problem(model)


def test_an_empty_dataset(tmp_path, model, capsys):
    (tmp_path / "empty.jsonl").write_text("\n")
    line = _refused(_run_file(tmp_path, model, tmp_path / "empty.jsonl"), capsys)
    assert line.endswith(f"spec.dataset.path: dataset file {tmp_path / 'empty.jsonl'} has no records")


def test_a_malformed_jsonl_line_is_named_by_its_1_based_line(tmp_path, model, capsys):
    data = _jsonl(tmp_path / "d.jsonl", RECORDS[:2])
    data.write_text(data.read_text() + "\n" + '{"question": "x", "answer": }\n')  # a blank line 3 still counts
    line = _refused(_run_file(tmp_path, model, data), capsys)
    assert f"spec.dataset.path: {data}:4: not a JSON object per line (Expecting value at column" in line


def test_a_record_without_the_answer_key(tmp_path, model, capsys):
    data = _jsonl(tmp_path / "d.jsonl", [RECORDS[0], {"question": "2+2="}])
    line = _refused(_run_file(tmp_path, model, data), capsys)
    assert f"spec.dataset.path: {data}:2: missing key 'answer' (dataset.answerKey); keys present: ['question']" in line


def test_a_prompt_field_no_record_has(tmp_path, model, capsys):
    line = _refused(_run_file(tmp_path, model, promptKey="problem"), capsys)
    assert f"{tmp_path / 'd.jsonl'}:1: missing key 'problem' (dataset.promptKey)" in line
    line = _refused(_run_file(tmp_path, model, prompt="{topic}: {question}"), capsys)
    assert f"{tmp_path / 'd.jsonl'}:1: dataset.prompt names field 'topic', which the record lacks" in line


def test_an_unreadable_parquet_file(tmp_path, model, capsys):
    (tmp_path / "d.parquet").write_bytes(b"PAR1 but not really")
    assert "not a readable Parquet file" in _refused(_run_file(tmp_path, model, tmp_path / "d.parquet"), capsys)


def test_an_eval_path_to_no_file(tmp_path, model, capsys):
    line = _refused(_run_file(tmp_path, model, evalPath=str(tmp_path / "test.jsonl")), capsys)
    assert line.endswith(f"spec.dataset.evalPath: dataset file not found: {tmp_path / 'test.jsonl'}")


def test_held_out_evaluation_without_held_out_problems(tmp_path, model, capsys):
    path = _run_file(tmp_path, model, evalFraction=0)
    run = yaml.safe_load(path.read_text())
    run["spec"]["algorithm"] = {"evalEvery": 2}
    path.write_text(yaml.safe_dump(run))
    line = _refused(path, capsys)
    assert "spec.algorithm.evalEvery: 2 needs held-out problems" in line and "dataset.evalPath" in line


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{{ raise_exception('this model has no system role') }}", "TemplateError: this model has no system role"),
        ("{% for m in messages %}{{ m['content'] }", "TemplateSyntaxError: unexpected '}' at template line 1"),
    ],
)
def test_a_chat_template_that_raises_or_does_not_parse(tmp_path, model, capsys, template, error):
    tokenizer = build_task_tokenizer()
    tokenizer.chat_template = template
    tokenizer.save_pretrained(model)
    line = _refused(_run_file(tmp_path, model, chat=True), capsys)
    assert f"spec.model.path: the chat template of '{model}' fails on {tmp_path / 'd.jsonl'}:1 ({error})" in line


def test_chat_without_a_chat_template(tmp_path, model, capsys):
    line = _refused(_run_file(tmp_path, model, chat=True), capsys)
    assert f"spec.dataset.chat: true, but the tokenizer in '{model}' has no chat template" in line


def test_a_file_dataset_needs_a_model_folder():
    spec = RunSpec.model_validate({"dataset": {"source": "file", "path": "d.jsonl"}})
    assert input_problems(spec)[0].startswith("spec.model.path: required with dataset.source 'file'")
    assert input_problems(RunSpec()) == [], "the built-in task and its policy read nothing from this machine"


def test_schema_only_checks_the_spec_alone(tmp_path, capsys):
    assert main(["validate", "--schema-only", str(_run_file(tmp_path, tmp_path / "on-the-cluster"))]) == 0
    assert ": ok (" in capsys.readouterr().out


def test_mode_off_unquoted_says_it_was_read_as_a_boolean(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("spec:\n  speculative:\n    mode: off\n")
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [  # the schema's header, then one line per error
        f"{path}: 1 error(s)",
        "  spec.speculative.mode: read as the boolean false (YAML reads unquoted on/off/yes/no/true/false as "
        """booleans); quote it: "off"; allowed: 'off', 'ngram', 'static' or 'tlt'""",
    ]


def _busy_port() -> socket.socket:
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    return listener


def test_a_busy_metrics_port_is_a_warning_in_validate_and_refused_by_train(tmp_path, capsys):
    with _busy_port() as listener:
        port = listener.getsockname()[1]
        path = tmp_path / "run.yaml"
        path.write_text(
            yaml.safe_dump({"spec": {"monitoring": {"loggers": ["jsonl", "prometheus"], "metricsPort": port}}})
        )
        assert main(["validate", str(path)]) == 0
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"{path}: warning: spec.monitoring.metricsPort: port {port} is in use on this machine; stop "
            "what listens there or set monitoring.metricsPort to a free port (1024-65535) (tlt train here "
            "would refuse to start)"
        ]
        assert main(["train", str(path), "--local", "--out", str(tmp_path / "out")]) == 2
        assert f"spec.monitoring.metricsPort: port {port} is in use" in capsys.readouterr().err
        assert not (tmp_path / "out").exists()
    assert metrics_port_problem(RunSpec.model_validate({"monitoring": {"metricsPort": port}})) is None, (
        "without the prometheus logger the port is not used"
    )


def test_the_prometheus_logger_names_the_busy_port(tmp_path):
    from tlt.monitoring import build_loggers
    from tlt.spec.run import MonitoringSpec

    with _busy_port() as listener:
        port = listener.getsockname()[1]
        spec = MonitoringSpec(loggers=["prometheus"], metrics_port=port)
        with pytest.raises(OSError, match=rf"^spec.monitoring.metricsPort: port {port} is in use on this machine"):
            build_loggers(spec, tmp_path)


def test_train_refuses_bad_inputs_before_anything_starts(tmp_path, capsys):
    path = _run_file(tmp_path, tmp_path / "no-such-model")
    assert main(["train", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spec.model.path: model folder" in err[0] and "does not exist" in err[0]
    assert not (tmp_path / "out").exists()
