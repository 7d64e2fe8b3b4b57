"""Progress of long phases (`tlt.progress`): a start line at once, then a line every few seconds with an
estimate of the time left when piped, a rich bar in a terminal."""

from __future__ import annotations

import io

from tlt.progress import eta_text, phase, progress_line


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_piped_progress_starts_at_once_then_every_few_seconds_with_an_estimate():
    out, clock = io.StringIO(), Clock()
    with phase("warm start: policy SFT", 100, stream=out, every=5.0, terminal=False, clock=clock) as update:
        assert out.getvalue() == "[warm start: policy SFT] started: 100 steps\n", "the first line comes at once"
        clock.now += 1
        update(10, "loss 2.000")
        assert out.getvalue().count("\n") == 1, "no line before `every` seconds"
        clock.now += 5
        update(30, "loss 1.500")
        clock.now += 14
        update(100, "loss 1.000")
    lines = out.getvalue().splitlines()
    assert lines[1] == "[warm start: policy SFT] 30/100 steps (30%), 5.0 steps/s, about 14 s left, loss 1.500"
    assert lines[2] == "[warm start: policy SFT] 100/100 steps (100%), 5.0 steps/s, loss 1.000"
    assert lines[3] == "[warm start: policy SFT] done: 100/100 steps in 20 s, loss 1.000"


def test_the_end_line_comes_even_when_the_phase_fails():
    out = io.StringIO()
    try:
        with phase("evaluation", 3, "parts", stream=out, terminal=False) as update:
            update(1)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert out.getvalue().splitlines()[-1].startswith("[evaluation] done: 1/3 parts")


def test_slow_steps_read_as_seconds_per_step_and_estimates_in_minutes():
    assert progress_line("x", 2, 40, 60.0, "steps") == "[x] 2/40 steps (5%), 30.0 s per step, about 19 min left"
    assert eta_text(0.5) == "under a second left" and eta_text(7200) == "about 2.0 h left"


def test_in_a_terminal_it_draws_a_bar():
    out = io.StringIO()
    with phase("training", 4, stream=out, terminal=True) as update:
        for done in range(1, 5):
            update(done, f"loss {1 / done:.2f}")
    assert "training" in out.getvalue() and "4/4" in out.getvalue()
