"""Reward verifiers on tricky answers: fractions, negatives, LaTeX, units, thousands separators."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from tlt.rl.rewards import final_answer, get_verifier, last_boxed, parse_number, score


@pytest.mark.parametrize(
    "text, value",
    [
        ("18", Fraction(18)),
        ("$1,234.50", Fraction(246900, 200)),
        ("1,000,000 people", Fraction(1_000_000)),
        ("-3/4 cup", Fraction(-3, 4)),
        ("\\frac{1}{2}", Fraction(1, 2)),
        ("\\dfrac{-7}{4}", Fraction(-7, 4)),
        ("\u22125 degrees", Fraction(-5)),
        ("0.125", Fraction(1, 8)),
        ("18 dollars", Fraction(18)),
        ("50%", Fraction(50)),
        ("from 3 to 5 km", Fraction(5)),
        ("no number here", None),
        ("1/0", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_final_answer_prefers_last_marker_then_boxed():
    assert final_answer("2+2=4 #### 4") == ("4", True)
    assert final_answer("#### 3 and later #### 5") == ("5", True)
    assert final_answer("so \\boxed{\\frac{1}{2}} done") == ("\\frac{1}{2}", True)
    assert final_answer("just 7") == ("just 7", False)
    assert last_boxed("\\boxed{a{b}c} \\boxed{x^{2}}") == "x^{2}"


@pytest.mark.parametrize(
    "response, reference, expected",
    [
        ("3+5=8 #### 8", "#### 8", 1.0),
        ("#### 8.0", "8", 1.0),
        ("#### 1,234", "#### 1234", 1.0),
        ("#### $18.00", "#### 18", 1.0),
        ("The answer is 0.5", "1/2", 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("#### -5", "#### 5", 0.0),
        ("#### 19", "#### 91", 0.0),
        ("no answer", "#### 3", 0.0),
    ],
)
def test_number_verifier(response, reference, expected):
    assert score(response, reference, "number") == expected


def test_gsm8k_verifier_needs_the_marker_in_the_response():
    reference = "Janet sells 16 - 3 - 4 = 9 duck eggs.\n#### 18"
    assert score("so she makes $18.\n#### 18", reference, "gsm8k") == 1.0
    assert score("so she makes $18.", reference, "gsm8k") == 0.0
    assert score("#### 1,8", reference, "gsm8k") == 0.0


def test_exact_verifier_compares_final_answer_strings():
    assert score("work #### yes", "#### yes", "exact") == 1.0
    assert score("#### 4.0", "#### 4", "exact") == 0.0


@pytest.mark.parametrize(
    "response, reference, expected",
    [
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("#### \\frac{1}{2}", "#### 0.5", 1.0),
        ("#### x^2+2x+1", "(x+1)^2", 1.0),
        ("The answer is $\\boxed{\\dfrac{3}{4}}$", "\\frac{6}{8}", 1.0),
        ("#### -5", "#### 5", 0.0),
        ("\\boxed{\\pi}", "3", 0.0),
    ],
)
def test_math_verifier_uses_mathematical_equivalence(response, reference, expected):
    assert score(response, reference, "math") == expected


def test_math_verifier_works_off_the_main_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(score("\\boxed{1/2}", "0.5", "math")))
    worker.start()
    worker.join()
    assert results == [1.0]


def test_unknown_format_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"one of \['exact', 'gsm8k', 'math', 'number'\]"):
        get_verifier("fuzzy")
