"""The key/value cache: one preallocated `[B, Hkv, S, D]` tensor per layer, written at explicit slots.

Row b has `lengths[b]` committed slots `[0, lengths[b])`. A forward may write past them (a draft, a
tree of drafts, padding of a short prompt): those entries are scratch, seen only where the caller's
attention mask lets them be, and overwritten later. Rows are packed at the front; finished rows
leave through `remove_rows`, which moves tail rows into their places.

One tensor per layer, not one `[L, ...]` tensor: a compiled step (`tlt/rollout/compiled.py`) takes
the layers' tensors as separate inputs and writes each in place; slicing one shared tensor per layer
would make every write a mutation of a view, which the compiler turns into a copy of the whole cache.
A static cache (`static=True`) is allocated at max_capacity up front and never reallocated, so the
compiled step's inputs keep their shapes and strides.
"""

from __future__ import annotations

import torch

from tlt.rollout.sequence import plan_removal


class KVCache:
    """k, v: lists of L tensors [B, Hkv, S, D]; B = max_batch_size, S = capacity (grows to max_capacity)."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_batch_size: int,
        capacity: int,
        max_capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        static: bool = False,
    ) -> None:
        if capacity < 1 or capacity > max_capacity:
            raise ValueError(f"capacity must be in [1, max_capacity={max_capacity}], got {capacity}")
        shape = (max_batch_size, num_kv_heads, max_capacity if static else capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_capacity = max_capacity
        self.static = static
        self.lengths: list[int] = []

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    @property
    def max_batch_size(self) -> int:
        return self.k[0].shape[0]

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    def start(self, num_rows: int) -> None:
        """Begin a new batch of num_rows empty rows (old contents become scratch)."""
        if not 0 < num_rows <= self.max_batch_size:
            raise ValueError(f"num_rows must be in [1, max_batch_size={self.max_batch_size}], got {num_rows}")
        self.lengths = [0] * num_rows

    def ensure_capacity(self, needed: int) -> None:
        """Grow S (doubling, capped at max_capacity; a static cache straight to max_capacity) so that
        slots [0, needed) exist."""
        if needed <= self.capacity:
            return
        if needed > self.max_capacity:
            raise ValueError(f"needed {needed} slots, more than max_capacity={self.max_capacity}")
        new_capacity = self.max_capacity if self.static else min(self.max_capacity, max(needed, 2 * self.capacity))
        for tensors in (self.k, self.v):
            for i, old in enumerate(tensors):
                new = old.new_zeros((*old.shape[:2], new_capacity, old.shape[3]))
                new[:, :, : old.shape[2]] = old
                tensors[i] = new

    def release(self) -> None:
        """Give back the memory (every row's contents are dropped); the next `ensure_capacity`
        allocates again (a static cache at max_capacity, with the shapes it had)."""
        for tensors in (self.k, self.v):
            for i, old in enumerate(tensors):
                tensors[i] = old.new_zeros((*old.shape[:2], 1, old.shape[3]))
        self.lengths = []

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [B, Hkv, Q, D] of the first B rows at slots [B, Q] (long)."""
        write_layer(self.k[layer], self.v[layer], slots, k, v)

    def view(self, layer: int, num_rows: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v of one layer for rows [0, num_rows) and slots [0, span): each [B, Hkv, span, D]."""
        return self.k[layer][:num_rows, :, :span], self.v[layer][:num_rows, :, :span]

    def advance(self, counts: list[int]) -> None:
        """Commit counts[b] more slots of each running row."""
        if len(counts) != self.num_rows:
            raise ValueError(f"counts has {len(counts)} entries for {self.num_rows} running rows")
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]

    def remove_rows(self, rows: list[int]) -> list[tuple[int, int]]:
        """Drop finished rows; tail rows move into their places. Returns the (src, dst) moves."""
        moves, new_num_rows = plan_removal(self.num_rows, rows)
        if moves:
            src = torch.tensor([s for s, _ in moves], device=self.k[0].device)
            dst = torch.tensor([d for _, d in moves], device=self.k[0].device)
            span = max(self.lengths[s] for s, _ in moves)
            for t in (*self.k, *self.v):
                t[dst, :, :span] = t[src, :, :span]
        for s, d in moves:
            self.lengths[d] = self.lengths[s]
        del self.lengths[new_num_rows:]
        return moves

    def reorder(self, src: list[int]) -> None:
        """Row i takes the contents and length of row src[i] (rows past len(src) are dropped)."""
        if src != list(range(len(src))):
            index = torch.tensor(src, device=self.k[0].device)
            for t in (*self.k, *self.v):
                t[: len(src)] = t[index]
        self.lengths = [self.lengths[i] for i in src]

    def compact(self, rows: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copy entries of each listed row from src_slots to dst_slots in every layer.

        rows: [N] long; src_slots, dst_slots: [N, K] long. Sources are read before any write, so
        the accepted path of a tree can be packed right after the committed prefix.
        """
        r = rows[:, None].expand_as(src_slots)
        for t in (*self.k, *self.v):
            t[r, :, dst_slots] = t[r, :, src_slots]  # [N, K, Hkv, D]


def write_layer(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """k_cache, v_cache [Bmax, Hkv, S, D]; store k, v [B, Hkv, Q, D] of rows [0, B) at slots [B, Q]."""
    rows = torch.arange(slots.shape[0], device=slots.device)[:, None].expand_as(slots)
    # cache[rows, :, slots] has shape [B, Q, Hkv, D]
    k_cache[rows, :, slots] = k.transpose(1, 2)
    v_cache[rows, :, slots] = v.transpose(1, 2)
