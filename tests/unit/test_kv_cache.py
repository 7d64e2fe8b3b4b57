"""KV cache promises: slot writes, growth keeps contents, tail rows fill holes of finished rows, compaction."""

from __future__ import annotations

import pytest
import torch

from tlt.rollout.kv_cache import KVCache
from tlt.rollout.sequence import Sequence, plan_removal
from tlt.rollout.types import Request, SamplingParams


def make_cache(rows=4, capacity=4, max_capacity=64):
    return KVCache(
        num_layers=2,
        num_kv_heads=2,
        head_dim=3,
        max_batch_size=rows,
        capacity=capacity,
        max_capacity=max_capacity,
        dtype=torch.float64,
    )


def test_write_puts_each_token_at_its_slot():
    cache = make_cache()
    cache.start(2)
    k = torch.randn(2, 2, 2, 3, dtype=torch.float64)  # [B, Hkv, Q, D]
    slots = torch.tensor([[0, 1], [3, 2]])
    cache.write(1, slots, k, -k)
    assert torch.equal(cache.k[1][1, :, 3], k[1, :, 0]) and torch.equal(cache.k[1][1, :, 2], k[1, :, 1])
    assert torch.equal(cache.v[1][0, :, 1], -k[0, :, 1])


def test_static_cache_is_allocated_at_max_capacity_and_never_reallocated():
    cache = KVCache(
        num_layers=2,
        num_kv_heads=2,
        head_dim=3,
        max_batch_size=2,
        capacity=4,
        max_capacity=16,
        dtype=torch.float32,
        static=True,
    )
    before = [t.data_ptr() for t in cache.k + cache.v]
    cache.ensure_capacity(16)
    assert cache.capacity == 16 and [t.data_ptr() for t in cache.k + cache.v] == before


def test_growth_doubles_and_keeps_contents():
    cache = make_cache(capacity=4)
    cache.k[0][0, 0, 3] = 7.0
    cache.ensure_capacity(5)
    assert cache.capacity == 8 and cache.k[0][0, 0, 3, 0] == 7.0
    with pytest.raises(ValueError, match="max_capacity"):
        cache.ensure_capacity(65)


def test_plan_removal_fills_holes_from_the_tail():
    assert plan_removal(5, [1, 4]) == ([(3, 1)], 3)
    assert plan_removal(3, [0, 1, 2]) == ([], 0)
    assert plan_removal(4, [3]) == ([], 3)
    with pytest.raises(ValueError, match="rows to remove"):
        plan_removal(2, [2])


def test_remove_rows_moves_tail_rows_and_lengths():
    cache = make_cache()
    cache.start(4)
    cache.advance([1, 2, 3, 4])
    for row in range(4):
        for layer in cache.k:
            layer[row] = row
    moves = cache.remove_rows([0, 1])
    assert moves == [(2, 0), (3, 1)]
    assert cache.lengths == [3, 4]
    assert all(torch.all(t[0, :, :3] == 2) and torch.all(t[1, :, :4] == 3) for t in cache.k)


def test_compact_moves_accepted_tree_entries_to_contiguous_slots():
    cache = make_cache(capacity=8)
    cache.start(2)
    for layer in cache.k:
        layer[:, :, :, 0] = torch.arange(8, dtype=torch.float64)
    cache.compact(torch.tensor([1]), torch.tensor([[5, 3]]), torch.tensor([[2, 3]]))
    assert cache.k[0][1, 0, :5, 0].tolist() == [0, 1, 5, 3, 4]
    assert cache.k[0][0, 0, :5, 0].tolist() == [0, 1, 2, 3, 4]
    assert cache.k[1][1, 0, :5, 0].tolist() == [0, 1, 5, 3, 4]


def test_sequence_stops_at_stop_token_or_limit():
    seq = Sequence(Request("a", [1], SamplingParams(stop_token_ids=(9,))), limit=5)
    assert seq.append([3, 9, 4]) == 2 and seq.finish_reason == "stop" and seq.tokens == [3, 9]
    seq = Sequence(Request("b", [1], SamplingParams()), limit=2)
    assert seq.append([3, 4, 5]) == 2 and seq.finish_reason == "length"
