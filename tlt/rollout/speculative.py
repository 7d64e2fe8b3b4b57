"""Speculative decoding stepper: draft, ONE target forward over the draft tree, verify per row, compact.

Per step and row b with L[b] committed cache slots and newest (unfed) token r[b]:
  1. the drafter proposes a tree rooted at r[b] (a chain is a tree with one child per node);
  2. the target runs once over all N nodes: node j at slot L[b] + j, RoPE position L[b] + depth[j],
     seeing the cached prefix, its ancestors and itself;
  3. verification (verify.py) picks the accepted path and the next token, per row, in one batch: by exact
     match against the target's own token at each node (its argmax, or its sample with the uniform of
     that generated position: the coupled rule, so sampled rows reproduce plain sampling exactly);
  4. the k/v of the accepted path move next to the root (cache compaction), and the root plus the
     accepted nodes are committed: L[b] grows by 1 + accepted[b]; the new tokens are the accepted
     drafts plus the next token, each with the target's log-prob at the node that produced it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tlt.rollout.batch import RunningBatch
from tlt.rollout.drafting import Draft, Drafter
from tlt.rollout.runner import ModelRunner
from tlt.rollout.sampling import process_logits, sample_from, token_logprobs
from tlt.rollout.stepper import PlainStepper
from tlt.rollout.tree import chain_attention_mask, compaction_slots, tree_attention_mask, tree_positions
from tlt.rollout.verify import TreeVerdict, verify_chain_tokens, verify_tree_tokens

log = logging.getLogger(__name__)


@dataclass
class AcceptanceStats:
    """Acceptance counted over speculative steps: per batch step and per request."""

    steps: int = 0
    row_steps: int = 0
    accepted: int = 0
    drafted: int = 0
    plain_fallbacks: int = 0
    last_step_accepted: list[int] = field(default_factory=list)
    per_request: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    @property
    def accept_length(self) -> float:
        """Mean tokens gained per row and step (accepted drafts + the next token)."""
        return (self.accepted + self.row_steps) / self.row_steps if self.row_steps else 0.0

    def record(self, request_ids: list[str], accepted: list[int], drafted: int) -> None:
        self.steps += 1
        self.row_steps += len(accepted)
        self.accepted += sum(accepted)
        self.drafted += drafted
        self.last_step_accepted = accepted
        for rid, n in zip(request_ids, accepted):
            self.per_request[rid].append(n)


def _verify(draft: Draft, logits: Tensor, batch: RunningBatch) -> TreeVerdict:
    """Pick the accepted path per row. logits: [B, N, V] target logits at the draft's nodes.

    Greedy batches take the argmax at every node; sampling batches draw each node's token from the
    processed target distribution with the uniform of its generated position (the coupled rule,
    `tlt.rollout.verify`): the accepted tokens are the ones plain sampling would draw.
    """
    tree = draft.tree
    if batch.sampled:
        p = process_logits(logits, batch.temperature, batch.top_p)  # [B, N, V], as plain sampling processes
        target = sample_from(p, batch.uniforms_at(tree.depth))  # [B, N]: node j's token at position g + depth
    else:
        target = logits.argmax(dim=-1)
    if draft.chain:
        drafts, n_draft = tree.tokens[:, 1:], tree.valid[:, 1:].sum(dim=1)
        n_acc, next_token = verify_chain_tokens(target, drafts, n_draft)
        return _chain_verdict(n_acc, next_token, tree.num_nodes)
    return verify_tree_tokens(target, tree.tokens, tree.parents)


def _chain_verdict(n_accepted: Tensor, next_token: Tensor, num_nodes: int) -> TreeVerdict:
    """A chain's outcome in tree form: nodes 1..n_accepted accepted, the last one produced next_token."""
    steps = torch.arange(1, num_nodes, device=n_accepted.device)[None, :]
    path = torch.where(steps <= n_accepted[:, None], steps, -1)
    return TreeVerdict(path, n_accepted, next_token, n_accepted)


class SpeculativeStepper:
    """A `Stepper` that advances every row by 1 + (accepted drafts) tokens with one target forward."""

    def __init__(self, runner: ModelRunner, drafter: Drafter) -> None:
        self.runner = runner
        self.drafter = drafter
        self.stats = AcceptanceStats()
        self._plain = PlainStepper(runner)

    def step(self, batch: RunningBatch) -> int:
        lengths = batch.lengths()  # [B] committed slots
        draft = self.drafter.propose(batch)
        tree = draft.tree
        B, N = tree.tokens.shape
        if int(lengths.max()) + N > self.runner.cache.max_capacity:
            # No room for the tree near the context limit: a plain step is exact too.
            self.stats.plain_fallbacks += 1
            return self._plain.step(batch)
        device = lengths.device
        rows = torch.arange(B, device=device)
        span = int(lengths.max()) + N
        slots = lengths[:, None] + torch.arange(N, device=device)[None, :]  # [B, N]
        mask = (chain_attention_mask if draft.chain else tree_attention_mask)(tree, lengths, span)  # [B, N, S]
        hidden = self.runner.forward(tree.tokens, tree_positions(tree, lengths), slots, mask)  # [B, N, H]
        logits = self.runner.logits(hidden)  # [B, N, V]
        verdict = _verify(draft, logits, batch)
        n_acc = verdict.n_accepted
        if not draft.chain:
            src, dst, keep = compaction_slots(verdict.path, n_acc, lengths)
            root = lengths[:, None].expand_as(src)
            self.runner.compact(rows, torch.where(keep, src, root), torch.where(keep, dst, root))
        fed_nodes = torch.cat([torch.zeros_like(n_acc)[:, None], verdict.path.clamp_min(0)], dim=1)  # [B, N]
        # New tokens: accepted drafts, then the next token at position n_accepted.
        new = torch.cat([tree.tokens.gather(1, fed_nodes[:, 1:]), torch.zeros_like(n_acc)[:, None]], dim=1)
        new[rows, n_acc] = verdict.next_token
        # Node that produced new token j is fed node j (the root produced the first).
        producer_logits = logits.gather(1, fed_nodes[:, :, None].expand(B, N, logits.shape[-1]))
        logprobs = token_logprobs(producer_logits, new, batch.temperature)  # [B, N]
        fed_hidden = hidden.gather(1, fed_nodes[:, :, None].expand(B, N, hidden.shape[-1]))
        counts = (n_acc + 1).tolist()
        new_lists = [row[:c] for row, c in zip(new.tolist(), counts)]
        drafted = int(tree.valid[:, 1:].sum())
        self.stats.record([s.request.request_id for s in batch.sequences], n_acc.tolist(), drafted)
        batch.commit(new_lists, verdict.next_token, logprobs, fed_hidden, fed=counts)
        return B * N
