"""Drafters for the speculative stepper: n-gram chains and EAGLE chains (EAGLE trees: `tlt.rollout.eagle_tree`).

A drafter proposes, for every running row, a tree rooted at the row's newest (unfed) token. Chains
are trees with one child per node. Drafts are guesses (n-gram continuations, the EAGLE drafter's
argmax or, in a sampling batch, its draw with the uniform the target will use, its top-k tree
children): the engine verifies them by exact match against the target's own token at each node
(argmax, or its coupled sample; `tlt.rollout.verify`), so no guess can change what is emitted.

The EAGLE drafter keeps its own one-layer KV cache, driven by the engine's `run_layers`. Its entry
at position t is computed from (x[t+1], f[t]): the token and the target's final-norm state that
produced it. Before drafting it catches up on every position the target committed since the last
step, reading f from the batch's hidden-state buffer: switching speculative decoding on never
re-runs the target over the prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from tlt.models.drafter import EagleDrafter
from tlt.rollout.batch import RunningBatch
from tlt.rollout.compiled import CompiledStep
from tlt.rollout.guess import GUESSES, coupled_guess, guess_inputs
from tlt.rollout.kv_cache import KVCache
from tlt.rollout.ngram import ngram_draft_batch
from tlt.rollout.runner import run_layers
from tlt.rollout.tree import DraftTree, chain_tree


@dataclass(frozen=True)
class Draft:
    """A proposal for every running row.

    tree: node 0 of row b is the row's newest token; chain: the tree is a chain (node i at depth i).
    """

    tree: DraftTree
    chain: bool


class Drafter(Protocol):
    def propose(self, batch: RunningBatch) -> Draft:
        """Draft for every running row of `batch` (rows in batch order)."""
        ...


def context_tokens(batch: RunningBatch) -> tuple[Tensor, Tensor]:
    """(tokens [B, Lmax] prompt + generated so far, right-padded with 0; lengths [B])."""
    rows = [s.request.prompt_ids + s.tokens for s in batch.sequences]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=batch.device)
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long, device=batch.device)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long, device=batch.device)
    return tokens, lengths


def tokens_after(batch: RunningBatch, positions: list[list[int]], device: torch.device) -> Tensor:
    """[B, Q] token ids at positions p + 1 of each row's prompt + generated tokens, for p in `positions`
    (per row, all in range); reads only those positions, not the whole context."""
    out = []
    for seq, row in zip(batch.sequences, positions):
        prompt, generated = seq.request.prompt_ids, seq.tokens
        n = len(prompt)
        out.append([prompt[p + 1] if p + 1 < n else generated[p + 1 - n] for p in row])
    return torch.tensor(out, dtype=torch.long, device=device)


class NgramDrafter:
    """Model-free chains: the continuation of the most recent earlier match of the context's tail."""

    def __init__(self, k: int, ngram_min: int, ngram_max: int) -> None:
        if k < 1:
            raise ValueError(f"k (draft length) must be >= 1, got {k}")
        self.k, self.ngram_min, self.ngram_max = k, ngram_min, ngram_max

    def propose(self, batch: RunningBatch) -> Draft:
        tokens, lengths = context_tokens(batch)
        draft, n_draft = ngram_draft_batch(tokens, lengths, self.k, self.ngram_min, self.ngram_max)
        return Draft(chain_tree(batch.last_token, draft, n_draft), chain=True)


class EagleStep(torch.nn.Module):
    """What one drafter pass reads: the drafter, the policy's (frozen, shared) embedding, the rotary table."""

    def __init__(self, drafter: EagleDrafter, embed: torch.nn.Embedding) -> None:
        super().__init__()
        self.drafter = drafter
        self.embed = embed
        self.rotary = LlamaRotaryEmbedding(drafter.config).to(drafter.fc.weight.device)

    @property
    def graph_key(self) -> int:
        """Tells compiled drafter graphs apart (`tlt.rollout.compiled.shape_class`): the draft vocabulary's
        size, 0 for the whole vocabulary."""
        vocab = self.drafter.draft_vocab
        return 0 if vocab is None else vocab.size


