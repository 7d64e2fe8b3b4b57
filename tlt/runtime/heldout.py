"""Held-out evaluation during training: every `algorithm.evalEvery` steps (and after the last), the current
policy answers the first `algorithm.evalSamples` problems of the dataset's eval split (`dataset.evalPath`,
the `evalFraction` held out of `path`, or the built-in task's held-out problems), greedy by default, and the
answers are scored as rollouts are (the answer check or the reward plug-in).

Metrics (added to the step's row; a run can then tell learning from noise):
    eval_reward_mean   mean reward over the evaluated problems
    eval_accuracy      fraction that earned the full reward (>= 1.0: a correct answer for the answer check)
    eval_samples       problems evaluated
    eval_seconds       wall time of the evaluation, kept apart from `step_seconds` so speed ratios stay
                       about training steps
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.rl.reward_plugin import RewardError, RewardFn
from tlt.rollout.engine import Engine
from tlt.rollout.types import Completion, Request, SamplingParams
from tlt.runtime.rl_step import derive_seed, score_completions
from tlt.spec.run import AlgorithmSpec, RunSpec
from tlt.tasks.datasets import DatasetError, load_problems
from tlt.tasks.problem import Problem
from tlt.tasks.prompt_format import encode_prompt

log = logging.getLogger(__name__)

METRICS = ("eval_reward_mean", "eval_accuracy", "eval_samples", "eval_seconds")


def eval_interval(spec: RunSpec) -> int:
    """Steps between held-out evaluations (0: none): `algorithm.evalEvery` when set; unset, the last step alone
    when the dataset is a file with an eval split of its own (as verl validates by default), else none."""
    every = spec.algorithm.eval_every
    if every is not None:
        return every
    data = spec.dataset
    has_split = data.source == "file" and (data.eval_path is not None or data.eval_fraction > 0)
    return spec.algorithm.steps if has_split else 0


def eval_due(step: int, every: int, steps: int) -> bool:
    """Whether step `step` (1-based, just finished) of a run of `steps` is followed by a held-out evaluation,
    every `every` steps (`eval_interval`; 0: never) and after the last."""
    return every > 0 and (step % every == 0 or step == steps)


def heldout_problems(spec: RunSpec) -> list[Problem]:
    """The problems every evaluation of this run answers (the same ones each time); [] when evaluation is off.
    Raises DatasetError when `algorithm.evalEvery` asks for it and the dataset has no eval split; unset, a
    file too small to hold a record out evaluates nothing (logged)."""
    if eval_interval(spec) == 0:
        return []
    try:
        problems = load_problems(spec.dataset, "eval")[: spec.algorithm.eval_samples]
    except DatasetError:
        if spec.algorithm.eval_every is not None:
            raise
        log.info("no held-out evaluation: %s holds no record out", spec.dataset.path)
        return []
    if spec.algorithm.eval_every is None:
        log.info(
            "held-out evaluation of %d problems after step %d (algorithm.evalEvery unset; 0 turns it off)",
            len(problems),
            spec.algorithm.steps,
        )
    return problems


def eval_requests(
    problems: Sequence[Problem], tokenizer: PreTrainedTokenizerBase, algo: AlgorithmSpec
) -> list[Request]:
    """One request per problem at `evalTemperature` (top-p 1), seeded by (seed, problem), so a problem's
    answer depends only on the policy."""
    stop = () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    return [
        Request(
            f"eval-p{index}",
            encode_prompt(tokenizer, problem),
            SamplingParams(
                temperature=algo.eval_temperature,
                top_p=1.0,
                max_new_tokens=algo.max_new_tokens,
                stop_token_ids=stop,
                seed=derive_seed("eval", algo.seed, index),
            ),
        )
        for index, problem in enumerate(problems)
    ]


def eval_metrics(
    completions: Sequence[Completion],
    problems: Sequence[Problem],
    tokenizer: PreTrainedTokenizerBase,
    answer_format: str,
    reward: RewardFn | None,
    seconds: float,
    errors: list[RewardError] | None = None,
) -> dict[str, Any]:
    """The evaluation's metrics (see the module docstring) from one completion per problem."""
    rewards = score_completions(completions, problems, tokenizer, answer_format, reward=reward, errors=errors)[:, 0]
    return {
        "eval_reward_mean": float(rewards.mean()),
        "eval_accuracy": float((rewards >= 1.0).float().mean()),
        "eval_samples": len(problems),
        "eval_seconds": seconds,
    }


def plain_generate(policy: PreTrainedModel, max_batch_size: int = 64) -> Callable[[list[Request]], list[Completion]]:
    """`generate(requests)` on `policy` itself by plain decoding (no drafter: evaluation measures the policy,
    and speculative decoding would give the same answers): the Ray coordinator's, which holds the policy but
    no engine."""

    def generate(requests: list[Request]) -> list[Completion]:
        longest = max(len(r.prompt_ids) + r.params.max_new_tokens for r in requests)
        engine = Engine(policy, max_batch_size=max_batch_size, max_context=longest, return_hidden=False)
        with torch.inference_mode():
            return engine.generate(requests)

    return generate


def evaluate(
    generate: Any,
    problems: Sequence[Problem],
    tokenizer: PreTrainedTokenizerBase,
    spec: RunSpec,
    reward: RewardFn | None,
) -> dict[str, Any]:
    """Answer `problems` with `generate(requests) -> completions` (an engine's, in request order) and score
    them."""
    started = time.perf_counter()
    completions = generate(eval_requests(problems, tokenizer, spec.algorithm))
    return eval_metrics(
        completions, problems, tokenizer, spec.dataset.answer_format, reward, time.perf_counter() - started
    )
