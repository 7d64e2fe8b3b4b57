"""Prompt formatting: templates over record fields, the tokenizer's chat template, one encoding for everyone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from chat_tokenizer import CHAT_TEMPLATE, GSM8K, chat_tokenizer, gsm8k_records  # noqa: E402

from tlt.rl.reward_plugin import RewardPluginError, call_reward, load_reward, plugin_search_path  # noqa: E402
from tlt.tasks.problem import Problem  # noqa: E402
from tlt.tasks.prompt_format import PromptError, encode_prompt, render_prompt, template_fields  # noqa: E402
from tlt.tasks.tokenizer import build_task_tokenizer  # noqa: E402

needs_gsm8k = pytest.mark.skipif(not GSM8K.is_file(), reason=f"GSM8K test split not at {GSM8K}")
GSM8K_TEMPLATE = '{question}\nLet\'s think step by step and output the final answer after "####".'


def test_template_fields_and_render():
    assert template_fields("{question} ({topic}) {{literal}}") == ["question", "topic"]
    record = {"question": "2+2?", "topic": "sums"}
    assert render_prompt("{question} ({topic}) {{x}}", record, "r0") == "2+2? (sums) {x}"


@pytest.mark.parametrize(
    ("template", "message"), [("{}", "needs a name"), ("{0}", "needs a name"), ("{question", "not a valid template")]
)
def test_bad_templates_are_refused(template: str, message: str):
    with pytest.raises(PromptError, match=message):
        render_prompt(template, {"question": "x"}, "r0")


def test_missing_field_names_the_field_and_the_record():
    with pytest.raises(PromptError, match=r"data.jsonl record 7: dataset.prompt names field 'topic'.*\['question'\]"):
        render_prompt("{question} {topic}", {"question": "x"}, "data.jsonl record 7")


def test_plain_prompt_is_the_tokenizers_own_encoding():
    tokenizer = build_task_tokenizer()
    assert encode_prompt(tokenizer, Problem("1+2=", "3")) == tokenizer("1+2=").input_ids


@needs_gsm8k
def test_chat_prompt_is_apply_chat_template_with_the_generation_prompt():
    tokenizer = chat_tokenizer()
    question = gsm8k_records(1)[0]["question"]
    problem = Problem(render_prompt(GSM8K_TEMPLATE, {"question": question}, "r0"), "18", chat=True, system="Be brief.")
    ids = encode_prompt(tokenizer, problem)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == (
        f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{problem.prompt}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") and tokenizer.chat_template == CHAT_TEMPLATE
    no_system = encode_prompt(tokenizer, Problem(problem.prompt, "18", chat=True))
    assert tokenizer.decode(no_system).startswith("<|im_start|>user\n")


def test_chat_without_a_chat_template_is_a_clear_error():
    with pytest.raises(PromptError, match="no chat template"):
        encode_prompt(build_task_tokenizer(), Problem("1+2=", "3", chat=True))


@pytest.fixture()
def plugins_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "fixtures"))


def test_plugin_search_path_is_the_folder_the_driver_imports_from(plugins_on_path, tmp_path, monkeypatch):
    """The folder to put on the verifier actors' PYTHONPATH: for a module and for a package's module."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    assert plugin_search_path("reward_plugin:graded") == str(fixtures)
    package = tmp_path / "myrewards" / "sub"
    package.mkdir(parents=True)
    (tmp_path / "myrewards" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "score.py").write_text("def f(p, r, rec):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugin_search_path("myrewards.sub.score:f") == str(tmp_path.resolve())
    assert plugin_search_path("myrewards.sub:f") == str(tmp_path.resolve())
    assert plugin_search_path("no_such_module_anywhere:f") is None, "not importable here: nothing to add"
    assert plugin_search_path("yaml:safe_load") is None, "installed packages are on every worker's path already"
    assert plugin_search_path(":f") is None


def test_reward_plugin_is_called_with_prompt_response_and_record(plugins_on_path):
    import reward_plugin

    fn = load_reward("reward_plugin:graded")
    assert call_reward(fn, "p", "so #### 18", {"question": "q", "answer": "#### 18"}, "s0") == (1.0, None)
    assert call_reward(fn, "p", "x" * 25, {"question": "q", "answer": "#### 18"}, "s1") == (0.2, None)
    assert reward_plugin.CALLS[-1] == ("p", "x" * 25, {"question": "q", "answer": "#### 18"})


def test_a_crashing_or_non_float_reward_fails_its_sample_only(plugins_on_path):
    value, error = call_reward(load_reward("reward_plugin:graded"), "p", "r", {"question": "q", "crash": True}, "s3")
    assert value == 0.0 and error.sample == "s3"
    assert "Traceback" in error.error and "RuntimeError: boom on 'q'" in error.error
    value, error = call_reward(load_reward("reward_plugin:not_a_float"), "p", "r", {}, "s4")
    assert value == 0.0 and "returned 'yes' (str)" in error.error


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("reward_plugin", "must be 'module:function'"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("reward_plugin:missing", "has no attribute 'missing'"),
        ("reward_plugin:NOT_CALLABLE", "is a int, not a function"),
    ],
)
def test_a_bad_reward_target_is_a_clear_error(plugins_on_path, target: str, message: str):
    with pytest.raises(RewardPluginError, match=message):
        load_reward(target)