def eagle_forward(
    step: EagleStep,
    tokens: Tensor,
    positions: Tensor,
    slots: Tensor,
    mask: Tensor,
    ks: list[Tensor],
    vs: list[Tensor],
    features: Tensor,
) -> Tensor:
    """One drafter pass: tokens [B, Q] (x[t+1]), features [B, Q, H] (f[t]) -> predicted f[t+1] [B, Q, H].
    Writes the layer's k/v at slots [B, Q] of ks/vs; mask [B, Q, S]. Same argument order as
    `decoder_forward`, so `CompiledStep` compiles either."""
    dtype = step.drafter.fc.weight.dtype
    x = step.drafter.fc(torch.cat([F.embedding(tokens, step.embed.weight).to(dtype), features.to(dtype)], dim=-1))
    return run_layers(step.drafter.layers, x, step.rotary(x, positions), ks, vs, slots, mask)


class EagleCache:
    """The EAGLE drafter's one-layer KV cache, kept row-aligned with the running batch.

    It holds max_context committed slots plus `scratch` slots past them for the drafts of one step
    (a chain of k drafts writes k - 1 entries past the committed ones, a tree topk * (depth - 1)), so
    drafting never runs out of room near the context limit; the target's room is checked by the stepper.
    """

    def __init__(
        self,
        drafter: EagleDrafter,
        embed: torch.nn.Embedding,
        max_batch_size: int,
        max_context: int,
        compile: bool = False,
        scratch: int = 0,
    ) -> None:
        if scratch < 0:
            raise ValueError(f"scratch must be >= 0 draft slots, got {scratch}")
        config = drafter.config
        weight = drafter.fc.weight
        self.drafter, self.embed, self.scratch = drafter, embed, scratch
        self.step = EagleStep(drafter, embed)
        self.compiled = CompiledStep(eagle_forward, name="drafter") if compile else None
        self.cache = KVCache(
            num_layers=1,
            num_kv_heads=config.num_key_value_heads,
            head_dim=drafter.layers[0].self_attn.head_dim,
            max_batch_size=max_batch_size,
            capacity=min(256, max_context + scratch),
            max_capacity=max_context + scratch,
            dtype=weight.dtype,
            device=weight.device,
            static=compile,
        )
        self._chains: dict[int, Callable[..., Tensor]] = {}  # k -> the compiled fused catch-up + chain step
        self._wave: list | None = None
        self._rows: list = []

    @property
    def compiles(self) -> int:
        """Graphs compiled by this cache's calls (its step and its fused chains); 0 when eager."""
        steps = ([self.compiled] if self.compiled is not None else []) + list(self._chains.values())
        return sum(getattr(step, "compiles", 0) for step in steps)

    def sync(self, batch: RunningBatch) -> None:
        """Follow the batch: a new wave starts empty; rows that left are dropped, moved rows follow."""
        if self._wave is not batch.all_sequences:
            self._wave = batch.all_sequences
            self._rows = list(batch.sequences)
            self.cache.start(len(self._rows))
            return
        where = {id(s): i for i, s in enumerate(self._rows)}
        self.cache.reorder([where[id(s)] for s in batch.sequences])
        self._rows = list(batch.sequences)

    def forward(self, tokens: Tensor, features: Tensor, positions: Tensor, slots: Tensor, mask: Tensor) -> Tensor:
        """One drafter pass: tokens [B, Q] (x[t+1]), features [B, Q, H] (f[t]), positions, slots [B, Q],
        mask [B, Q, S]. Writes k/v at slots; returns predicted features f[t+1] [B, Q, H]."""
        self.cache.ensure_capacity(max(mask.shape[-1], int(slots.max()) + 1))
        step = eagle_forward if self.compiled is None else self.compiled
        return step(self.step, tokens, positions, slots, mask, self.cache.k, self.cache.v, features)

    def _catch_up_inputs(self, batch: RunningBatch, extra_span: int = 0) -> tuple[Tensor, ...]:
        """The catch-up pass's inputs: every committed position the drafter has not seen, per row.

        Returns tokens [B, Q] (x[t+1]), features [B, Q, H] (f[t]), positions t [B, Q], slots [B, Q], mask
        [B, Q, max(L) + extra_span], and as Python lists todo (real entries per row, >= 1) and L (committed
        target slots). Padding entries repeat the row's last real (token, feature, position, slot), so they
        compute the same k/v as it: they rewrite its slot, never one past the row's committed region.
        A compiled cache pads Q to >= 2: one graph for every catch-up width.
        """
        if batch.hidden_buf is None:
            raise ValueError(
                "EAGLE drafting reads the target's hidden states: build the Engine with return_hidden=True"
            )
        self.sync(batch)
        device = batch.device
        # Per row, on Python ints (a few rows: cheaper than a dozen tiny tensor ops a step).
        length = list(batch.cache.lengths)  # committed target slots L
        # Re-feed at least the newest position: its output is the f-hat the first draft comes from.
        seen = [min(s, n - 1) for s, n in zip(self.cache.lengths, length)]
        todo = [n - s for s, n in zip(seen, length)]  # >= 1
        q = max(max(todo), 2 if self.compiled is not None else 1)
        # positions t (padding repeats the row's last) and their cache slots (padding rewrites the last's)
        t_rows = [[min(s + o, n - 1) for o in range(q)] for s, n in zip(seen, length)]
        slot_rows = [[s + min(o, d - 1) for o in range(q)] for s, d in zip(seen, todo)]
        # entry o of row b sees slots [0, seen[b] + o] (as `tlt.rollout.runner.causal_mask` builds it)
        last_rows = [[s + o for o in range(q)] for s in seen]
        ints = torch.tensor(t_rows + slot_rows + last_rows, dtype=torch.long, device=device)  # [3B, Q]: one copy
        rows = len(seen)
        t, slots, last = ints[:rows], ints[rows : 2 * rows], ints[2 * rows :]  # [B, Q] each
        tokens = tokens_after(batch, t_rows, device)  # x[t+1]
        features = batch.hidden_buf[batch.wave_rows[:, None], t]  # f[t]: [B, Q, H]
        mask = torch.arange(max(length) + extra_span, device=device)[None, None, :] <= last[:, :, None]
        return tokens, features, t, slots, mask, todo, length

    @torch.no_grad()
    def catch_up(self, batch: RunningBatch) -> Tensor:
        """Feed the drafter every committed position it has not seen; return f-hat at each row's next
        position [B, H] (the prediction of the newest token's target state)."""
        tokens, features, t, slots, mask, todo, target_len = self._catch_up_inputs(batch)
        out = self.forward(tokens, features, t, slots, mask)  # [B, Q, H]
        self.cache.lengths = target_len
        return out[torch.arange(out.shape[0], device=out.device), torch.tensor(todo, device=out.device) - 1]

    @torch.no_grad()
    def chain(self, batch: RunningBatch, k: int, guess: str = "coupled") -> Tensor:
        """Catch up and draft a chain of k tokens per row in ONE drafter call (one compiled graph per k:
        the catch-up pass, the head's guesses and the k - 1 chain passes). Returns drafts [B, k].
        The chain's k/v go to the scratch slots L .. L + k - 2 past each row's committed ones.
        guess: "coupled" drafts, in a sampling batch, the drafter's own draw with the uniform the target
        will use at that position (`coupled_guess`); "argmax" (and every greedy batch) its argmax."""
        tokens, features, t, slots, mask, _, target_len = self._catch_up_inputs(batch, extra_span=k - 1)
        self.cache.ensure_capacity(mask.shape[-1])  # >= max(L) > every slot
        extra = guess_inputs(batch, k) if guess == "coupled" and batch.sampled else ()  # else: argmax drafts
        drafts = self._chain_step(k)(self.step, tokens, t, slots, mask, self.cache.k, self.cache.v, features, *extra)
        self.cache.lengths = target_len
        return drafts

    def _chain_step(self, k: int) -> Callable[..., Tensor]:
        fn = eagle_chain_fn(k)
        if self.compiled is None:
            return fn
        if k not in self._chains:
            self._chains[k] = CompiledStep(fn, name=f"drafter chain {k}")
        return self._chains[k]


