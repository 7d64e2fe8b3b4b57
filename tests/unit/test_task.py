"""The built-in countdown task: correct worked answers, deterministic, long-tailed lengths."""

from __future__ import annotations

import random
import statistics

import pytest

from tlt.rl.rewards import number_match
from tlt.tasks.countdown import CountdownTask, draw_start, generate, make_problem, solve


def test_worked_answer_lists_every_subtraction_then_the_remainder():
    assert solve(38, 9) == "29=20=11=2 #### 2"
    assert solve(14, 7) == "7=0 #### 0"
    assert solve(5, 9) == "#### 5"
    assert make_problem(38, 9).prompt == "38-9="


def test_every_answer_is_the_remainder_and_each_step_subtracts_the_digit():
    for problem in generate(300, seed=5):
        start, digit = (int(x) for x in problem.prompt.rstrip("=").split("-"))
        assert number_match(problem.answer, str(start % digit)) == 1.0
        steps = problem.answer.split(" #### ")[0].split("=")
        values = [start] + [int(v) for v in steps if v]
        assert all(a - b == digit for a, b in zip(values, values[1:]))
        assert 0 <= values[-1] < digit


def test_generation_is_a_pure_function_of_the_seed():
    assert generate(200, seed=3) == generate(200, seed=3)
    assert generate(200, seed=3) != generate(200, seed=4)


def test_start_numbers_stay_in_bounds():
    task = CountdownTask(min_start=10, max_start=50, alpha=0.3)
    rng = random.Random(0)
    starts = [draw_start(rng, task) for _ in range(5000)]
    assert min(starts) == 10 and max(starts) == 50


def test_response_lengths_have_a_long_tail():
    lengths = sorted(len(p.answer) + 1 for p in generate(4000, seed=0))  # + eos
    median = statistics.median(lengths)
    p90 = lengths[int(0.9 * len(lengths))]
    assert p90 / median >= 3, "p90 is several times the median"
    assert lengths[-1] / median >= 10, "the longest answers are at least 10x the median"
    top = lengths[int(0.9 * len(lengths)) :]
    assert sum(top) / sum(lengths) >= 0.35, "the top 10% of responses hold a large share of tokens"


@pytest.mark.parametrize(
    "bad", [dict(min_start=0), dict(min_start=50, max_start=40), dict(alpha=0.0), dict(min_digit=10)]
)
def test_bad_task_settings_are_refused(bad):
    with pytest.raises(ValueError):
        CountdownTask(**bad)


def test_problems_need_a_single_digit():
    with pytest.raises(ValueError, match="digit in 1..9"):
        make_problem(30, 12)
