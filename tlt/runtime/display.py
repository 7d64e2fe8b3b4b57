"""The live terminal display of a Ray run (rich): step, phase, workers' states, the last step's numbers.

It consumes the coordinator's events (`phase`, `workers`, `trainer`, `checkpoint`, `restart`) and
each finished step's metrics; it never touches the run itself.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

STATE_STYLE = {"GENERATING": "yellow", "IDLE": "dim", "TRAINING": "green"}


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


class LiveDisplay:
    """`with LiveDisplay(name, steps) as d:` then `d.event(e)` / `d.step(metrics)` from the run's callbacks."""

    def __init__(self, name: str, total_steps: int, console: Console | None = None) -> None:
        self.name = name
        self.total = total_steps
        self.console = console or Console(stderr=True)
        self.started = time.time()
        self.phase = "starting"
        self.current_step = 0
        self.workers: dict[str, dict[str, Any]] = {}
        self.last: dict[str, Any] | None = None
        self.notes: list[str] = []
        self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveDisplay:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.update(self.render())
        self._live.__exit__(*exc)
        if not self.console.is_terminal:  # piped: the last view ends without a newline, so what follows would join it
            self.console.line()

    def event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        self.current_step = min(event.get("step", self.current_step), self.total)
        if kind == "phase":
            self.phase = event["phase"]
            if not self.console.is_terminal:  # piped into a log: the live view is not redrawn, so say it
                self.console.print(
                    f"[{self.name}] step {self.current_step}/{self.total}: {self.phase} "
                    f"({time.time() - self.started:.0f} s)",
                    highlight=False,
                    markup=False,
                )
        elif kind == "workers":
            self.workers = {w["worker"]: w for w in event["workers"]}
        elif kind == "restart":
            self.notes.append(
                f"step {event['failed_step']} failed ({event['error']}); restart "
                f"{event['restarts']}/{event['limit']} from checkpoint step {event['resumed_step']}"
            )
        elif kind == "checkpoint":
            self.notes.append(f"checkpoint at step {event['saved_step']}")
        self.notes = self.notes[-4:]
        self._live.update(self.render())

    def step(self, metrics: dict[str, Any]) -> None:
        self.last = metrics
        self.phase = "done" if metrics["step"] >= self.total else "next step"
        self.console.print(step_line(metrics), highlight=False)
        self._live.update(self.render())

    def render(self) -> Group:
        head = Text.assemble(
            (f"{self.name}  ", "bold"),
            f"step {self.current_step}/{self.total}  ",
            ("phase ", "dim"),
            (self.phase, "cyan"),
            f"  {time.time() - self.started:.0f}s",
        )
        workers = Table(box=None, pad_edge=False)
        for column in ("worker", "state", "for", "running", "trainer iters"):
            workers.add_column(column)
        now = time.time()
        for name, w in sorted(self.workers.items()):
            workers.add_row(
                name,
                Text(w["state"], style=STATE_STYLE.get(w["state"], "")),
                f"{now - w['since']:.1f}s",
                str(w["running"]),
                str(w["trainer_iterations"]),
            )
        parts: list[Any] = [head, workers]
        if self.last is not None:
            m = self.last
            parts.append(
                Text(
                    f"last step: reward {_fmt(m.get('reward_mean'))}  accept/agree "
                    f"{_fmt(m.get('accept_length') or m.get('drafter_agreement'))}  rollout "
                    f"{_fmt(m.get('rollout_seconds'), '.1f')}s (tail {_fmt(m.get('tail_seconds'), '.1f')}s)  "
                    f"update {_fmt(m.get('update_seconds'), '.1f')}s  harvested "
                    f"{_fmt(m.get('harvested_seconds'), '.1f')}s"
                )
            )
        parts.extend(Text(n, style="dim") for n in self.notes)
        return Group(*parts)


def step_line(m: dict[str, Any]) -> str:
    """One line per finished step for the scroll-back."""
    agree = m.get("drafter_agreement")
    return (
        f"step {m['step']:>4}  reward {m['reward_mean']:.3f}  len {m['response_length_mean']:.0f} "
        f"(p90 {m['response_length_p90']})  rollout {m['rollout_seconds']:.1f}s tail {m['tail_seconds']:.1f}s "
        f"update {m['update_seconds']:.1f}s"
        + (f"  drafter agree {agree:.2f} v{m.get('drafter_version')}" if agree is not None else "")
        + (f"  harvested {m['harvested_seconds']:.1f}s" if m.get("harvested_seconds") else "")
    )
