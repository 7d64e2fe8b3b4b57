"""EAGLE draft trees: the drafter's top-k children per expanded node, the best nodes of each level expanded
again, the most likely `budget` nodes verified (one-hot rule: the children are chosen, not sampled). They
share the chains' drafter cache (`tlt.rollout.drafting.EagleCache`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tlt.models.drafter import EagleDrafter
from tlt.rollout.batch import RunningBatch
from tlt.rollout.drafting import Draft, EagleCache, own_or_shared_cache
from tlt.rollout.tree import build_tree


class EagleTreeDrafter:
    """Trees from the EAGLE drafter: top-k children per expanded node, the best top-k nodes of each
    level expanded again, for `depth` levels; the `budget` most likely nodes are verified.

    The children are chosen, not sampled, so they are verified with the one-hot rule (no q).
    """

    def __init__(
        self,
        drafter: EagleDrafter,
        embed: torch.nn.Embedding,
        *,
        topk: int,
        depth: int,
        budget: int,
        max_batch_size: int,
        max_context: int,
        compile: bool = False,
        state: EagleCache | None = None,
    ) -> None:
        """state: as `EagleChainDrafter`'s (its scratch must hold topk * (depth - 1) drafts)."""
        if topk < 1 or depth < 1 or budget < 1:
            raise ValueError(f"topk, depth and budget must be >= 1, got topk={topk}, depth={depth}, budget={budget}")
        self.topk, self.depth, self.budget = topk, depth, budget
        self.state = own_or_shared_cache(
            state, topk * (depth - 1), drafter, embed, max_batch_size, max_context, compile
        )

    @torch.no_grad()
    def propose(self, batch: RunningBatch) -> Draft:
        state = self.state
        feature = state.catch_up(batch)  # [B, H] f-hat for the root's next position
        L = batch.lengths()
        B, H = feature.shape
        k = self.topk
        top = F.log_softmax(state.drafter.draft_logits(feature).double(), dim=-1).topk(k, dim=-1)
        tokens, logprobs = [top.indices], [top.values]  # per level: [B, n_level]
        parents = [torch.full((B, k), -1, dtype=torch.long, device=L.device)]
        parent_feat = [feature[:, None, :].expand(B, k, H)]  # f-hat the candidate is fed with
        max_expanded = k * (self.depth - 1)
        cand_anc = [torch.zeros(B, k, max_expanded, dtype=torch.bool, device=L.device)]  # expanded ancestors
        score = top.values  # [B, n_level] path log-probs of the newest level
        offset, expanded = 0, 0
        for level in range(1, self.depth):
            width = min(k, score.shape[1])
            pick = score.topk(width, dim=-1).indices  # [B, w] within the level
            level_tokens = tokens[-1].gather(1, pick)
            feats = parent_feat[-1].gather(1, pick[:, :, None].expand(B, width, H))
            own = torch.zeros(B, width, max_expanded, dtype=torch.bool, device=L.device)
            own[:, torch.arange(width), expanded + torch.arange(width)] = True
            anc = cand_anc[-1].gather(1, pick[:, :, None].expand(B, width, max_expanded)) | own  # [B, w, E]
            slots = L[:, None] + expanded + torch.arange(width, device=L.device)[None, :]
            span = int(L.max()) + expanded + width
            out = state.forward(
                level_tokens, feats, (L + level - 1)[:, None].expand(B, width), slots, _expanded_mask(L, anc, span)
            )
            child = F.log_softmax(state.drafter.draft_logits(out).double(), dim=-1).topk(k, dim=-1)  # [B, w, k]
            tokens.append(child.indices.reshape(B, width * k))
            logprobs.append(child.values.reshape(B, width * k))
            parents.append((offset + pick)[:, :, None].expand(B, width, k).reshape(B, width * k))
            parent_feat.append(out[:, :, None, :].expand(B, width, k, H).reshape(B, width * k, H))
            cand_anc.append(anc[:, :, None, :].expand(B, width, k, max_expanded).reshape(B, width * k, max_expanded))
            score = (score.gather(1, pick)[:, :, None] + child.values).reshape(B, width * k)
            offset += tokens[-2].shape[1]
            expanded += width
        tree = build_tree(
            batch.last_token, torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(logprobs, 1), self.budget
        )
        return Draft(tree, chain=False)


def _expanded_mask(L: Tensor, anc: Tensor, span: int) -> Tensor:
    """[B, w, span]: expanded node i of row b sees the drafter's committed slots [0, L[b]) and the
    scratch slots L[b] + e of the expanded nodes e in anc[b, i] (its ancestors and itself)."""
    B, w, E = anc.shape
    slots = torch.arange(span, device=L.device)[None, :]
    rel = slots - L[:, None]  # [B, S] expanded index of each slot
    inside = (rel >= 0) & (rel < E)
    seen = anc.gather(2, rel.clamp(0, max(E - 1, 0))[:, None, :].expand(B, w, span)) & inside[:, None, :]
    return (rel < 0)[:, None, :] | seen
