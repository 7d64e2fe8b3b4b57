"""Compiled steps mark each KV-cache tensor dynamic once, not on every call."""

from __future__ import annotations

from unittest import mock

import torch

from tlt.rollout import compiled


def test_each_cache_tensor_is_marked_once_and_a_new_cache_again():
    ks = [torch.zeros(4, 2, 16, 8) for _ in range(3)]
    vs = [torch.zeros(4, 2, 16, 8) for _ in range(3)]
    with mock.patch.object(torch._dynamo, "maybe_mark_dynamic") as mark:
        compiled._mark_cache_dynamic(ks, vs)
        assert mark.call_count == 2 * 6  # rows and capacity of every tensor
        compiled._mark_cache_dynamic(ks, vs)
        assert mark.call_count == 12, "a marked cache is not marked again"
        fresh = [torch.zeros(1, 2, 16, 8)]
        compiled._mark_cache_dynamic(fresh, fresh)
        assert mark.call_count == 13  # a size of 1 stays specialised: only its capacity
    del ks, vs
    assert all(ref() is not None for ref in compiled._MARKED.values()), "dead caches leave the registry"
