"""Held-out evaluation (`tlt.runtime.heldout`): when it runs, which problems, how answers are asked and
scored."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tlt.rollout.types import Completion
from tlt.runtime.heldout import eval_due, eval_interval, eval_metrics, eval_requests, heldout_problems
from tlt.spec.run import RunSpec
from tlt.tasks.datasets import DatasetError
from tlt.tasks.tokenizer import build_task_tokenizer


def test_evaluation_runs_every_n_steps_and_after_the_last():
    assert [s for s in range(1, 8) if eval_due(s, 3, 7)] == [3, 6, 7]
    assert not any(eval_due(s, 0, 7) for s in range(1, 8)), "evalEvery 0: never"


@pytest.mark.parametrize(
    ("dataset", "every", "interval"),
    [
        ({"source": "file", "path": "t.jsonl"}, None, 5),  # evalFraction 0.1 by default: after the last step
        ({"source": "file", "path": "t.jsonl", "evalPath": "e.jsonl"}, None, 5),
        ({"source": "file", "path": "t.jsonl", "evalFraction": 0}, None, 0),  # nothing held out
        ({"source": "file", "path": "t.jsonl"}, 0, 0),  # asked for never
        ({"source": "file", "path": "t.jsonl"}, 2, 2),
        ({}, None, 0),  # the built-in task evaluates when asked
    ],
)
def test_a_file_with_an_eval_split_is_evaluated_after_the_last_step_by_default(dataset, every, interval):
    spec = RunSpec.model_validate({"dataset": dataset, "algorithm": {"steps": 5, "evalEvery": every}})
    assert eval_interval(spec) == interval


def test_the_default_evaluation_of_a_file_says_so_and_skips_a_file_too_small_to_hold_out(tmp_path, caplog):
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(20)]
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = RunSpec.model_validate({"dataset": {"source": "file", "path": str(data)}, "algorithm": {"steps": 3}})
    with caplog.at_level(logging.INFO, logger="tlt.runtime.heldout"):
        assert len(heldout_problems(spec)) == 2
    assert "held-out evaluation of 2 problems after step 3" in caplog.text
    data.write_text(json.dumps(rows[0]) + "\n")
    assert heldout_problems(spec) == [], "one record holds nothing out: no evaluation, no error"
    asked = spec.model_copy(update={"algorithm": spec.algorithm.model_copy(update={"eval_every": 1})})
    with pytest.raises(DatasetError):
        heldout_problems(asked)


def test_the_same_first_problems_of_the_eval_split_every_time():
    spec = RunSpec.model_validate({"algorithm": {"evalEvery": 1, "evalSamples": 5}, "dataset": {"builtin": {}}})
    first, again = heldout_problems(spec), heldout_problems(spec)
    assert len(first) == 5 and [p.prompt for p in first] == [p.prompt for p in again]
    assert heldout_problems(RunSpec()) == [], "off: nothing loaded"


def test_requests_are_greedy_by_default_and_seeded_by_problem():
    tokenizer = build_task_tokenizer()
    spec = RunSpec.model_validate({"algorithm": {"evalEvery": 1, "evalSamples": 3, "maxNewTokens": 9}})
    requests = eval_requests(heldout_problems(spec), tokenizer, spec.algorithm)
    assert [r.request_id for r in requests] == ["eval-p0", "eval-p1", "eval-p2"]
    assert all(r.params.temperature == 0.0 and r.params.max_new_tokens == 9 for r in requests)
    assert len({r.params.seed for r in requests}) == 3
    assert requests[0].params.stop_token_ids == (tokenizer.eos_token_id,)


def test_accuracy_counts_full_rewards_and_reward_is_the_mean():
    tokenizer = build_task_tokenizer()
    spec = RunSpec.model_validate({"algorithm": {"evalEvery": 1, "evalSamples": 2}})
    problems = heldout_problems(spec)
    answers = [p.answer for p in problems]
    texts = [f"<answer>{answers[0]}</answer>", "<answer>no idea</answer>"]
    completions = [
        Completion(f"eval-p{i}", [], tokenizer.encode(t), torch.zeros(0), None, "stop") for i, t in enumerate(texts)
    ]
    got = eval_metrics(completions, problems, tokenizer, spec.dataset.answer_format, None, 1.5)
    assert got == {"eval_reward_mean": 0.5, "eval_accuracy": 0.5, "eval_samples": 2, "eval_seconds": 1.5}


def test_plain_generation_on_the_policy_answers_like_the_engine():
    from tlt.models.tiny import tiny_model
    from tlt.rollout.engine import Engine
    from tlt.runtime.heldout import plain_generate

    tokenizer = build_task_tokenizer()
    policy = tiny_model("qwen2", vocab_size=len(tokenizer), seed=4)
    spec = RunSpec.model_validate({"algorithm": {"evalEvery": 1, "evalSamples": 3, "maxNewTokens": 6}})
    requests = eval_requests(heldout_problems(spec), tokenizer, spec.algorithm)
    got = plain_generate(policy, max_batch_size=2)(requests)
    want = Engine(policy, max_batch_size=8, max_context=64, return_hidden=False).generate(requests)
    assert [c.token_ids for c in got] == [c.token_ids for c in want], "greedy: the same tokens, whatever the batch"
