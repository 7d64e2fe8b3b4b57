"""Partial rollouts across steps (`algorithm.rollout.mode: partial`): which groups a step runs, which it trains,
what it keeps, what it drops.

A step starts `groups_started(P)` groups: the kept ones first (oldest first), then prompts queued again, then
fresh prompts from the training set's walk (`rl_step.walk_prompts`). A kept group whose oldest token was
sampled more than `maxStaleness` steps before this step is dropped (the update would train on it that stale)
and its prompt queued again, as a new attempt. Each shard ends its rollout at its share of P groups
(`partial_work.shard_quotas`, the shards of `rollout.replicas` workers in both executors); of every shard the
groups ending first are trained (`partial_work.chosen_groups`) and the rest are kept as of the shard's cut:
every member's tokens, behaviour log-probs and the step that sampled each token, and the rewards of the
finished ones. So P groups are trained every step, each group exactly once, and a prompt
dropped is never lost: it runs again from the queue.

Everything here is a function of the run's seed and the step (segment seeds, the walk), and `state_dict`
holds the rest, so a run resumed from a checkpoint continues the responses in flight exactly as the
uninterrupted run does.

Per-step metrics: `off_policy_fraction` (trained tokens sampled by an older policy), `staleness_tokens`
(staleness in steps -> trained tokens), `generated_tokens` (kept of what this step sampled, trained now or
later), `groups_trained` / `groups_continued` / `groups_kept` / `groups_dropped` / `groups_queued`, and the keys of the
groups trained and dropped (a ledger).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from tlt.rl.reward_plugin import RewardError
from tlt.rollout.types import Completion
from tlt.runtime import rl_step
from tlt.runtime.partial_work import GroupWork, MemberWork
from tlt.spec.run import AlgorithmSpec

Scored = tuple[float, RewardError | None]
PARTIAL_STATE = "partial_rollouts"  # a whole-run checkpoint's object holding `PartialRollouts.state_dict`


@dataclass
class Member:
    """One response in flight: its tokens, their behaviour log-probs [T] and the step that sampled each."""

    tokens: list[int] = field(default_factory=list)
    logprobs: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    scored: Scored | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason in ("stop", "length")


@dataclass
class Group:
    """A prompt's group of responses: `key` its draw (its place in the walk), `attempt` 0 until dropped."""

    key: int
    problem: int
    attempt: int
    members: list[Member]
    prompt: list[int] = field(default_factory=list)  # the problem's prompt ids, from its first rollout

    def oldest(self) -> int | None:
        """The step that sampled the group's oldest token (None: no token yet)."""
        return min((v for m in self.members for v in m.versions[:1]), default=None)

    def request_id(self, member: int) -> str:
        return f"q{self.key}-a{self.attempt}-g{member}"


@dataclass
class Trained:
    """What a partial step trains: `completions` P * G prompt-major (each with its `staleness`), `rewards`
    [P, G], `problems` [P] dataset indices, the step's partial-rollout `metrics`."""

    completions: list[Completion]
    rewards: torch.Tensor
    problems: list[int]
    metrics: dict[str, Any]


