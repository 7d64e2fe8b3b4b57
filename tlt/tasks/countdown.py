"""The built-in reasoning task: remainders by repeated subtraction, one worked step per line.

A problem subtracts a digit `d` from a start number `n` until what is left is below `d`; the
worked answer lists every intermediate value, then states the remainder GSM8K-style:

    prompt:  "38-9="
    answer:  "29=20=11=2 #### 2"

Each step is local and easy: subtract the prompt's digit (found by content, after `-`) from
the number just written. `n` is drawn from a heavy-tailed (Pareto) law, so most answers are
a few steps and a few run to a hundred: the long tail of real reasoning rollouts, where
length, not the difficulty of a step, makes a problem hard.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tlt.tasks.problem import Problem

ANSWER_MARK = "####"


@dataclass(frozen=True)
class CountdownTask:
    """Start numbers with P(n >= x) proportional to (min_start / x) ** alpha up to `max_start`;
    the subtracted digit uniform in [min_digit, 9]."""

    min_start: int = 10
    max_start: int = 400
    alpha: float = 0.8
    min_digit: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.min_start <= self.max_start:
            raise ValueError(f"need 1 <= min_start <= max_start, got {self.min_start}, {self.max_start}")
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if not 1 <= self.min_digit <= 9:
            raise ValueError(f"min_digit must be in 1..9, got {self.min_digit}")


def draw_start(rng: random.Random, task: CountdownTask) -> int:
    """One start number: a Pareto law from `min_start`, truncated at `max_start` (no spike at the cap)."""
    tail = (task.min_start / (task.max_start + 1)) ** task.alpha
    u = tail + (1.0 - tail) * (1.0 - rng.random())  # in (tail, 1]
    return min(task.max_start, int(task.min_start * u ** (-1.0 / task.alpha)))


def solve(start: int, digit: int) -> str:
    """The worked answer: every value after a subtraction, then `#### remainder`."""
    values = list(range(start - digit, -1, -digit))
    if not values:
        return f"{ANSWER_MARK} {start}"
    return f"{'='.join(map(str, values))} {ANSWER_MARK} {values[-1]}"


def make_problem(start: int, digit: int) -> Problem:
    if start < 0 or not 1 <= digit <= 9:
        raise ValueError(f"need start >= 0 and a digit in 1..9, got start={start}, digit={digit}")
    return Problem(prompt=f"{start}-{digit}=", answer=solve(start, digit))


def generate(count: int, seed: int, task: CountdownTask = CountdownTask()) -> list[Problem]:
    """`count` problems, a pure function of (count, seed, task)."""
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        start = draw_start(rng, task)
        problems.append(make_problem(start, rng.randint(task.min_digit, 9)))
    return problems