_CHAIN_FNS: dict[int, Callable[..., Tensor]] = {}


def eagle_chain_fn(k: int) -> Callable[..., Tensor]:
    """The function drafting a chain of k (one object per k, so every cache shares its compiled graphs):
    fn(step, tokens, positions, slots, mask, ks, vs, features, u=None, temperature=None) -> drafts [B, k] long.
    u, temperature [B, k]: draft i + 1's `coupled_guess` inputs (sampling batches); None: every draft is
    the drafter's argmax (greedy batches, or `guess="argmax"`). Two graphs per k, both warmed up.

    Its inputs are the catch-up pass's (`EagleCache._catch_up_inputs`, mask wide enough for the chain:
    max(L) + k - 1 slots). Each row's newest position is its last entry (padding repeats it), so L =
    positions[:, -1] + 1 and the f-hat the first draft comes from is the output at the first entry with
    that position. Draft i + 1 sits at position L + i, its k/v at scratch slot L + i; it sees the
    committed slots and the chain's earlier ones: [0, L + i]. Eager and compiled run this same code.
    """
    if k < 1:
        raise ValueError(f"k (draft length) must be >= 1, got {k}")
    if k not in _CHAIN_FNS:

        def eagle_chain(
            step: EagleStep,
            tokens: Tensor,
            positions: Tensor,
            slots: Tensor,
            mask: Tensor,
            ks: list[Tensor],
            vs: list[Tensor],
            features: Tensor,
            u: Tensor | None = None,
            temperature: Tensor | None = None,
        ) -> Tensor:
            out = eagle_forward(step, tokens, positions, slots, mask, ks, vs, features)  # [B, Q, H]
            newest = positions[:, -1:]  # [B, 1]
            first = (positions == newest).to(torch.int64).argmax(dim=1)  # [B]
            feature = out[torch.arange(out.shape[0], device=out.device), first]  # [B, H]
            length = newest[:, 0] + 1  # [B] committed slots L
            span = torch.arange(mask.shape[-1], device=mask.device)
            drafts = []
            for i in range(k):
                logits = step.drafter.draft_logits(feature)  # [B, V]
                token = logits.argmax(dim=-1) if u is None else coupled_guess(logits, u[:, i], temperature[:, i])
                drafts.append(token)
                if i + 1 < k:
                    pos = (length + i)[:, None]  # [B, 1]
                    seen = span[None, None, :] <= pos[:, :, None]  # [B, 1, S]
                    feature = eagle_forward(step, token[:, None], pos, pos, seen, ks, vs, feature[:, None])[:, 0]
            return torch.stack(drafts, dim=1)

        _CHAIN_FNS[k] = eagle_chain
    return _CHAIN_FNS[k]


