"""Reward verifiers: does a response's final answer match the reference?

Four formats (`DatasetSpec.answer_format`):
- `exact`:  the final answers are equal strings (surrounding whitespace ignored);
- `number`: the final answers are equal numbers: ints, decimals, fractions (`3/4`,
  `\\frac{3}{4}`), negatives, thousands separators, currency and units stripped; a response
  with no `####` / `\\boxed{}` marker is read by its last number;
- `gsm8k`:  like `number`, but the response must state its answer after `####`;
- `math`:   mathematical equivalence by `math-verify` (LaTeX, expressions, sets).

The final answer of a text is what follows its last `####`, else the content of its last
`\\boxed{...}`, else the whole text. Every verifier is a pure module-level function
`(response, reference) -> float` in {0.0, 1.0}, so verifiers can run in any process.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from fractions import Fraction

from math_verify import parse, verify

ANSWER_MARK = "####"
Verifier = Callable[[str, str], float]

_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:\s*/\s*-?(?:\d+(?:\.\d*)?|\.\d+))?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0:
        return None
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1 : i]
    return None


def final_answer(text: str) -> tuple[str, bool]:
    """(the final answer of `text`, whether a `####` or `\\boxed{}` marker delimited it)."""
    if ANSWER_MARK in text:
        return text.rsplit(ANSWER_MARK, 1)[1].strip(), True
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip(), True
    return text.strip(), False


def _normalise_number_text(text: str) -> str:
    text = text.replace("\u2212", "-").replace("\\!", "").replace("{,}", ",")
    text = _LATEX_FRAC.sub(r"(\1)/(\2)", text).replace("(", "").replace(")", "")
    text = _THOUSANDS.sub("", text)
    return re.sub(r"(?<=\d)\s+(?=\d{3}(?!\d))", "", text)  # "1 234" thin-space grouping


def _to_fraction(token: str) -> Fraction | None:
    num, _, den = (part.strip() for part in token.partition("/"))
    try:
        value = Fraction(num)
        if den:
            divisor = Fraction(den)
            if divisor == 0:
                return None
            value /= divisor
    except ValueError:
        return None
    return value


def parse_number(text: str, *, last: bool = True) -> Fraction | None:
    """The last (or first) number in `text` as an exact fraction; None when there is none.

    "$1,234.50" -> 2469/2, "-3/4 cup" -> -3/4, "\\frac{1}{2}" -> 1/2, "18 dollars" -> 18.
    """
    tokens = _NUMBER.findall(_normalise_number_text(text))
    if not tokens:
        return None
    return _to_fraction(tokens[-1] if last else tokens[0])


def exact_match(response: str, reference: str) -> float:
    return float(final_answer(response)[0] == final_answer(reference)[0])


def number_match(response: str, reference: str) -> float:
    got = parse_number(final_answer(response)[0])
    want = parse_number(final_answer(reference)[0])
    return float(got is not None and got == want)


def gsm8k_match(response: str, reference: str) -> float:
    if ANSWER_MARK not in response:
        return 0.0
    return number_match(response, reference)


def _math_parse(text: str, timeout: int | None) -> list:
    parsed = parse(text, parsing_timeout=timeout)
    if not parsed and "$" not in text:
        parsed = parse(f"${text}$", parsing_timeout=timeout)
    return parsed


def math_match(response: str, reference: str) -> float:
    # math-verify's timeouts use SIGALRM, which exists only on the main thread
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    got_text, got_marked = final_answer(response)
    want_text, want_marked = final_answer(reference)
    got = _math_parse(f"\\boxed{{{got_text}}}" if got_marked else got_text, timeout)
    want = _math_parse(f"\\boxed{{{want_text}}}" if want_marked else want_text, timeout)
    if not got or not want:
        return 0.0
    return float(verify(want, got, timeout_seconds=timeout))


VERIFIERS: dict[str, Verifier] = {
    "exact": exact_match,
    "number": number_match,
    "gsm8k": gsm8k_match,
    "math": math_match,
}


def get_verifier(answer_format: str) -> Verifier:
    """The verifier for `answer_format` (one of `exact`, `number`, `gsm8k`, `math`)."""
    try:
        return VERIFIERS[answer_format]
    except KeyError:
        raise ValueError(f"answer_format must be one of {sorted(VERIFIERS)}, got {answer_format!r}") from None


def score(response: str, reference: str, answer_format: str = "number") -> float:
    """1.0 when `response`'s final answer matches `reference`'s under `answer_format`, else 0.0."""
    return get_verifier(answer_format)(response, reference)
