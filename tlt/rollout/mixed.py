"""The mixed drafter: per row, history drafts where the row's history match is expected to be
accepted at least as far as the learned EAGLE drafter's, the EAGLE drafter elsewhere, and nothing
where the row's recent drafts were rejected.

The choice per row compares expected accepted tokens: a history chain's is read from the index's own
frequencies (the sum over i of the product of the first i drafts' shares of their continuations,
`SuffixTrie.scored_path`); the EAGLE drafter's is a running mean of the tokens its drafts actually got
accepted (per row-step, all rows pooled, starting at k / 2). History drafts cost nothing; the EAGLE
drafter costs a pass per draft token for the whole batch, so it runs only when some row chose it.

Rows are independent in verification, so one step can mix sources: every draft is chosen (a history
continuation or the EAGLE drafter's argmax) and verified by exact match against the target's own
token at each position (argmax, or the coupled sample), whichever source it came from. Lossless.

`RowGate` is the per-row cost rule: a row that drafted and had nothing accepted `patience` steps in
a row stops drafting for `backoff` steps, doubling (up to `max_backoff`) each time it fails again
after a pause; one accepted draft resets it. The EAGLE drafter runs only when some row wants it
(its cache catches up on the skipped positions later, from the target's saved states).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tlt.rollout.batch import RunningBatch
from tlt.rollout.drafting import Draft, EagleChainDrafter
from tlt.rollout.history import HistoryStore, pad_drafts
from tlt.rollout.sequence import Sequence
from tlt.rollout.tree import chain_tree


@dataclass
class _RowState:
    generated: int = 0  # tokens the row had when it last drafted
    drafted: int = 0  # tokens it drafted then
    fails: int = 0  # consecutive drafting steps with nothing accepted
    pause: int = 0  # steps left without drafting
    backoff: int = 0  # length of the next pause


class RowGate:
    """Which rows draft this step (see the module docstring). Keyed by sequence identity. After
    `allow`, `accepted[b]` is what row b's previous draft got accepted (None if it did not draft)."""

    def __init__(self, patience: int = 2, backoff: int = 2, max_backoff: int = 32) -> None:
        if patience < 1 or backoff < 1 or max_backoff < backoff:
            raise ValueError(
                f"need patience >= 1 and 1 <= backoff <= max_backoff, got patience={patience}, "
                f"backoff={backoff}, max_backoff={max_backoff}"
            )
        self.patience, self.backoff, self.max_backoff = patience, backoff, max_backoff
        self._rows: dict[int, tuple[Sequence, _RowState]] = {}
        self.skipped = 0
        self.accepted: list[int | None] = []

    def allow(self, sequences: list[Sequence]) -> list[bool]:
        """Per running row: may it draft this step? Learns from what the previous drafts gained."""
        out = []
        self.accepted = []
        for seq in sequences:
            entry = self._rows.get(id(seq))
            if entry is None:
                entry = self._rows[id(seq)] = (seq, _RowState(backoff=self.backoff))
            st = entry[1]
            self.accepted.append(len(seq.tokens) - st.generated - 1 if st.drafted else None)
            if st.drafted:
                accepted = self.accepted[-1]
                if accepted > 0:
                    st.fails, st.backoff = 0, self.backoff
                else:
                    st.fails += 1
                    if st.fails >= self.patience:
                        st.pause, st.fails = st.backoff, self.patience - 1  # after the pause, one more try
                        st.backoff = min(2 * st.backoff, self.max_backoff)
                st.drafted = 0
            if st.pause > 0:
                st.pause -= 1
                self.skipped += 1
                out.append(False)
            else:
                out.append(True)
        self._rows = {k: v for k, v in self._rows.items() if not v[0].finished}
        return out

    def drafted(self, seq: Sequence, n: int) -> None:
        """Record that the row drafted n tokens this step."""
        st = self._rows[id(seq)][1]
        st.generated, st.drafted = len(seq.tokens), n


class MixedDrafter:
    """Chains of up to k tokens per row from history or EAGLE (when given), by expected accepted
    tokens, gated by `RowGate` (see the module docstring)."""

    def __init__(
        self, store: HistoryStore, eagle: EagleChainDrafter | None, k: int, gate: RowGate | None = None
    ) -> None:
        if not 1 <= k <= store.max_draft:
            raise ValueError(f"k (draft length) must be in [1, {store.max_draft}] (history.maxDraft), got {k}")
        if eagle is not None and eagle.k != k:
            raise ValueError(f"the EAGLE chain drafts {eagle.k} tokens, the mixed drafter {k}: build both with one k")
        self.store, self.eagle, self.k = store, eagle, k
        self.gate = gate if gate is not None else RowGate()
        self.sources = {"history": 0, "eagle": 0, "none": 0}  # row-steps by draft source
        self.eagle_expected = k / 2  # running mean of accepted EAGLE drafts per row-step
        self._last: dict[int, str] = {}  # id(sequence) -> source of its previous draft

    @torch.no_grad()
    def propose(self, batch: RunningBatch) -> Draft:
        self.store.observe(batch.all_sequences)
        seqs = batch.sequences
        allow = self.gate.allow(seqs)
        for seq, accepted in zip(seqs, self.gate.accepted):
            if accepted is not None and self._last.get(id(seq)) == "eagle":
                self.eagle_expected += 0.05 * (accepted - self.eagle_expected)
        scored = [self.store.scored_chain(s, self.k) if ok else ([], 0.0) for s, ok in zip(seqs, allow)]
        bar = self.eagle_expected if self.eagle is not None else 0.0
        history = [h if h and e >= bar else [] for h, e in scored]
        want_eagle = [ok and not h for ok, h in zip(allow, history)] if self.eagle is not None else [False] * len(seqs)
        draft, n_draft = pad_drafts(history, self.k, batch.device)
        if self.eagle is not None and any(want_eagle):
            learned = self.eagle.propose(batch)
            use = torch.tensor(want_eagle, device=batch.device)
            draft = torch.where(use[:, None], learned.tree.tokens[:, 1:], draft)
            n_draft = torch.where(use, self.k, n_draft)
        self._last = {}
        for seq, n, h, e in zip(seqs, n_draft.tolist(), history, want_eagle):
            self.gate.drafted(seq, n)
            source = "history" if h else "eagle" if e else "none"
            self.sources[source] += 1
            self._last[id(seq)] = source
        return Draft(chain_tree(batch.last_token, draft, n_draft), chain=True)
