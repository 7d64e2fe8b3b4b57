"""Per-request bookkeeping in plain Python (no torch): tokens so far, the stop rule, row moves.

The running batch keeps its rows packed at the front; when some finish, the last running rows move
into their places (fewest copies), and every per-row structure applies the same moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tlt.rollout.types import FinishReason, Request


@dataclass
class Sequence:
    """One request in flight: the generated tokens and, once done, why it finished.

    limit: most tokens to generate, max_new_tokens or less where the context has less room.
    """

    request: Request
    limit: int
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, new_tokens: list[int]) -> int:
        """Append tokens until a stop token or max_new_tokens; return how many were kept."""
        stop_ids = self.request.params.stop_token_ids
        kept = 0
        for token in new_tokens:
            if self.finished:
                break
            self.tokens.append(token)
            kept += 1
            if token in stop_ids:
                self.finish_reason = "stop"
            elif len(self.tokens) >= self.limit:
                self.finish_reason = "length"
        return kept


def plan_removal(num_rows: int, remove: list[int]) -> tuple[list[tuple[int, int]], int]:
    """Moves that pack the surviving rows of a batch of num_rows into rows [0, new_num_rows).

    Each hole left by a removed row below new_num_rows is filled by a surviving row from the tail.
    Returns (moves as (src, dst) pairs with src >= new_num_rows > dst, new_num_rows).
    """
    gone = set(remove)
    if any(not 0 <= r < num_rows for r in gone):
        raise ValueError(f"rows to remove must be in [0, {num_rows}), got {sorted(gone)}")
    new_num_rows = num_rows - len(gone)
    holes = [r for r in range(new_num_rows) if r in gone]
    movers = [r for r in range(new_num_rows, num_rows) if r not in gone]
    return list(zip(movers, holes)), new_num_rows