def own_or_shared_cache(
    state: EagleCache | None,
    scratch: int,
    drafter: EagleDrafter,
    embed: torch.nn.Embedding,
    max_batch_size: int,
    max_context: int,
    compile: bool,
) -> EagleCache:
    """`state` (checked: same drafter, room for `scratch` draft slots) or a new cache of the drafter's own."""
    if state is None:
        return EagleCache(drafter, embed, max_batch_size, max_context, compile, scratch)
    if state.drafter is not drafter or state.scratch < scratch:  # a cache of another drafter, or too small
        raise ValueError(
            f"a shared drafter cache must belong to the same drafter and hold >= {scratch} scratch "
            f"slots, it holds {state.scratch}"
        )
    return state


class EagleChainDrafter:
    """Chains of k drafts from the EAGLE drafter, verified by exact match: in a sampling batch each is the
    drafter's coupled guess of the target's sample (`guess="coupled"`, the default) or its argmax."""

    def __init__(
        self,
        drafter: EagleDrafter,
        embed: torch.nn.Embedding,
        k: int,
        max_batch_size: int,
        max_context: int,
        compile: bool = False,
        guess: str = "coupled",
        state: EagleCache | None = None,
    ) -> None:
        """state: a drafter cache shared with other arms (scratch >= k - 1 slots); None: one of its own."""
        if k < 1:
            raise ValueError(f"k (draft length) must be >= 1, got {k}")
        if guess not in GUESSES:
            raise ValueError(f"guess must be one of {GUESSES}, got {guess!r}")
        self.k, self.guess = k, guess
        self.state = own_or_shared_cache(state, k - 1, drafter, embed, max_batch_size, max_context, compile)

    @torch.no_grad()
    def propose(self, batch: RunningBatch) -> Draft:
        return Draft(chain_tree(batch.last_token, self.state.chain(batch, self.k, self.guess)), chain=True)
