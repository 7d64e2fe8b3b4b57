"""Progress of a long phase (a warm start, a drafter warm start, an evaluation): its name when it starts,
then how far along it is with an estimate of the time left, so a run that takes minutes never looks hung.

In a terminal: a rich progress bar. Piped into a log (`make demo > log`, CI): one plain line on stderr when
the phase starts and then at most every `every` seconds, e.g.

    [warm start: policy SFT] 120/2000 steps (6%), 2.1 steps/s, about 15 min left, loss 1.234

and one line when it ends. Stdlib and rich only.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

Update = Callable[..., None]  # update(done, detail="")


def eta_text(seconds: float) -> str:
    """`about 15 min left` / `about 40 s left` / `under a second left`."""
    if seconds < 1:
        return "under a second left"
    if seconds < 90:
        return f"about {seconds:.0f} s left"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min left"
    return f"about {seconds / 3600:.1f} h left"


def progress_line(name: str, done: int, total: int, elapsed: float, unit: str, detail: str = "") -> str:
    """One plain progress line (see the module docstring)."""
    parts = [f"[{name}] {done}/{total} {unit}"]
    if total > 0:
        parts[0] += f" ({100 * done / total:.0f}%)"
    if done > 0 and elapsed > 0:
        rate = done / elapsed
        parts.append(f"{rate:.1f} {unit}/s" if rate >= 1 else f"{elapsed / done:.1f} s per {unit.rstrip('s')}")
        if total > done:
            parts.append(eta_text((total - done) / rate))
    if detail:
        parts.append(detail)
    return ", ".join(parts)


class _Lines:
    """The piped form: a line at the start, then at most every `every` seconds, and at the end."""

    def __init__(
        self, name: str, total: int, unit: str, stream: TextIO, every: float, clock: Callable[[], float]
    ) -> None:
        self.name, self.total, self.unit, self.stream, self.every, self.clock = name, total, unit, stream, every, clock
        self.started = self.last = clock()
        self.done, self.detail = 0, ""
        self._write(f"[{name}] started: {total} {unit}")

    def _write(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def update(self, done: int, detail: str = "") -> None:
        self.done, self.detail = done, detail
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self._write(progress_line(self.name, done, self.total, now - self.started, self.unit, detail))

    def finish(self) -> None:
        elapsed = self.clock() - self.started
        self._write(
            f"[{self.name}] done: {self.done}/{self.total} {self.unit} in {elapsed:.0f} s"
            + (f", {self.detail}" if self.detail else "")
        )


@contextlib.contextmanager
def phase(
    name: str,
    total: int,
    unit: str = "steps",
    *,
    stream: TextIO | None = None,
    every: float = 5.0,
    terminal: bool | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Update]:
    """Show the progress of phase `name` (`total` `unit`s); yields `update(done, detail="")`.
    terminal: force the bar (True) or the plain lines (False); default: whether `stream` is a terminal."""
    stream = stream or sys.stderr
    console = Console(file=stream)
    if terminal if terminal is not None else console.is_terminal:
        columns = (
            TextColumn(f"[bold]{name}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[detail]}"),
        )
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task(name, total=total, detail="")
            yield lambda done, detail="": bar.update(task, completed=done, detail=detail)
        return
    lines = _Lines(name, total, unit, stream, every, clock)
    try:
        yield lines.update
    finally:
        lines.finish()
