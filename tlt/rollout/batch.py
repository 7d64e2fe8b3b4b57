"""The running batch: its sequences (plain Python) and the per-row tensors the steppers use.

Rows are packed at the front of the KV cache. Outputs (log-probs, hidden states) go to buffers
indexed by the row's place in its wave (`wave_rows`), which never moves, so a finished row leaving
the batch costs only the moves of the cache rows and a few small per-row tensors.
"""

from __future__ import annotations

import torch

from tlt.rollout.kv_cache import KVCache
from tlt.rollout.sequence import Sequence
from tlt.rollout.types import Completion


def _move(t: torch.Tensor, moves: list[tuple[int, int]], num_rows: int) -> torch.Tensor:
    """Apply (src, dst) row moves to t [B, ...] and keep rows [0, num_rows)."""
    if moves:
        src = torch.tensor([s for s, _ in moves], device=t.device)
        dst = torch.tensor([d for _, d in moves], device=t.device)
        t[dst] = t[src]
    return t[:num_rows]


_WINDOW = 8  # uniform_window reads at least this many positions (as cheap as fewer; covers most drafts)


class RunningBatch:
    """Sequences in flight and their sampling state; buffers hold what each row produced.

    last_token [B] long: each running row's newest token, sampled but not yet fed.
    temperature [B] float64; top_p [B] float64, or None when every row has 1.0. uniform_buf [W, T_max]
    float64 (None when every row is greedy): row w's uniforms, drawn once from its own seeded generator,
    one per generated position: the token at generated position t is drawn with uniform_buf[w, t]
    whatever step produces it (a plain step, or the verification of a draft), so speculative decoding
    reproduces plain sampling token for token (`uniforms_at`). feature_buf [W, P_max + T_max, F] (or None):
    the target's features per position, F = `feature_size` (H, or the wide features of an engine that keeps
    chosen layers, `tlt.models.feature_layers`); hidden_buf: its first H, the final-norm states (the same
    tensor when F = H). logprob_buf [W, T_max]. All indexed by wave row.
    """

    def __init__(
        self,
        sequences: list[Sequence],
        cache: KVCache,
        *,
        hidden_size: int,
        return_hidden: bool,
        dtype: torch.dtype,
        device: torch.device,
        feature_size: int | None = None,
    ) -> None:
        self.sequences = list(sequences)
        self.all_sequences = list(sequences)
        self.cache = cache
        self.device = device
        self.wave_rows = torch.arange(len(sequences), device=device)
        params = [s.request.params for s in sequences]
        self.temperature = torch.tensor([p.temperature for p in params], dtype=torch.float64, device=device)
        self.top_p = (
            None
            if all(p.top_p == 1.0 for p in params)
            else torch.tensor([p.top_p for p in params], dtype=torch.float64, device=device)
        )
        self.last_token = torch.zeros(len(sequences), dtype=torch.long, device=device)
        width = max(s.limit for s in sequences)
        self.uniform_buf = (
            None
            if all(p.greedy for p in params)
            else torch.stack(
                [
                    torch.rand(width, generator=_generator(p.seed, device), dtype=torch.float64, device=device)
                    for p in params
                ]
            )
        )
        self.logprob_buf = torch.zeros(len(sequences), width, dtype=torch.float32, device=device)
        positions = max(s.prompt_len for s in sequences) + width
        width = hidden_size if feature_size is None else feature_size
        self.feature_buf = (
            torch.zeros(len(sequences), positions, width, dtype=dtype, device=device) if return_hidden else None
        )
        self.hidden_buf = (
            self.feature_buf
            if self.feature_buf is None or width == hidden_size
            else self.feature_buf[..., :hidden_size]
        )
        self._window: torch.Tensor | None = None  # uniform_window's read of this step

    @property
    def num_rows(self) -> int:
        return len(self.sequences)

    @property
    def sampled(self) -> bool:
        """Whether some row samples (else every row is greedy and no uniform is ever read)."""
        return self.uniform_buf is not None

    def uniforms_at(self, offsets: torch.Tensor) -> torch.Tensor:
        """[B, N] uniforms of the tokens at generated positions len(tokens) + offsets[b, n] of each running
        row (offsets [B, N] >= 0; positions past the row's limit, whose tokens are never kept, read its last)."""
        if self.uniform_buf is None:
            raise ValueError("every row of this batch is greedy: it draws no uniforms")
        return self.uniform_window(int(offsets.max()) + 1).gather(1, offsets)

    def uniform_window(self, n: int) -> torch.Tensor:
        """[B, n] uniforms of each running row's next n generated positions (offsets 0 .. n - 1, past the
        limit: the row's last). Read once per step and kept until the batch changes (commit, drop), so the
        drafter's guesses and the target's verification share one read."""
        if self.uniform_buf is None:
            raise ValueError("every row of this batch is greedy: it draws no uniforms")
        if self._window is None or self._window.shape[1] < n:
            width = max(n, _WINDOW)
            generated = torch.tensor([len(s.tokens) for s in self.sequences], device=self.device)
            cols = (generated[:, None] + torch.arange(width, device=self.device)[None, :]).clamp(
                max=self.uniform_buf.shape[1] - 1
            )
            self._window = self.uniform_buf[self.wave_rows[:, None], cols]
        return self._window[:, :n]

    def lengths(self) -> torch.Tensor:
        """[B] long: committed cache slots (= tokens fed) per running row."""
        return torch.tensor(self.cache.lengths, device=self.device)

    def commit(
        self,
        new_tokens: list[list[int]],
        last_token: torch.Tensor,
        logprobs: torch.Tensor,
        hidden: torch.Tensor | None,
        fed: list[int] | None = None,
    ) -> int:
        """Record one step: row b gained new_tokens[b] and committed fed[b] fed tokens' cache slots.

        last_token [B]: the last of each row's new tokens; logprobs [B, K]: of the new tokens;
        hidden [B, Kf, F]: features of the fed tokens (`feature_buf`'s width), whose k/v the caller has put right
        after the committed slots. fed defaults to len(new_tokens[b]) (a decode step feeds as many
        tokens as it keeps). Returns how many new tokens the sequences kept (stop tokens and limits
        cut the rest; their buffer entries are then ignored).
        """
        counts = [len(t) for t in new_tokens]
        fed = counts if fed is None else fed
        _scatter(self.logprob_buf, self.wave_rows, [len(s.tokens) for s in self.sequences], logprobs, counts)
        if self.feature_buf is not None and hidden is not None:
            _scatter(self.feature_buf, self.wave_rows, list(self.cache.lengths), hidden, fed)
        self.cache.advance(fed)
        self.last_token = last_token
        self._window = None
        return sum(seq.append(toks) for seq, toks in zip(self.sequences, new_tokens))

    def drop_finished(self) -> int:
        """Remove finished rows from the batch (tail rows move into their places); return how many."""
        finished = [i for i, s in enumerate(self.sequences) if s.finished]
        if not finished:
            return 0
        self._window = None
        moves = self.cache.remove_rows(finished)
        n = self.cache.num_rows
        for src, dst in moves:
            self.sequences[dst] = self.sequences[src]
        del self.sequences[n:]
        self.wave_rows = _move(self.wave_rows, moves, n)
        self.last_token = _move(self.last_token, moves, n)
        self.temperature = _move(self.temperature, moves, n)
        if self.top_p is not None:
            self.top_p = _move(self.top_p, moves, n)
        return len(finished)

    def completions(self) -> list[Completion]:
        """One Completion per sequence of the wave, in wave order (all must be finished)."""
        out = []
        for w, seq in enumerate(self.all_sequences):
            if not seq.finished:
                raise RuntimeError(f"request {seq.request.request_id!r} is still running")
            t = len(seq.tokens)
            hidden = None if self.feature_buf is None else self.feature_buf[w, : seq.prompt_len + t - 1].clone()
            out.append(
                Completion(
                    request_id=seq.request.request_id,
                    prompt_ids=list(seq.request.prompt_ids),
                    token_ids=list(seq.tokens),
                    logprobs=self.logprob_buf[w, :t].clone(),
                    hidden=hidden,
                    finish_reason=seq.finish_reason,
                )
            )
        return out


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, ())) if seed is None else seed)
    return g


