"""Held-out evaluation (`tlt.runtime.heldout`): when it runs, which problems, how answers are asked and
scored."""

from __future__ import annotations

import torch

from tlt.rollout.types import Completion
from tlt.runtime.heldout import eval_due, eval_metrics, eval_requests, heldout_problems
from tlt.spec.run import AlgorithmSpec, RunSpec
from tlt.tasks.tokenizer import build_task_tokenizer


def test_evaluation_runs_every_n_steps_and_after_the_last():
    algo = AlgorithmSpec(steps=7, eval_every=3)
    assert [s for s in range(1, 8) if eval_due(s, algo)] == [3, 6, 7]
    assert not any(eval_due(s, AlgorithmSpec(steps=7)) for s in range(1, 8)), "evalEvery 0: never"


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
