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
from tlt.rollout.decode_step import PlainStepper
from tlt.rollout.drafting import Drafter
from tlt.rollout.runner import ModelRunner
from tlt.rollout.sampling import sample_tokens
from tlt.rollout.tree import DraftTree, chain_attention_mask, compaction_slots, tree_attention_mask, tree_positions
from tlt.rollout.verify import verify_chain_tokens, verify_tree_tokens

log = logging.getLogger(__name__)


# Lower edges of the response-position ranges `AcceptanceStats.by_position` counts in (tokens generated
# before the step): 0-31, 32-63, 64-127, 128-255, 256 and on.
POSITION_EDGES = (0, 32, 64, 128, 256)


def position_edge(position: int) -> int:
    """The lower edge of the POSITION_EDGES range holding response position `position` (>= 0)."""
    return max(e for e in POSITION_EDGES if e <= position)


@dataclass
class AcceptanceStats:
    """Acceptance counted over speculative steps: per batch step, per request, and per range of response
    positions (`by_position`: edge -> [row-steps, accepted drafts], from rows whose step started there)."""

    steps: int = 0
    row_steps: int = 0
    accepted: int = 0
    drafted: int = 0
    plain_fallbacks: int = 0
    last_step_accepted: list[int] = field(default_factory=list)
    per_request: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    by_position: dict[int, list[int]] = field(default_factory=dict)

    @property
    def accept_length(self) -> float:
        """Mean tokens gained per row and step (accepted drafts + the next token)."""
        return (self.accepted + self.row_steps) / self.row_steps if self.row_steps else 0.0

    def record(
        self, request_ids: list[str], accepted: list[int], drafted: int, positions: list[int] | None = None
    ) -> None:
        """One step: each row's accepted drafts and (optional) its response position before the step."""
        self.steps += 1
        self.row_steps += len(accepted)
        self.accepted += sum(accepted)
        self.drafted += drafted
        self.last_step_accepted = accepted
        for rid, n in zip(request_ids, accepted):
            self.per_request[rid].append(n)
        for position, n in zip(positions or (), accepted):
            counts = self.by_position.setdefault(position_edge(position), [0, 0])
            counts[0] += 1
            counts[1] += n


def _target_tokens(logits: Tensor, tree: DraftTree, batch: RunningBatch) -> tuple[Tensor, Tensor]:
    """The target's own token at every node and its log-prob, each [B, N], from its logits [B, N, V]: the
    argmax in a greedy batch; in a sampling batch, its draw with the uniform of the node's generated
    position (the coupled rule, `tlt.rollout.verify`). `sample_tokens` is the plain step's own sampler, so
    every node's token is the one a plain step at that position would draw from the same logits."""
    if not batch.sampled:
        u = None
    else:  # [B, N]: node j's token at generated position g + depth[j] (a full chain: depth j)
        u = batch.uniform_window(tree.depth.shape[1]) if tree.full_chain else batch.uniforms_at(tree.depth)
    return sample_tokens(logits, batch.temperature, batch.top_p, u)


class SpeculativeStepper:
    """A `Stepper` that advances every row by 1 + (accepted drafts) tokens with one target forward."""

    def __init__(self, runner: ModelRunner, drafter: Drafter) -> None:
        self.runner = runner
        self.drafter = drafter
        self.stats = AcceptanceStats()
        self._plain = PlainStepper(runner)

    def step(self, batch: RunningBatch) -> int:
        longest = max(batch.cache.lengths)  # committed slots of the fullest row
        draft = self.drafter.propose(batch)
        tree = draft.tree
        B, N = tree.tokens.shape
        if longest + N > self.runner.cache.max_capacity:
            # No room for the tree near the context limit: a plain step is exact too.
            self.stats.plain_fallbacks += 1
            return self._plain.step(batch)
        lengths = batch.lengths()  # [B] committed slots
        device = lengths.device
        slots = lengths[:, None] + torch.arange(N, device=device)[None, :]  # [B, N]
        positions = slots if tree.full_chain else tree_positions(tree, lengths)  # full chain: depth j at slot j
        mask = (chain_attention_mask if draft.chain else tree_attention_mask)(tree, lengths, longest + N)  # [B, N, S]
        hidden = self.runner.forward(tree.tokens, positions, slots, mask)  # [B, N, H]
        logits = self.runner.logits(hidden)  # [B, N, V]
        target, target_logprobs = _target_tokens(logits, tree, batch)  # [B, N] each
        if draft.chain:
            n_draft = None if tree.full_chain else tree.valid[:, 1:].sum(dim=1)  # [B] (None: all N - 1)
            n_acc, _ = verify_chain_tokens(target, tree.tokens[:, 1:], n_draft)
            # Exact match: accepted draft j equals the target's token at node j - 1, and the next token is
            # the target's at node n_acc, so the new tokens are target[:, :n_acc + 1], each produced by the
            # node at its own index (entries past n_acc are never kept).
            new, logprobs, fed_hidden = target, target_logprobs, hidden
            drafted = B * (N - 1) if n_draft is None else int(n_draft.sum())
        else:
            verdict = verify_tree_tokens(target, tree.tokens, tree.parents)
            n_acc = verdict.n_accepted
            rows = torch.arange(B, device=device)
            src, dst, keep = compaction_slots(verdict.path, n_acc, lengths)
            root = lengths[:, None].expand_as(src)
            self.runner.compact(rows, torch.where(keep, src, root), torch.where(keep, dst, root))
            # Fed node j (the root, then the accepted path) produced new token j: an accepted node's token
            # equals the target's at its parent, and the next token is the target's at the last fed node.
            fed_nodes = torch.cat([torch.zeros_like(n_acc)[:, None], verdict.path.clamp_min(0)], dim=1)  # [B, N]
            new, logprobs = target.gather(1, fed_nodes), target_logprobs.gather(1, fed_nodes)
            fed_hidden = hidden.gather(1, fed_nodes[:, :, None].expand(B, N, hidden.shape[-1]))
            drafted = int(tree.valid[:, 1:].sum())
        accepted = n_acc.tolist()
        counts = [n + 1 for n in accepted]
        new_lists = [row[:c] for row, c in zip(new.tolist(), counts)]
        self.stats.record(
            [s.request.request_id for s in batch.sequences], accepted, drafted, [len(s.tokens) for s in batch.sequences]
        )
        last = torch.tensor([row[-1] for row in new_lists], dtype=torch.long, device=device)  # [B]
        batch.commit(new_lists, last, logprobs, fed_hidden, fed=counts)
        return B * N