def _scatter(buf: torch.Tensor, rows: torch.Tensor, start: list[int], values: torch.Tensor, counts: list[int]) -> None:
    """buf[rows[b], start[b] + j] = values[b, j] for j < counts[b] (and inside buf). values [B, K, ...].

    Where every column fits in buf, all K are written: entries past a row's count are scratch, past what
    the row has committed, and the row's next commit (which starts at its count) overwrites them before
    anything reads them (completions and the drafter read committed entries only).
    """
    b, k = values.shape[:2]
    first = torch.tensor(start, device=buf.device)  # [B]
    if max(start) + k <= buf.shape[1]:  # the common case, a few microseconds a step: index with broadcasting
        if k == 1:
            buf[rows, first] = values[:, 0].to(buf.dtype)
        else:
            buf[rows[:, None], first[:, None] + torch.arange(k, device=buf.device)[None, :]] = values.to(buf.dtype)
        return
    cols = first[:, None] + torch.arange(k, device=buf.device)[None, :]  # [B, K]
    keep = (torch.arange(k, device=buf.device)[None, :] < torch.tensor(counts, device=buf.device)[:, None]) & (
        cols < buf.shape[1]
    )
    buf[rows[:, None].expand(b, k)[keep], cols[keep]] = values[keep].to(buf.dtype)