class PartialRollouts:
    """The groups in flight between steps, the queue of prompts to run again, and the place in the walk."""

    def __init__(self, algo: AlgorithmSpec, num_problems: int) -> None:
        self.algo = algo
        self.num_problems = num_problems
        self.started = algo.rollout.groups_started(algo.prompts_per_step)
        self.cursor = 0  # the next position of the training set's walk
        self.queue: list[tuple[int, int, int]] = []  # (key, problem, attempt) to run again, oldest first
        self.inflight: list[Group] = []
        self._dropped: list[int] = []
        self._continued = 0
        self._generated = 0

    def plan(self, step: int) -> list[GroupWork]:
        """Step `step`'s groups (kept, queued again, fresh), after dropping the kept groups too stale for it."""
        limit = step - self.algo.rollout.max_staleness
        kept, self._dropped = [], []
        for group in self.inflight:
            oldest = group.oldest()
            if oldest is not None and oldest < limit:
                self._dropped.append(group.key)
                self.queue.append((group.key, group.problem, group.attempt + 1))
            else:
                kept.append(group)
        self._continued = len(kept)
        again = self.queue[: max(0, self.started - len(kept))]
        del self.queue[: len(again)]
        fresh = rl_step.walk_prompts(
            self.num_problems, self.algo.seed, self.cursor, self.started - len(kept) - len(again)
        )
        starts = [*again, *((self.cursor + i, problem, 0) for i, problem in enumerate(fresh))]
        self.cursor += len(fresh)
        for key, problem, attempt in starts:
            kept.append(Group(key, problem, attempt, [Member() for _ in range(self.algo.group_size)]))
        self.inflight = kept
        return [self._work(group, step) for group in kept]

    def _work(self, group: Group, step: int) -> GroupWork:
        members = tuple(
            MemberWork(
                request_id=group.request_id(g),
                tokens=tuple(m.tokens),
                logprobs=m.logprobs,
                finished=m.finished,
                seed=rl_step.derive_seed("partial", self.algo.seed, group.key, group.attempt, g, step),
            )
            for g, m in enumerate(group.members)
        )
        return GroupWork(group.key, group.problem, members)

    def absorb(
        self, step: int, completions: list[Completion], scored: list[Scored | None], results: list[dict[str, Any]]
    ) -> Trained:
        """Take step `step`'s rollout back (`completions` of the members that ran, whole as of their shard's cut,
        with `scored` in the same order, None where unfinished; `results` each shard's `chosen` group positions
        and its number of `groups`, in shard order) and return the groups to train."""
        by_id = {group.request_id(g): (group, g) for group in self.inflight for g in range(len(group.members))}
        self._generated = 0
        for completion, score in zip(completions, scored, strict=True):
            group, g = by_id[completion.request_id]
            group.prompt = list(completion.prompt_ids)
            member = group.members[g]
            new = len(completion.token_ids) - len(member.tokens)
            self._generated += new
            member.tokens = list(completion.token_ids)
            member.logprobs = completion.logprobs.float()
            member.versions = member.versions + [step] * new
            member.finish_reason = completion.finish_reason
            member.scored = score
        chosen: list[int] = []
        offset = 0
        for result in results:  # each shard's chosen groups, by position in the shard
            chosen.extend(offset + i for i in result["chosen"])
            offset += result["groups"]
        if offset != len(self.inflight) or len(set(chosen)) != self.algo.prompts_per_step:
            raise RuntimeError(
                f"partial rollout of step {step}: {len(set(chosen))} groups chosen of {offset} reported for "
                f"{self.algo.prompts_per_step} prompts and {len(self.inflight)} groups started"
            )
        picked = set(chosen)
        trained = [self.inflight[i] for i in sorted(picked)]
        self.inflight = [g for i, g in enumerate(self.inflight) if i not in picked]
        return self._trained(step, trained)

    def _trained(self, step: int, groups: list[Group]) -> Trained:
        completions, rewards, staleness = [], [], Counter()
        for group in groups:
            for g, member in enumerate(group.members):
                assert member.finished and member.scored is not None
                stale = torch.tensor([step - v for v in member.versions], dtype=torch.long)
                staleness.update(stale.tolist())
                completions.append(
                    Completion(
                        request_id=group.request_id(g),
                        prompt_ids=list(group.prompt),
                        token_ids=list(member.tokens),
                        logprobs=member.logprobs,
                        hidden=None,
                        finish_reason=member.finish_reason,  # type: ignore[arg-type]
                        staleness=stale,
                    )
                )
                rewards.append(member.scored[0])
        tokens = sum(staleness.values())
        metrics = {
            "off_policy_fraction": (tokens - staleness.get(0, 0)) / tokens if tokens else 0.0,
            "staleness_tokens": {str(k): v for k, v in sorted(staleness.items())},
            "generated_tokens": self._generated,  # sampled in this step's rollout, trained or not
            "groups_trained": len(groups),
            "groups_continued": self._continued,
            "groups_kept": len(self.inflight),
            "groups_dropped": len(self._dropped),
            "groups_queued": len(self.queue),
            "trained_groups": [g.key for g in groups],
            "dropped_groups": list(self._dropped),
        }
        reward_tensor = torch.tensor(rewards, dtype=torch.float32).view(len(groups), self.algo.group_size)
        return Trained(completions, reward_tensor, [g.problem for g in groups], metrics)

    def state_dict(self) -> dict[str, Any]:
        """Everything in flight, for a whole-run checkpoint (`torch.save`-able: tensors, lists, numbers)."""
        return {
            "cursor": self.cursor,
            "queue": [list(q) for q in self.queue],
            "inflight": [
                {
                    "key": g.key,
                    "problem": g.problem,
                    "attempt": g.attempt,
                    "prompt": list(g.prompt),
                    "members": [
                        {
                            "tokens": list(m.tokens),
                            "logprobs": m.logprobs.clone(),
                            "versions": list(m.versions),
                            "finish_reason": m.finish_reason,
                            "scored": None
                            if m.scored is None
                            else [
                                m.scored[0],
                                None if m.scored[1] is None else [m.scored[1].sample, m.scored[1].error],
                            ],
                        }
                        for m in g.members
                    ],
                }
                for g in self.inflight
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.queue = [(int(k), int(p), int(a)) for k, p, a in state["queue"]]
        self.inflight = []
        for g in state["inflight"]:
            members = []
            for m in g["members"]:
                scored = m["scored"]
                error = None if scored is None or scored[1] is None else RewardError(*scored[1])
                members.append(
                    Member(
                        tokens=list(m["tokens"]),
                        logprobs=m["logprobs"],
                        versions=list(m["versions"]),
                        finish_reason=m["finish_reason"],
                        scored=None if scored is None else (float(scored[0]), error),
                    )
                )
            group = Group(int(g["key"]), int(g["problem"]), int(g["attempt"]), members, list(g["prompt"]))
            self.inflight.append(group)
