"""RunningBatch's uniforms: one read per step shared by the drafter's guesses and the verification."""

from __future__ import annotations

import pytest
import torch

from tlt.rollout.batch import RunningBatch, _scatter
from tlt.rollout.kv_cache import KVCache
from tlt.rollout.sequence import Sequence
from tlt.rollout.types import Request, SamplingParams


def _batch(temperatures: list[float], limit: int = 12) -> RunningBatch:
    seqs = [
        Sequence(
            Request(f"r{i}", [1, 2, 3], SamplingParams(temperature=t, max_new_tokens=limit, seed=10 + i)), limit=limit
        )
        for i, t in enumerate(temperatures)
    ]
    cache = KVCache(
        num_layers=1,
        num_kv_heads=1,
        head_dim=2,
        max_batch_size=len(seqs),
        capacity=32,
        max_capacity=32,
        dtype=torch.float32,
    )
    cache.start(len(seqs))
    cache.advance([3] * len(seqs))  # the prompts' slots
    return RunningBatch(
        seqs, cache, hidden_size=4, return_hidden=False, dtype=torch.float32, device=torch.device("cpu")
    )


def _commit(batch: RunningBatch, counts: list[int]) -> None:
    new = [[5] * c for c in counts]
    batch.commit(new, torch.full((len(counts),), 5), torch.zeros(len(counts), max(counts)), None)


def test_window_is_each_rows_next_uniforms_and_follows_commits():
    batch = _batch([1.0, 0.7, 0.0])
    assert torch.equal(batch.uniform_window(3), batch.uniform_buf[:, :3])
    _commit(batch, [2, 1, 3])
    window = batch.uniform_window(4)
    for b, start in enumerate([2, 1, 3]):
        assert torch.equal(window[b], batch.uniform_buf[b, start : start + 4])
    # a wider read after a narrower one in the same step, and any offsets, read the same positions
    assert torch.equal(batch.uniform_window(2), window[:, :2])
    assert torch.equal(batch.uniform_window(11)[:, :4], window)
    offsets = torch.tensor([[0, 2], [1, 1], [3, 0]])
    assert torch.equal(batch.uniforms_at(offsets), window.gather(1, offsets))


def test_window_past_the_limit_reads_the_rows_last_uniform_and_follows_dropped_rows():
    batch = _batch([1.0, 1.0], limit=4)
    _commit(batch, [3, 1])
    window = batch.uniform_window(3)
    assert torch.equal(window[0], batch.uniform_buf[0, [3, 3, 3]])
    batch.sequences[0].finish_reason = "length"
    batch.drop_finished()  # row 1 moves to row 0
    assert torch.equal(batch.uniform_window(2), batch.uniform_buf[1, 1:3][None])


def test_a_greedy_batch_has_no_uniforms():
    batch = _batch([0.0, 0.0])
    with pytest.raises(ValueError, match="greedy"):
        batch.uniform_window(1)


def _reference(
    buf: torch.Tensor, rows: list[int], start: list[int], values: torch.Tensor, counts: list[int], scratch: bool
) -> torch.Tensor:
    """A loop: row b's first counts[b] values (all K where every column fits: scratch past the count)."""
    out = buf.clone()
    for b, row in enumerate(rows):
        for j in range(values.shape[1]):
            if (j < counts[b] or scratch) and start[b] + j < buf.shape[1]:
                out[row, start[b] + j] = values[b, j]
    return out


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("tail", [False, True], ids=["inside", "past-the-end"])
@pytest.mark.parametrize("width", [0, 5], ids=["logprobs", "hidden"])
def test_scatter_writes_what_a_loop_writes(k, tail, width):
    gen = torch.Generator().manual_seed(k * 10 + tail)
    shape = (6, 12) + ((width,) if width else ())
    buf = torch.randn(*shape, generator=gen)
    rows, start = [4, 1, 3], [0, 7, 12 - k + (1 if tail else 0)]
    counts = [k, max(k - 1, 1), 1]
    values = torch.randn(3, k, *shape[2:], generator=gen, dtype=torch.float64)  # cast to the buffer's dtype
    out = buf.clone()
    _scatter(out, torch.tensor(rows), start, values, counts)
    fits = max(start) + k <= buf.shape[1]
    assert fits == (not tail)
    assert torch.equal(out, _reference(buf, rows, start, values.to(buf.dtype), counts, scratch=fits))
