"""A partial-rollout step's work as a rollout worker sees it: the groups of its shard, each member with the
tokens it has kept, and what comes back (`algorithm.rollout.mode: partial`).

A member that has not finished is continued from its last token under the step's weights: its request is the
problem's prompt followed by the kept tokens (a fresh prefill of them), with the token budget they left, and a
seed of its own for this segment. What comes back is made whole again (`whole_completion`): the problem's
prompt, the kept tokens and the new ones, the behaviour log-probs of all of them (each under the policy that
sampled it), the hidden states of the last segment (the current policy's, over the whole sequence).

Where a step's rollout ends is a function of the sampled tokens alone, not of the engine's speed: a group ends
at the most tokens any of its members needed this step (`group_ends`), a shard's cut is its `quota`-th
smallest group end, known once no member still running can end a group at or before it (`settled_cut`); the
`quota` groups ending first (ties: the earlier group) are trained (`chosen_groups`), every other member keeps
the first `cut` tokens of this step (`cut_completion`; one that finished later is unfinished again). So
speculative decoding, which runs rows ahead unevenly, keeps exactly the tokens a plain rollout keeps, and a
shard gives the same result on whichever worker, and beside whichever other shards, it runs.

The bookkeeping across steps (which groups run, which are trained, staleness) is the trainer's:
`tlt.runtime.partial_rollouts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedTokenizerBase

from tlt.rollout.types import Completion, Request, SamplingParams
from tlt.runtime.rl_step import shards
from tlt.spec.run import AlgorithmSpec
from tlt.tasks.problem import Problem
from tlt.tasks.prompt_format import encode_prompt


@dataclass(frozen=True)
class MemberWork:
    """One response of a group: `tokens` kept so far, `logprobs` [len(tokens)] their behaviour log-probs,
    `finished` (nothing to generate this step), `seed` of this step's segment."""

    request_id: str
    tokens: tuple[int, ...]
    logprobs: torch.Tensor
    finished: bool
    seed: int


@dataclass(frozen=True)
class GroupWork:
    """One group of a step: `key` names the group across steps, `problem` its dataset index."""

    key: int
    problem: int
    members: tuple[MemberWork, ...]


def continue_requests(
    groups: Sequence[GroupWork], problems: Sequence[Problem], tokenizer: PreTrainedTokenizerBase, algo: AlgorithmSpec
) -> tuple[list[Request], dict[str, tuple[int, MemberWork]]]:
    """The requests of every unfinished member (`problems[i]` is group i's problem), prompt + kept tokens, and
    request id -> (the prompt's length, the member)."""
    if len(groups) != len(problems):
        raise ValueError(f"{len(groups)} groups but {len(problems)} problems")
    stop = () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    requests, members = [], {}
    for group, problem in zip(groups, problems):
        prompt = encode_prompt(tokenizer, problem)
        for member in group.members:
            if member.finished:
                continue
            left = algo.max_new_tokens - len(member.tokens)
            if left < 1:
                raise ValueError(f"{member.request_id}: {len(member.tokens)} kept tokens leave no budget")
            params = SamplingParams(
                temperature=algo.temperature,
                top_p=algo.top_p,
                max_new_tokens=left,
                stop_token_ids=stop,
                seed=member.seed,
            )
            requests.append(Request(member.request_id, prompt + list(member.tokens), params))
            members[member.request_id] = (len(prompt), member)
    return requests, members


def whole_completion(completion: Completion, prompt_len: int, member: MemberWork) -> Completion:
    """`completion` of a continued request as one response: the problem's prompt, kept + new tokens, their
    behaviour log-probs; the hidden states (over the whole sequence) as they are."""
    if not member.tokens:
        return completion
    return replace(
        completion,
        prompt_ids=list(completion.prompt_ids[:prompt_len]),
        token_ids=[*member.tokens, *completion.token_ids],
        logprobs=torch.cat([member.logprobs.to(completion.logprobs), completion.logprobs]),
    )


def group_ends(groups: Sequence[GroupWork], lengths: dict[str, int], done: set[str]) -> list[int | None]:
    """Each group's end in this step: the most tokens a member generated before finishing (0 for a member
    finished before the step), None while one still runs. `lengths`: tokens generated this step by request id;
    `done`: the ids finished this step."""
    out: list[int | None] = []
    for group in groups:
        ends = [0 if m.finished else lengths.get(m.request_id, 0) for m in group.members]
        running = any(not m.finished and m.request_id not in done for m in group.members)
        out.append(None if running else max(ends, default=0))
    return out


def settled_cut(groups: Sequence[GroupWork], lengths: dict[str, int], done: set[str], quota: int) -> int | None:
    """The cut of a shard of `groups` ending at `quota` groups: its `quota`-th smallest group end (0 for quota 0),
    once that many groups have ended and every member still running has generated at least that many tokens
    (it ends its group later); None until then."""
    ends = sorted(e for e in group_ends(groups, lengths, done) if e is not None)
    if len(ends) < quota:
        return None
    cut = ends[quota - 1] if quota else 0
    running = (
        lengths.get(m.request_id, 0) for g in groups for m in g.members if not (m.finished or m.request_id in done)
    )
    return cut if all(n >= cut for n in running) else None


def chosen_groups(ends: Sequence[int | None], cut: int, quota: int) -> list[int]:
    """The positions of the `quota` groups ending first (at or before `cut`; ties: the earlier group), in order."""
    order = sorted((e, i) for i, e in enumerate(ends) if e is not None and e <= cut)
    return sorted(i for _, i in order[:quota])


def cut_completion(completion: Completion, cut: int) -> Completion:
    """A member of a group not trained this step, as of the step's cut (its new tokens only): finished at or
    before `cut` it stays; else its first `cut` tokens, unfinished (finish reason "abort", no hidden states)."""
    if completion.finish_reason in ("stop", "length") and len(completion.token_ids) <= cut:
        return completion
    return replace(
        completion,
        token_ids=list(completion.token_ids[:cut]),
        logprobs=completion.logprobs[:cut].clone(),
        hidden=None,
        finish_reason="abort",
    )


def shard_parts(groups: int, quotas: Sequence[int]) -> list[list[int]]:
    """The group positions of each of `len(quotas)` shards (contiguous, near-equal: `rl_step.shards`)."""
    return shards(list(range(groups)), max(len(quotas), 1))


def shard_quotas(sizes: Sequence[int], target: int) -> list[int]:
    """How many complete groups each shard of `sizes[w]` groups ends its rollout at, `target` in all: shares
    proportional to the sizes (largest remainders first, then shard order), none above its size."""
    total = sum(sizes)
    if not 0 <= target <= total:
        raise ValueError(f"target {target} must be within [0, {total}] (the groups started)")
    if total == 0:
        return [0 for _ in sizes]
    quotas = [target * n // total for n in sizes]
    order = sorted(range(len(sizes)), key=lambda w: (-(target * sizes[w] % total), w))
    for w in order[: target - sum(quotas)]:
        quotas[w] += 1
    return quotas
